//! The optimizer's step at a step's end — or, delayed (`--delayed-update`), just before the next
//! backward — with dynamic loss scaling under f16: a step whose gradients overflowed is skipped
//! and the scale halved; good steps double it again.

use super::config::Precision;
use super::trainer::Trainer;
use crate::context::Context;
use crate::error::Result;
use crate::nn::Module;

/// Loss scale a mixed-precision run starts with, and good steps before it doubles.
pub const INITIAL_LOSS_SCALE: f32 = 65536.0;
pub const GROWTH_INTERVAL: u64 = 1000;

/// A step whose gradients are made and whose update has not started.
pub(super) struct PendingUpdate {
    pub step: u64,
    pub lr: f32,
    pub grad_scale: f32,
}

impl Trainer {
    /// The optimizer's step for `u`'s gradients: under f16 a step whose gradients overflowed
    /// is skipped and the loss scale halved.
    pub(super) async fn update(&mut self, ctx: &Context, u: PendingUpdate) -> Result<()> {
        if self.precision == Precision::F16 && !self.opt.grad_norm(ctx, &self.model, u.grad_scale).await?.is_finite() {
            // Overflow: skip the update, halve the scale (the step's data is not seen again).
            self.loss_scale = (self.loss_scale / 2.0).max(1.0);
            self.good_steps = 0;
            self.skipped_steps += 1;
            log::warn!("step {}: gradients overflowed; update skipped, loss scale now {}", u.step, self.loss_scale);
            return self.model.zero_grad(ctx);
        }
        let clipped = self.precision == Precision::F16;
        self.opt.step(ctx, &self.model, u.lr, u.grad_scale, clipped).await?;
        if self.precision == Precision::F16 {
            self.good_steps += 1;
            if self.good_steps >= GROWTH_INTERVAL {
                self.loss_scale *= 2.0;
                self.good_steps = 0;
            }
        }
        Ok(())
    }

    /// Starts the last step's delayed update, if it waits (see `pending_update`).
    pub(super) async fn start_pending_update(&mut self, ctx: &Context) -> Result<()> {
        match self.pending_update.take() {
            Some(u) => self.update(ctx, u).await,
            None => Ok(()),
        }
    }

    /// Applies the last step's deferred or delayed parameter updates now (the next forward or
    /// step would otherwise): call before reading the weights. Evaluation, sampling and saving
    /// do.
    pub async fn apply_pending(&mut self, ctx: &Context) -> Result<()> {
        self.start_pending_update(ctx).await?;
        let (model, opt) = (&self.model, &mut self.opt);
        opt.land(ctx, &model.params())
    }
}
