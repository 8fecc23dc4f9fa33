//! Where a run's optimizer runs: fused AdamW kernels on the GPU, AdamW on host threads, split
//! between them by parameter, or sharded across data-parallel ranks — one interface for the
//! training loop.

use std::rc::Rc;

use super::checkpoint::Moments;
use super::config::{format_bytes, OptimizerOn, TrainConfig};
use super::run_setup::split_share;
use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::dist::Dist;
use crate::dist::ShardedAdamW;
use crate::error::Result;
use crate::nn::{Gpt, Module, Param};
use crate::optim::{gpu_share, kept_bytes, AdamW, AdamWConfig, HostAdamW, SplitAdamW};

/// Where the optimizer runs in this run (one a run: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Optimizer {
    Gpu(AdamW),
    Host(HostAdamW),
    /// The first parameters on the GPU, their state kept there; the rest on the host.
    Split(SplitAdamW),
    /// Data parallel: each rank updates its shard on the host (see [`crate::dist`]).
    Sharded(ShardedAdamW),
}

impl Optimizer {
    /// The optimizer `on` names for `model` (sharded wherever the run is data-parallel), saying
    /// in `reason` what it chose besides. `f16_grads`: host AdamW's gradients come down in f16.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn for_run(
        ctx: &Context,
        model: &Gpt,
        on: OptimizerOn,
        dist: Option<&Rc<Dist>>,
        config: AdamWConfig,
        cfg: &TrainConfig,
        f16_grads: bool,
        reason: &mut String,
    ) -> Result<Self> {
        let params = model.params();
        let host = |reason: &mut String| -> Result<Self> {
            let mut host = HostAdamW::new(ctx, model, config)?;
            if f16_grads {
                host.send_gradients_in_f16(ctx, &params)?;
                *reason += "; gradients come down in f16";
            }
            if host.update_ahead {
                *reason += "; updates run ahead on their own thread";
            }
            if let Some(after) = cfg.delayed_update {
                host.delay_after = Some(after);
                *reason += &format!("; from step {} each update runs during the next step (delayed)", after + 1);
            }
            Ok(Optimizer::Host(host))
        };
        Ok(match (on, dist) {
            (_, Some(d)) => {
                let gpu = if on == OptimizerOn::Gpu { "; --optimizer-on gpu is not sharded yet" } else { "" };
                *reason = format!("{} ranks: each updates 1/{} of the parameters{gpu}", d.size(), d.size());
                Optimizer::Sharded(ShardedAdamW::new(ctx, model, config, d.clone())?)
            }
            (OptimizerOn::Host, None) => host(reason)?,
            (OptimizerOn::Split, None) => {
                let (share, share_name) = split_share(ctx.pager.budget(), cfg.precision);
                let on_gpu = gpu_share(&params, share);
                if on_gpu == 0 || on_gpu == params.len() || cfg.delayed_update.is_some() {
                    *reason += &match cfg.delayed_update {
                        Some(_) => "; not split: --delayed-update delays a host optimizer".to_string(),
                        None => format!(
                            "; not split: the state of {on_gpu} of the {} parameters fits {share_name} of the budget",
                            params.len(),
                        ),
                    };
                    return host(reason);
                }
                let kept: u64 = params[..on_gpu].iter().map(|p| kept_bytes(p)).sum();
                *reason += &format!(
                    "; the first {on_gpu} of {} parameters (from {}) update on the GPU, their state ({}) kept there",
                    params.len(),
                    params[0].name,
                    format_bytes(kept)
                );
                if f16_grads {
                    *reason += "; the others' gradients come down in f16";
                }
                Optimizer::Split(SplitAdamW::new(ctx, &params, on_gpu, config, f16_grads)?)
            }
            _ => Optimizer::Gpu(AdamW::new(ctx, model, config)?),
        })
    }

    pub fn moments(&self) -> Moments<'_> {
        match self {
            Optimizer::Gpu(o) => Moments { m: &o.m, v: &o.v, t: o.t },
            Optimizer::Host(o) => Moments { m: &o.m, v: &o.v, t: o.t },
            Optimizer::Split(o) => {
                let (m, v) = o.moments();
                Moments { m, v, t: o.t() }
            }
            // Its moments are shards, saved by `dist::shard_files`.
            Optimizer::Sharded(o) => Moments { m: &[], v: &[], t: o.t },
        }
    }

    pub(super) fn set_t(&mut self, t: u64) {
        match self {
            Optimizer::Gpu(o) => o.t = t,
            Optimizer::Host(o) => o.t = t,
            Optimizer::Split(o) => o.set_t(t),
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

    /// The AdamW running on the host: all of it, or the split optimizer's host share; None on
    /// the GPU or sharded.
    fn on_host(&self) -> Option<&HostAdamW> {
        match self {
            Optimizer::Host(o) => Some(o),
            Optimizer::Split(o) => Some(&o.host),
            Optimizer::Gpu(_) | Optimizer::Sharded(_) => None,
        }
    }

    fn on_host_mut(&mut self) -> Option<&mut HostAdamW> {
        match self {
            Optimizer::Host(o) => Some(o),
            Optimizer::Split(o) => Some(&mut o.host),
            Optimizer::Gpu(_) | Optimizer::Sharded(_) => None,
        }
    }

    /// Host seconds the main thread has spent in host AdamW's passes (`HostAdamW::host_seconds`)
    /// so far; None where no host AdamW runs (on the GPU, or sharded).
    pub fn host_seconds(&self) -> Option<f64> {
        self.on_host().map(|o| o.host_seconds)
    }

    /// Bets on unclipped steps kept and lost so far (`HostAdamW::bets`); None where no host
    /// AdamW runs.
    pub fn bets(&self) -> Option<(u64, u64)> {
        self.on_host().map(|o| o.bets())
    }

    /// Turns the host optimizer's bets on unclipped steps on or off (`HostAdamW::speculate`).
    pub(super) fn set_bets(&mut self, on: bool) {
        if let Some(o) = self.on_host_mut() {
            o.speculate = on;
        }
    }

    /// Whether the host optimizer may bet on unclipped steps now: it bets, and its gradients
    /// come down in f16.
    pub(super) fn may_bet(&self) -> bool {
        self.on_host().is_some_and(|o| o.speculate && o.half_grads().is_some())
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Gpu(_) => "gpu",
            Optimizer::Host(_) => "host",
            Optimizer::Split(_) => "gpu and host, split",
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
            Optimizer::Split(o) => o.defer(ctx, &model.params(), lr, grad_scale, clipped).await,
            Optimizer::Sharded(o) => {
                o.step_lr(ctx, &model.params(), lr, grad_scale)?;
                model.refresh_half(ctx)?;
                model.zero_grad(ctx)
            }
        }
    }

    /// What the last micro-batch's backward reports each gradient addition to, readied for it:
    /// GPU AdamW takes the gradients' sums of squares for the norm then (resident runs too: a
    /// paged run then computes exactly what a resident one does); host AdamW sends each
    /// gradient down after its last addition (cast to f16 first where they come down so,
    /// [`crate::optim::HalfGrads`]) and, given `next` (the step's learning rate and gradient
    /// factor), may bet that the step is not clipped ([`HostAdamW::gradient_watcher`]).
    pub(super) fn gradient_watcher(
        &mut self,
        ctx: &Context,
        model: &Gpt,
        next: Option<(f32, f32)>,
    ) -> Result<Option<Rc<dyn GradientAdded>>> {
        Ok(match self {
            Optimizer::Gpu(o) => {
                let norms = o.clip.early_norms();
                norms.begin();
                Some(norms)
            }
            Optimizer::Host(o) => Some(o.gradient_watcher(ctx, &model.params(), next)?),
            Optimizer::Split(o) => Some(o.gradient_watcher(ctx, &model.params(), next)?),
            Optimizer::Sharded(_) => None,
        })
    }

    /// After the last micro-batch's backward (see [`HostAdamW::backward_done`]).
    pub(super) fn backward_done(&self, ctx: &Context) -> Result<()> {
        self.on_host().map_or(Ok(()), |o| o.backward_done(ctx))
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
            Optimizer::Split(o) => o.land(ctx, params),
            _ => self.apply_deferred(ctx, params),
        }
    }

    /// Applies a deferred update to those of `params` still waiting for it.
    pub(super) fn apply_deferred(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        match self {
            Optimizer::Gpu(o) => o.apply_deferred(ctx, params),
            Optimizer::Host(o) => o.apply_deferred(ctx, params),
            Optimizer::Split(o) => o.apply_deferred(ctx, params),
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
            Optimizer::Host(o) => o.note_norm(ctx, &model.params(), grad_scale, &[]),
            Optimizer::Split(o) => o.grad_norm(ctx, &model.params(), grad_scale).await,
            Optimizer::Sharded(o) => o.exchange(ctx, &model.params(), grad_scale),
        }
    }
}
