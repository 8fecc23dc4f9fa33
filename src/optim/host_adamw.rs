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
        if !(config.lr > 0.0) {
            return Err(Error::invalid("AdamW config", format!("need lr > 0: {config:?}")));
        }
        let params = model.params();
        let mut m = Vec::with_capacity(params.len());
        let mut v = Vec::with_capacity(params.len());
        for p in &params {
            m.push(ctx.zeros(&format!("{}.exp_avg", p.name), p.value.shape(), false)?);
            v.push(ctx.zeros(&format!("{}.exp_avg_sq", p.name), p.value.shape(), false)?);
        }
        Ok(HostAdamW { config, m, v, t: 0, last_norm: 0.0 })
    }

    /// One update at learning rate `lr`; gradients are multiplied by `grad_scale` and clipped to
    /// the configured global norm first.
    pub async fn step_lr(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(Error::shape("host AdamW step", self.m.len(), params.len()));
        }
        // One GPU round trip for all gradients, then plain host reads.
        let ids: Vec<_> = params.iter().map(|p| p.grad.id()).chain(params.iter().map(|p| p.value.id())).collect();
        ctx.pager.sync_to_host(&ids)?;
        let mut grads = Vec::with_capacity(params.len());
        for p in params {
            grads.push(ctx.to_f32(&p.grad).await?);
        }
        let sumsq: f64 = grads.iter().flatten().map(|&g| (g * grad_scale) as f64 * (g * grad_scale) as f64).sum();
        let norm = sumsq.sqrt() as f32;
        self.last_norm = norm;
        let clip =
            if self.config.max_grad_norm > 0.0 { (self.config.max_grad_norm / (norm + 1e-6)).min(1.0) } else { 1.0 };
        self.t += 1;
        let c = self.config;
        for (i, p) in params.iter().enumerate() {
            let decay = if p.value.shape().len() >= 2 { c.weight_decay } else { 0.0 };
            let mut value = ctx.to_f32(&p.value).await?;
            let mut m = ctx.to_f32(&self.m[i]).await?;
            let mut v = ctx.to_f32(&self.v[i]).await?;
            let h = Hyper { c: &c, lr, decay, scale: clip * grad_scale, t: self.t };
            update_parallel(&mut value, &mut m, &mut v, &grads[i], &h);
            ctx.write_f32(&p.value, &value)?;
            ctx.write_f32(&self.m[i], &m)?;
            ctx.write_f32(&self.v[i], &v)?;
        }
        Ok(())
    }
}
