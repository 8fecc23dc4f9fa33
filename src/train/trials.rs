//! The trainer's side of its step trials (`super::step_trial`): timing the steps a trial asks
//! for from an idle GPU to an idle GPU, and applying what it switches. Once a step has evicted,
//! the upload trial runs where the GPU offers a choice of upload paths
//! (`Pager::upload_trial_offered`), then the recompute trial, then the bet trial where the host
//! optimizer may bet on unclipped steps. None runs in the browser (waits cannot block there) nor
//! in data-parallel runs (ranks would have to agree).

use super::bet_trial::BetDecision;
use super::recompute_trial::{RecomputeDecision, FIRST_SETTLE};
use super::step_trial::{StepTrial, SETTLE};
use super::trainer::Trainer;
use super::upload_trial::{other_than, UploadDecision};
use crate::clock::Stopwatch;
use crate::context::Context;
use crate::error::Result;

impl Trainer {
    /// Before a step: a step a trial times runs from an idle GPU (and, in
    /// [`Trainer::trial_step_ends`], to one), so work between steps does not count.
    pub(super) fn trial_step_begins(&self, ctx: &Context) -> Result<Option<Stopwatch>> {
        if !self.trials().iter().any(|t| t.times_next_step()) {
            return Ok(None);
        }
        ctx.sync()?;
        Ok(Some(Stopwatch::start()))
    }

    /// At a step's end: the running trial takes the step's time, if it timed it, and may switch
    /// its way from the next step. In a run that pages, the upload trial runs first (where the
    /// GPU offers a choice), then the recompute trial on the path it kept: whether recompute pays
    /// depends on how fast the activations cross the bus, and the recompute trial's usual way
    /// (activations kept) is the one that moves most. In the other order the paths were compared
    /// only recomputed: on an H100, GPT-2 small in f32 at a quarter then stepped in 360.8 ms by
    /// DMA, against 331.7 through the staging ring without recompute (2026-12-06, one call).
    pub(super) fn trial_step_ends(&mut self, ctx: &Context, clock: Option<Stopwatch>) -> Result<()> {
        if clock.is_some() {
            ctx.sync()?;
        }
        let seconds = clock.map(|c| c.seconds());
        if self.upload_trial.running() {
            let switch = self.upload_trial.after_step(seconds);
            if let Some(decided) = self.upload_decision() {
                ctx.pager.keep_upload_path(decided.path(), decided.to_string());
                log::info!("step {}: uploads through {decided}", self.step);
            } else if let Some(other) = switch {
                ctx.pager.try_upload_path(if other { other_than(self.upload_usual) } else { self.upload_usual });
            }
        } else if self.recompute_trial.running() {
            if let Some(on) = self.recompute_trial.after_step(seconds) {
                self.set_recompute(on);
            }
            if let Some(decided) = self.recompute_decision() {
                log::info!("step {}: {decided}", self.step);
            }
        } else if self.bet_trial.running() {
            if let Some(other) = self.bet_trial.after_step(seconds) {
                self.opt.set_bets(other);
            }
            if let Some(decided) = self.bet_decision() {
                log::info!("step {}: {decided}", self.step);
            }
        }
        if !self.trials_running() {
            // (a run's first paged steps are slow: the first trial waits them out)
            if self.wants_upload_trial(ctx) {
                self.upload_usual = ctx.pager.upload_path_kind();
                self.upload_trial.start(FIRST_SETTLE);
            } else if self.wants_recompute_trial(ctx) {
                self.recompute_trial.start(if self.upload_trial.started() { SETTLE } else { FIRST_SETTLE });
            } else if self.wants_bet_trial(ctx) {
                let first = !self.upload_trial.started() && !self.recompute_trial.started();
                // (the usual way does not bet: bets stay only where they are measured faster)
                self.opt.set_bets(false);
                self.bet_trial.start(if first { FIRST_SETTLE } else { SETTLE });
            }
        }
        Ok(())
    }

    /// Whether this run times its uploads both ways now: it pages, and `auto` chose between the
    /// staging ring and DMA where pinned memory is offered (`Pager::upload_trial_offered`).
    fn wants_upload_trial(&self, ctx: &Context) -> bool {
        self.paged
            && !self.upload_trial.started()
            && ctx.pager.upload_trial_offered()
            && self.dist.is_none()
            && ctx.pager.waits_may_block()
    }

    /// Whether this run times its steps with and without bets on unclipped steps now: it pages
    /// and its host optimizer may bet (`Optimizer::may_bet`), one process, waits may block.
    fn wants_bet_trial(&self, ctx: &Context) -> bool {
        self.paged
            && !self.bet_trial.started()
            && self.opt.may_bet()
            && !crate::optim::bets_forced()
            && self.dist.is_none()
            && ctx.pager.waits_may_block()
    }

    /// Every step trial a run may hold.
    fn trials(&self) -> [&StepTrial; 3] {
        [&self.upload_trial, &self.recompute_trial, &self.bet_trial]
    }

    /// Whether a trial is still measuring (the bench warms up until none is).
    pub fn trials_running(&self) -> bool {
        self.trials().iter().any(|t| t.running())
    }

    /// What the bet trial measured and kept, once it has decided.
    pub fn bet_decision(&self) -> Option<BetDecision> {
        self.bet_trial.outcome().map(BetDecision::from)
    }

    /// What the upload trial measured and kept, once it has decided.
    pub fn upload_decision(&self) -> Option<UploadDecision> {
        self.upload_trial.outcome().map(|o| UploadDecision::new(self.upload_usual, o))
    }

    /// What the recompute trial measured and kept, once it has decided.
    pub fn recompute_decision(&self) -> Option<RecomputeDecision> {
        self.recompute_trial.outcome().map(RecomputeDecision::from)
    }
}
