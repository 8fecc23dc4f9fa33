//! Where a run's optimizer runs: fused AdamW kernels on the GPU, AdamW on host threads, or
//! sharded across data-parallel ranks — one interface for the training loop.

use std::rc::Rc;

use super::checkpoint::Moments;
use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::dist::ShardedAdamW;
use crate::error::Result;
use crate::nn::{Gpt, Module, Param};
use crate::optim::{AdamW, HostAdamW};

/// Where the optimizer runs in this run.
pub enum Optimizer {
    Gpu(AdamW),
    Host(HostAdamW),
    /// Data parallel: each rank updates its shard on the host (see [`crate::dist`]).
    Sharded(ShardedAdamW),
}

impl Optimizer {
    pub fn moments(&self) -> Moments<'_> {
        match self {
            Optimizer::Gpu(o) => Moments { m: &o.m, v: &o.v, t: o.t },
            Optimizer::Host(o) => Moments { m: &o.m, v: &o.v, t: o.t },
            // Its moments are shards, saved by `dist::shard_files`.
            Optimizer::Sharded(o) => Moments { m: &[], v: &[], t: o.t },
        }
    }

    pub(super) fn set_t(&mut self, t: u64) {
        match self {
            Optimizer::Gpu(o) => o.t = t,
            Optimizer::Host(o) => o.t = t,
            Optimizer::Sharded(o) => o.t = t,
        }
    }

    /// Bytes of AdamW state in the host store (moments; one shard of them when sharded).
    pub fn state_bytes(&self, ctx: &Context) -> u64 {
        match self {
            Optimizer::Sharded(o) => crate::dist::host_bytes(ctx, [&o.m, &o.v]),
            _ => crate::dist::host_bytes(ctx, self.moments().m.iter().chain(self.moments().v)),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Gpu(_) => "gpu",
            Optimizer::Host(_) => "host",
            Optimizer::Sharded(_) => "host, sharded over ranks",
        }
    }

    /// One update; `clipped`: `grad_norm` has just run with this `grad_scale` (the GPU optimizer
    /// then reuses its clip factor, the host one its norm). The GPU and host optimizers defer
    /// each parameter's update to just before the next forward reads it ([`AdamW::defer`],
    /// [`HostAdamW::defer`]) and zero gradients and rewrite f16 weight copies as they go; the
    /// sharded one updates at once, and the gradients are zeroed here.
    pub(super) async fn step(
        &mut self,
        ctx: &Context,
        model: &Gpt,
        lr: f32,
        grad_scale: f32,
        clipped: bool,
    ) -> Result<()> {
        match self {
            Optimizer::Gpu(o) => o.defer(ctx, &model.params(), lr, grad_scale, clipped),
            Optimizer::Host(o) => o.defer(ctx, &model.params(), lr, grad_scale, clipped.then_some(o.last_norm)),
            Optimizer::Sharded(o) => {
                o.step_lr(ctx, &model.params(), lr, grad_scale)?;
                model.refresh_half(ctx)?;
                model.zero_grad(ctx)
            }
        }
    }

    /// What the last micro-batch's backward reports each gradient addition to, readied for it:
    /// GPU AdamW takes the gradients' sums of squares for the norm then (resident runs too: a
    /// paged run then computes exactly what a resident one does); host AdamW with f16
    /// gradients casts each one after its last addition ([`crate::optim::HalfGrads`]).
    pub(super) fn gradient_watcher(&self, ctx: &Context) -> Option<Rc<dyn GradientAdded>> {
        match self {
            Optimizer::Gpu(o) => {
                let norms = o.clip.early_norms();
                norms.begin();
                Some(norms)
            }
            Optimizer::Host(o) => o.half_grads().map(|h| {
                h.begin(ctx);
                h as Rc<dyn GradientAdded>
            }),
            Optimizer::Sharded(_) => None,
        }
    }

    /// After the last micro-batch's backward: f16 gradients not cast during it are cast now.
    pub(super) fn backward_done(&self, ctx: &Context) -> Result<()> {
        match self {
            Optimizer::Host(o) => o.half_grads().map_or(Ok(()), |h| h.finish(ctx)),
            _ => Ok(()),
        }
    }

    /// Whether the next update is delayed (`--delayed-update`): it then starts just before the
    /// next backward instead of at this step's end.
    pub(super) fn delays_next_update(&self) -> bool {
        matches!(self, Optimizer::Host(o) if o.delays_next_update())
    }

    /// Waits for a delayed update still running and swaps its weights in.
    pub(super) fn land_delayed(&mut self) -> Result<()> {
        match self {
            Optimizer::Host(o) => o.land_delayed(),
            _ => Ok(()),
        }
    }

    /// Applies every update still pending — delayed or deferred — so that the weights and
    /// moments are current (before evaluating, sampling or saving).
    pub(super) fn land(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        match self {
            Optimizer::Host(o) => o.land(ctx, params),
            _ => self.apply_deferred(ctx, params),
        }
    }

    /// Applies a deferred update to those of `params` still waiting for it.
    pub(super) fn apply_deferred(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        match self {
            Optimizer::Gpu(o) => o.apply_deferred(ctx, params),
            Optimizer::Host(o) => o.apply_deferred(ctx, params),
            Optimizer::Sharded(_) => Ok(()),
        }
    }

    /// The global norm of the gradients times `grad_scale` (waits for the GPU).
    pub(super) async fn grad_norm(&mut self, ctx: &Context, model: &Gpt, grad_scale: f32) -> Result<f32> {
        match self {
            Optimizer::Gpu(o) => {
                o.apply_deferred(ctx, &model.params())?;
                o.clip.compute(ctx, &model.params(), o.config.max_grad_norm, grad_scale)?;
                o.clip.norm(ctx).await
            }
            Optimizer::Host(o) => o.note_norm(ctx, &model.params(), grad_scale),
            Optimizer::Sharded(o) => o.exchange(ctx, &model.params(), grad_scale),
        }
    }
}
