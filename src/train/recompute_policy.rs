//! What backward keeps from forward and what it makes again, as the trainer decides it step by
//! step: remaking LayerNorm and MLP outputs once a run pages, and whole-block recompute where the
//! recompute trial (`super::recompute_trial`) measures it faster. A step after any such change
//! is planned afresh ([`crate::pager::Pager::begin_step_unlike_last`]).

use super::recompute_trial::RecomputeDecision;
use super::trainer::Trainer;
use crate::clock::Stopwatch;
use crate::context::Context;
use crate::error::Result;

impl Trainer {
    /// After a step that evicted tensors to stay in the GPU budget, the later steps make
    /// LayerNorm outputs and the MLP's hidden values again in backward instead of paging them
    /// (`Block::forward`), unless `TrainConfig::remake` says otherwise. Not where transfers
    /// cannot be waited for within a step (the browser): there the web demo's second step
    /// failed waiting for a write-back in Chromium, which native runs of the same mode cannot
    /// show (their polls complete maps at once).
    fn remake_if_paging(&mut self, ctx: &Context, evictions: u64) {
        let asked = self.cfg.remake.is_some();
        if evictions == 0 || self.model.remakes() || self.cfg.recompute || asked || !ctx.pager.waits_may_block() {
            return;
        }
        self.model.set_remake(true);
        self.step_changed = true;
        log::info!(
            "step {}: {evictions} evictions to stay in the {} MiB GPU budget; from now on LayerNorm outputs and the MLP's hidden values are made again in backward instead of paged",
            self.step,
            ctx.pager.budget() >> 20
        );
    }

    /// Before a step: a step the recompute trial times runs from an idle GPU (and, in
    /// [`Trainer::trial_step_ends`], to one), so work between steps does not count.
    pub(super) fn trial_step_begins(&self, ctx: &Context) -> Result<Option<Stopwatch>> {
        if !self.recompute_trial.times_next_step() {
            return Ok(None);
        }
        ctx.sync()?;
        Ok(Some(Stopwatch::start()))
    }

    /// After a step's forward and backward that evicted `evicted` tensors: remaking from the
    /// next step, and the recompute trial begins.
    pub(super) fn after_evictions(&mut self, ctx: &Context, evicted: u64) {
        self.remake_if_paging(ctx, evicted);
        if evicted > 0 && self.wants_recompute_trial(ctx) {
            self.recompute_trial.start();
        }
    }

    /// At a step's end: the trial takes its time, if it timed it, and may switch recompute.
    pub(super) fn trial_step_ends(&mut self, ctx: &Context, clock: Option<Stopwatch>) -> Result<()> {
        if clock.is_some() {
            ctx.sync()?;
        }
        let was_running = self.recompute_trial.running();
        if let Some(on) = self.recompute_trial.after_step(clock.map(|c| c.seconds())) {
            self.set_recompute(on);
        }
        if let (true, Some(decided)) = (was_running, self.recompute_trial.decision()) {
            log::info!("step {}: {decided}", self.step);
        }
        Ok(())
    }

    /// Whether this run measures recompute against paging: not asked either way, one process
    /// (ranks would have to agree), and waits may block (see [`Trainer::remake_if_paging`]).
    fn wants_recompute_trial(&self, ctx: &Context) -> bool {
        !self.cfg.recompute && self.cfg.auto_recompute && self.dist.is_none() && ctx.pager.waits_may_block()
    }

    /// Turns block recompute on or off from the next step (`TrainConfig::recompute` sets it
    /// at the start); the next step is then planned afresh, not from the last one's accesses.
    pub fn set_recompute(&mut self, on: bool) {
        if self.model.recomputes() != on {
            self.model.set_recompute(on);
            self.step_changed = true;
        }
    }

    /// Whether the recompute trial is still measuring (the bench warms up until it is not).
    pub fn recompute_trial_running(&self) -> bool {
        self.recompute_trial.running()
    }

    /// What the recompute trial measured and kept, once it has decided.
    pub fn recompute_decision(&self) -> Option<RecomputeDecision> {
        self.recompute_trial.decision()
    }
}
