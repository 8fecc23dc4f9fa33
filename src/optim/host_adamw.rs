//! AdamW on the host (ZeRO-Offload's idea): the moments never leave host memory, gradients come
//! down and updated parameters go up — about 8 bytes per parameter on the bus each step instead
//! of the ~28 a GPU optimizer moves when nothing stays resident. The update runs on worker
//! threads in chunks the compiler vectorizes.

use super::AdamWConfig;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::{Module, Param};
use crate::tensor::Tensor;

pub struct HostAdamW {
    pub config: AdamWConfig,
    /// First and second moments, pager tensors that are only ever touched on the host.
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub t: u64,
    /// Global gradient norm of the last step.
    pub last_norm: f32,
}

/// Everything one update of one tensor needs besides the tensors.
struct Hyper<'a> {
    c: &'a AdamWConfig,
    lr: f32,
    /// Weight decay for this tensor (0 for biases and gains).
    decay: f32,
    /// Multiplies the gradient (the clip factor).
    scale: f32,
    t: u64,
}

/// One AdamW update of `p`, `m`, `v` from `g` (all the same length), like `adamw_update` in
/// shaders/optim.wgsl.
fn update(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], h: &Hyper) {
    let c = h.c;
    let bc1 = 1.0 - c.beta1.powi(h.t as i32);
    let bc2 = 1.0 - c.beta2.powi(h.t as i32);
    for i in 0..p.len() {
        let gi = g[i] * h.scale;
        let mi = c.beta1 * m[i] + (1.0 - c.beta1) * gi;
        let vi = c.beta2 * v[i] + (1.0 - c.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        let upd = (mi / bc1) / ((vi / bc2).sqrt() + c.eps);
        p[i] -= h.lr * (upd + h.decay * p[i]);
    }
}

/// `update` split over worker threads.
fn update_parallel(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], h: &Hyper) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
        if threads > 1 && p.len() >= 1 << 16 {
            let chunk = p.len().div_ceil(threads);
            std::thread::scope(|s| {
                for (((p, m), v), g) in
                    p.chunks_mut(chunk).zip(m.chunks_mut(chunk)).zip(v.chunks_mut(chunk)).zip(g.chunks(chunk))
                {
                    s.spawn(move || update(p, m, v, g, h));
                }
            });
            return;
        }
    }
    update(p, m, v, g, h)
}

/// One AdamW update of a slice of a parameter (the sharded optimizer's unit, `crate::dist`):
/// `p`, `m`, `v`, `g` the same length; `decay` this tensor's weight decay, `scale` multiplies
/// the gradient, `t` the step (from 1). The same arithmetic as [`HostAdamW`], on worker threads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn update_slice(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    c: &AdamWConfig,
    lr: f32,
    decay: f32,
    scale: f32,
    t: u64,
) {
    update_parallel(p, m, v, g, &Hyper { c, lr, decay, scale, t })
}

/// The f32 values of host bytes (copied when the bytes are not 4-aligned).
fn f32s(bytes: &[u8]) -> std::borrow::Cow<'_, [f32]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(v) => std::borrow::Cow::Borrowed(v),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

/// Runs `f` on four byte slices seen as f32 (in place when aligned, through copies otherwise).
fn with_f32s(
    p: &mut [u8],
    m: &mut [u8],
    v: &mut [u8],
    g: &[u8],
    f: impl FnOnce(&mut [f32], &mut [f32], &mut [f32], &[f32]),
) {
    let g = f32s(g);
    match (bytemuck::try_cast_slice_mut(p), bytemuck::try_cast_slice_mut(m), bytemuck::try_cast_slice_mut(v)) {
        (Ok(p), Ok(m), Ok(v)) => f(p, m, v, &g),
        _ => {
            let (mut pc, mut mc, mut vc): (Vec<f32>, Vec<f32>, Vec<f32>) =
                (bytemuck::pod_collect_to_vec(p), bytemuck::pod_collect_to_vec(m), bytemuck::pod_collect_to_vec(v));
            f(&mut pc, &mut mc, &mut vc, &g);
            p.copy_from_slice(bytemuck::cast_slice(&pc));
            m.copy_from_slice(bytemuck::cast_slice(&mc));
            v.copy_from_slice(bytemuck::cast_slice(&vc));
        }
    }
}

impl HostAdamW {
    /// Parameters per second this host updates (timed on `n` of them, all threads).
    pub fn measure_rate(n: usize) -> f64 {
        let (mut p, mut m, mut v, g) = (vec![0.1f32; n], vec![0f32; n], vec![0f32; n], vec![0.01f32; n]);
        let c = AdamWConfig::default();
        let h = Hyper { c: &c, lr: 1e-3, decay: 0.1, scale: 1.0, t: 1 };
        let start = crate::clock::Stopwatch::start();
        update_parallel(&mut p, &mut m, &mut v, &g, &h);
        n as f64 / start.seconds().max(1e-9)
    }

    pub fn new(ctx: &Context, model: &impl Module, config: AdamWConfig) -> Result<Self> {
        if config.lr.is_nan() || config.lr <= 0.0 {
            return Err(Error::invalid("AdamW config", format!("need lr > 0: {config:?}")));
        }
        let params = model.params();
        let (m, v) = super::zero_moments(ctx, &params)?;
        Ok(HostAdamW { config, m, v, t: 0, last_norm: 0.0 })
    }

    /// The global norm of the gradients times `grad_scale` (one GPU round trip, then host sums).
    pub fn grad_norm(ctx: &Context, params: &[&Param], grad_scale: f32) -> Result<f32> {
        let ids: Vec<_> = params.iter().map(|p| p.grad.id()).collect();
        ctx.pager.sync_to_host(&ids)?;
        let mut sumsq = 0.0f64;
        for p in params {
            sumsq += ctx.pager.update_host(&[p.grad.id()], &[], |s| {
                f32s(s[0]).iter().map(|&g| (g * grad_scale) as f64 * (g * grad_scale) as f64).sum::<f64>()
            })?;
        }
        Ok(sumsq.sqrt() as f32)
    }

    /// One update at learning rate `lr`; gradients are multiplied by `grad_scale` and clipped to
    /// the configured global norm first.
    pub async fn step_lr(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(Error::shape("host AdamW step", self.m.len(), params.len()));
        }
        // One GPU round trip for all gradients (and parameters), then in-place host updates.
        let ids: Vec<_> = params.iter().map(|p| p.grad.id()).chain(params.iter().map(|p| p.value.id())).collect();
        ctx.pager.sync_to_host(&ids)?;
        let norm = Self::grad_norm(ctx, params, grad_scale)?;
        self.last_norm = norm;
        let clip =
            if self.config.max_grad_norm > 0.0 { (self.config.max_grad_norm / (norm + 1e-6)).min(1.0) } else { 1.0 };
        self.t += 1;
        let c = self.config;
        for (i, p) in params.iter().enumerate() {
            let decay = if p.value.shape().len() >= 2 { c.weight_decay } else { 0.0 };
            let h = Hyper { c: &c, lr, decay, scale: clip * grad_scale, t: self.t };
            let (pv, m, v, g) = (p.value.id(), self.m[i].id(), self.v[i].id(), p.grad.id());
            ctx.pager.update_host(&[pv, m, v, g], &[pv, m, v], |s| {
                let [ps, ms, vs, gs] = s else { unreachable!("four slices") };
                with_f32s(ps, ms, vs, gs, |p, m, v, g| update_parallel(p, m, v, g, &h));
            })?;
        }
        ctx.pager.end_step();
        Ok(())
    }
}
