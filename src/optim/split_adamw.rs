//! AdamW split between the GPU and the host by parameter: the first parameters in the forward's
//! order (GPT-2's embedding first) update on the GPU with their state kept there all step, the
//! rest on the host (ZeRO-Offload's way).
//!
//! Why: a host optimizer can start only once backward is done, and the next forward reads the
//! embedding first — whose gradient backward makes last. With all of AdamW on the host, the
//! GPU idles at each step boundary while the embedding's gradient comes down, the host updates
//! it (GPT-2 small: 38.6 M of its 124 M parameters) and its values go back up, and the forward
//! after it is paced by the host's pass over every other layer. Keeping the first parameters'
//! state on the GPU turns their update into one kernel each, with no bus traffic, and leaves
//! the host a shorter pass that the forward's later layers hide.
//!
//! The global norm covers both shares: each share's sums of squares, added on the host after
//! backward (the step reads the norm there anyway, for the f16 overflow check), give one clip
//! factor; the GPU share's kernels read it from its clip tensor.

use std::rc::Rc;

use super::{AdamW, AdamWConfig, EarlyNorms, HostAdamW};
use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::Param;
use crate::tensor::Tensor;

/// Bytes per value a parameter's update keeps on the GPU besides its f16 copy: value, gradient
/// and both moments, f32.
const F32_STATE_BYTES: u64 = 16;

/// Bytes a parameter's update keeps on the GPU all step: value, gradient, both moments (f32),
/// and its f16 copy where it has one.
pub fn kept_bytes(p: &Param) -> u64 {
    F32_STATE_BYTES * p.value.len() as u64 + p.half.as_ref().map_or(0, |h| h.bytes())
}

/// [`kept_bytes`] of a parameter of `values` values before it exists (`optimizer-on auto`
/// choosing), with an f16 copy where `with_half` (taken unpadded).
pub fn kept_bytes_of(values: u64, with_half: bool) -> u64 {
    let half = if with_half { std::mem::size_of::<half::f16>() as u64 } else { 0 };
    (F32_STATE_BYTES + half) * values
}

/// How many of `params`, from the first, keep their update on the GPU within `bytes`.
pub fn gpu_share(params: &[&Param], bytes: u64) -> usize {
    let mut used = 0;
    params
        .iter()
        .take_while(|p| {
            used += kept_bytes(p);
            used <= bytes
        })
        .count()
}

pub struct SplitAdamW {
    /// AdamW over the first parameters, its state kept on the GPU.
    pub gpu: AdamW,
    /// AdamW over the rest, on the host.
    pub host: HostAdamW,
    /// Both shares' moments in parameter order (handles), for checkpoints.
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// The global norm of the last [`SplitAdamW::grad_norm`].
    pub last_norm: f32,
}

impl SplitAdamW {
    /// The first `on_gpu` of `params` update on the GPU (their values, gradients, moments and
    /// f16 copies kept there: `Pager::keep_on_gpu`), the rest on the host; `half_grads`: the
    /// host share's gradients come down in f16.
    pub fn new(ctx: &Context, params: &[&Param], on_gpu: usize, config: AdamWConfig, half_grads: bool) -> Result<Self> {
        if on_gpu == 0 || on_gpu >= params.len() {
            return Err(Error::invalid(
                "split AdamW",
                format!("the GPU share must hold some of the {} parameters but not all: asked {on_gpu}", params.len()),
            ));
        }
        let (first, rest) = params.split_at(on_gpu);
        let gpu = AdamW::for_params(ctx, first, config)?;
        let mut host = HostAdamW::for_params(ctx, rest, config)?;
        if half_grads {
            host.send_gradients_in_f16(ctx, rest)?;
        }
        let mut kept = Vec::new();
        for (i, p) in first.iter().enumerate() {
            kept.extend([p.value.id(), p.grad.id(), gpu.m[i].id(), gpu.v[i].id()]);
            kept.extend(p.half.as_ref().map(|h| h.id()));
        }
        ctx.pager.keep_on_gpu(&kept);
        Ok(SplitAdamW {
            m: gpu.m.iter().chain(&host.m).cloned().collect(),
            v: gpu.v.iter().chain(&host.v).cloned().collect(),
            gpu,
            host,
            last_norm: 0.0,
        })
    }

