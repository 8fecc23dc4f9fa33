//! The host AdamW's side of its bets on unclipped steps (`optim::speculative_update`):
//! placing one as the last micro-batch's backward begins, and closing it at the step's end.

use std::rc::Rc;

use super::super::grads_down::GradsDown;
use super::super::speculative_update::{self, Betting, Speculation};
use super::super::{worker_threads, AdamWStep};
use super::{Deferred, HostAdamW};
use crate::autograd::GradientAdded;
use crate::clock::Stopwatch;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::Param;
use crate::tensor::TensorId;

/// How a step's end found its bet.
pub(super) enum BetClosed {
    /// Kept: the step's update is done.
    Kept,
    /// Lost, or none was open: the step updates as usual, with `norm` (as given, or taken for
    /// the bet).
    Lost { norm: Option<f32> },
}

impl HostAdamW {
    /// Readies what the last micro-batch's backward reports each gradient addition to, which
    /// sends each gradient down once backward is done with it (f32, `optim::GradsDown`, or f16,
    /// `optim::HalfGrads`). With f16 gradients, where `next` gives the update this backward's
    /// step will take (learning rate, factor of the gradients before the clip) and the last
    /// step was not clipped, bets that this one is not either: its parameters are updated into
    /// twins as their gradients land (`optim::speculative_update`).
    pub fn gradient_watcher(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        next: Option<(f32, f32)>,
    ) -> Result<Rc<dyn GradientAdded>> {
        let Some(halves) = self.half_grads.clone() else {
            let down = self.grads_down.get_or_insert_with(|| Rc::new(GradsDown::new(params))).clone();
            down.begin(ctx);
            return Ok(down);
        };
        halves.begin(ctx);
        if let Some(s) = &self.speculation {
            s.end()?;
        }
        let last_unclipped = self.last_norm.is_finite() && self.config.clip_factor(self.last_norm) == 1.0;
        let bet = self.speculate && self.delay_after.is_none() && self.t >= 1 && last_unclipped;
        let Some((lr, grad_scale)) = next.filter(|_| bet) else { return Ok(halves) };
        if params.len() != self.m.len() {
            return Err(Error::shape("host AdamW bet", self.m.len(), params.len()));
        }
        let speculation = match &self.speculation {
            Some(s) => s.clone(),
            None => {
                let decays: Vec<f32> =
                    params.iter().enumerate().map(|(i, p)| self.param_update(i, p, None).decay).collect();
                let threads = speculative_update::threads(worker_threads());
                let s = Speculation::new(ctx, params, &self.m, &self.v, &decays, halves.clone(), threads)?;
                self.speculation.insert(Rc::new(s)).clone()
            }
        };
        speculation.begin(AdamWStep { config: self.config, lr, scale: grad_scale, t: self.t + 1 })?;
        Ok(Rc::new(Betting { halves, speculation }))
    }

    /// Steps whose bet on an unclipped step was kept, and lost.
    pub fn bets(&self) -> (u64, u64) {
        self.speculation.as_ref().map_or((0, 0), |s| (s.won.get(), s.lost.get()))
    }

    /// The step's end for an open bet, given the step's update (`lr`, `grad_scale`) and its
    /// norm (taken here where not given): kept where the step is finite and unclipped.
    pub(super) fn close_bet(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        lr: f32,
        grad_scale: f32,
        norm: Option<f32>,
    ) -> Result<BetClosed> {
        let Some(s) = self.speculation.clone().filter(|s| s.is_open()) else { return Ok(BetClosed::Lost { norm }) };
        let n = match norm {
            Some(n) => n,
            None => self.norm(ctx, params, grad_scale)?,
        };
        let step = AdamWStep { config: self.config, lr, scale: self.config.clip_factor(n) * grad_scale, t: self.t + 1 };
        let kept = if n.is_finite() { s.collect(ctx, &step)? } else { s.end().map(|()| None)? };
        match kept {
            Some(updated) => self.keep_bet(ctx, params, &updated, step, n).map(|()| BetClosed::Kept),
            None => Ok(BetClosed::Lost { norm: Some(n) }),
        }
    }

    /// The step's end where its bet was kept: the parameters in `updated` get their new values
    /// as their twins are swapped in (`Speculation::settle`, from `apply_deferred`); the rest,
    /// which have no f16 copy, are updated now, and every gradient is zeroed.
    fn keep_bet(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        updated: &[usize],
        step: AdamWStep,
        norm: f32,
    ) -> Result<()> {
        let halves =
            self.half_grads.clone().ok_or_else(|| Error::invalid("host AdamW", "a bet without f16 gradients"))?;
        self.last_norm = norm;
        self.t = step.t;
        let mut rest: Vec<(usize, &Param)> = params.iter().copied().enumerate().collect();
        rest.retain(|(i, _)| !updated.contains(i));
        if !rest.is_empty() {
            let unscales = halves.unscales(ctx)?;
            let reads: Vec<TensorId> = rest.iter().flat_map(|&(i, p)| [p.value.id(), halves.halves[i].id()]).collect();
            ctx.pager.sync_to_host(&reads)?;
            let d =
                Deferred { lr: step.lr, scale: step.scale, t: step.t, pending: Vec::new(), unscales: Some(unscales) };
            let start = Stopwatch::start();
            self.update(ctx, &rest, &d)?;
            self.host_seconds += start.seconds();
        }
        for (i, p) in params.iter().enumerate() {
            ctx.pager.zero(p.grad.id())?;
            // (the bet forgets its own parameters' f16 gradients as it swaps their twins in)
            if let Some(h) = self.half_grad(i).filter(|_| !updated.contains(&i)) {
                ctx.pager.forget(h)?;
            }
        }
        ctx.pager.end_step();
        Ok(())
    }
}