    /// Parameters (from the first) the GPU share updates.
    pub fn on_gpu(&self) -> usize {
        self.gpu.m.len()
    }

    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }

    pub fn t(&self) -> u64 {
        self.host.t
    }

    pub fn set_t(&mut self, t: u64) {
        self.gpu.t = t;
        self.host.t = t;
    }

    /// `params` divided into the GPU share's and the host share's, in order.
    fn shares<'a>(&self, params: &[&'a Param]) -> (Vec<&'a Param>, Vec<&'a Param>) {
        params.iter().partition(|p| self.gpu.updates(p))
    }

    /// The global norm of all `params`' gradients times `grad_scale` (waits for the GPU), and
    /// the clip factor from it in the GPU share's clip tensor.
    pub async fn grad_norm(&mut self, ctx: &Context, params: &[&Param], grad_scale: f32) -> Result<f32> {
        let (first, rest) = self.shares(params);
        if first.len() != self.on_gpu() || rest.len() != self.host.m.len() {
            return Err(Error::shape("split AdamW step", self.m.len(), params.len()));
        }
        self.gpu.apply_deferred(ctx, &first)?;
        let c = self.gpu.config;
        self.gpu.clip.compute(ctx, &first, c.max_grad_norm, grad_scale)?;
        // Both shares' inputs to the norm come down in one round trip, not one after the other
        // (the GPU is idle meanwhile: the next step waits for the norm).
        let reading = crate::clock::Stopwatch::start();
        let host_norm = self.host.note_norm(ctx, &rest, grad_scale, &[self.gpu.clip.clip.id()])? as f64;
        log::debug!("split AdamW: the norm's inputs read back in {:.2} ms", reading.seconds() * 1e3);
        let gpu_norm = self.gpu.clip.norm(ctx).await? as f64;
        let norm = (gpu_norm * gpu_norm + host_norm * host_norm).sqrt() as f32;
        // As the clip kernel computes it (shaders/optim.wgsl `clip_scale`) and the host one.
        let clip = c.clip_factor(norm);
        ctx.write_f32(&self.gpu.clip.clip, &[clip, norm])?;
        log::debug!("split AdamW: global norm {norm:.4}, clip factor {clip:.4}");
        self.last_norm = norm;
        Ok(norm)
    }

    /// Begins a step (see [`AdamW::defer`], [`HostAdamW::defer`]): each share's parameters get
    /// their update just before their next use. `clipped`: `grad_norm` has just run with this
    /// `grad_scale`.
    pub async fn defer(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        lr: f32,
        grad_scale: f32,
        clipped: bool,
    ) -> Result<()> {
        if !clipped {
            self.grad_norm(ctx, params, grad_scale).await?;
        }
        let (first, rest) = self.shares(params);
        self.gpu.defer_within_step(ctx, &first, lr, grad_scale, true)?;
        // (`RUST_LOG=pagetrain::optim=debug`: on an H100, GPT-2 small in f16 at a quarter,
        // 0.3–0.4 ms, against ~1.1 ms of the GPU share's update kernels: recording those before
        // it, so that the GPU runs them meanwhile, measured no faster, BENCHMARKS stop 52)
        let host_end = crate::clock::Stopwatch::start();
        // (the host share ends the pager's step, after its gradients are on their way down)
        self.host.defer(ctx, &rest, lr, grad_scale, Some(self.last_norm))?;
        log::debug!("split AdamW: the host share's step end took {:.2} ms", host_end.seconds() * 1e3);
        Ok(())
    }

    /// Applies the deferred updates of those of `params` still waiting for them.
    pub fn apply_deferred(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        let (first, rest) = self.shares(params);
        if !first.is_empty() {
            self.gpu.apply_deferred(ctx, &first)?;
        }
        if !rest.is_empty() {
            self.host.apply_deferred(ctx, &rest)?;
        }
        Ok(())
    }

    /// Applies every update still pending (before reading weights or moments).
    pub fn land(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        let (first, rest) = self.shares(params);
        self.gpu.apply_deferred(ctx, &first)?;
        self.host.land(ctx, &rest)
    }

    /// What the last micro-batch's backward reports each gradient addition to, readied: the GPU
    /// share's sums of squares, and the host share's watcher, which sends its gradients down
    /// ([`HostAdamW::gradient_watcher`], which may bet on `next`).
    pub fn gradient_watcher(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        next: Option<(f32, f32)>,
    ) -> Result<Rc<dyn GradientAdded>> {
        let norms = self.gpu.clip.early_norms();
        norms.begin();
        let (_, rest) = self.shares(params);
        let host = self.host.gradient_watcher(ctx, &rest, next)?;
        Ok(Rc::new(BothShares { norms, host }))
    }
}

/// Each share's watcher of gradient additions (each ignores the other share's gradients).
struct BothShares {
    norms: Rc<EarlyNorms>,
    host: Rc<dyn GradientAdded>,
}

impl GradientAdded for BothShares {
    fn added(&self, ctx: &Context, grad: &Tensor) -> Result<()> {
        self.norms.added(ctx, grad)?;
        self.host.added(ctx, grad)
    }
}
