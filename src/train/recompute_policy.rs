//! What backward keeps from forward and what it makes again, as the trainer decides it step by
//! step: remaking LayerNorm and MLP outputs once a run pages, and whole-block recompute where the
//! recompute trial (`super::recompute_trial`) measures it faster. A step after any such change
//! is planned afresh ([`crate::pager::Pager::begin_step_unlike_last`]).

use super::trainer::Trainer;
use crate::context::Context;

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

    /// After a step's forward and backward that evicted `evicted` tensors: remaking from the
    /// next step; the run pages, so its trials begin (`super::trials`).
    pub(super) fn after_evictions(&mut self, ctx: &Context, evicted: u64) {
        self.remake_if_paging(ctx, evicted);
        self.paged |= evicted > 0;
        if self.paged && self.model.keeps_attention() && attention_asked().is_none() {
            // A kept attention output is paged out and in like any activation: at a quarter of
            // GPT-2 small's footprint, 0.3 GB more a step across the bus cost more than running
            // attention again saves (H100: 96 against 81 ms a step; resident, 61 against 65).
            // (Only where waits may block: see `keep_attention_at_start`.)
            self.model.set_keep_attention(false);
            self.step_changed = true;
        }
    }

    /// Whether this run measures recompute against paging now: it pages and has not measured
    /// yet, recompute is not asked either way, one process (ranks would have to agree), and
    /// waits may block (see [`Trainer::remake_if_paging`]).
    pub(super) fn wants_recompute_trial(&self, ctx: &Context) -> bool {
        self.paged
            && !self.recompute_trial.started()
            && !self.cfg.recompute
            && self.cfg.auto_recompute
            && self.dist.is_none()
            && ctx.pager.waits_may_block()
    }

    /// Turns block recompute on or off from the next step (`TrainConfig::recompute` sets it
    /// at the start); the next step is then planned afresh, not from the last one's accesses.
    pub fn set_recompute(&mut self, on: bool) {
        if self.model.recomputes() != on {
            self.model.set_recompute_blocks(blocks_recomputed(on, self.model.blocks.len()));
            self.step_changed = true;
        }
    }
}

/// How many of `blocks`, from the first, are recomputed with recompute `on`: all, unless
/// `PAGETRAIN_RECOMPUTE_BLOCKS=n` says fewer (for measuring what keeping the last blocks'
/// activations saves); none when off.
pub(super) fn blocks_recomputed(on: bool, blocks: usize) -> usize {
    if !on {
        return 0;
    }
    let asked = std::env::var("PAGETRAIN_RECOMPUTE_BLOCKS").ok().and_then(|v| v.parse::<usize>().ok());
    asked.filter(|&n| n > 0).map_or(blocks, |n| n.min(blocks))
}

/// Whether recomputed blocks keep their attention's output from a run's start: as
/// [`attention_asked`], else where waits may block — not in the browser, whose pager cannot take
/// a step unlike the last (as with remaking, [`Trainer::remake_if_paging`]): the web demo's
/// third step failed to fit its budget after the second stopped keeping attention.
pub(super) fn keep_attention_at_start(ctx: &Context) -> bool {
    attention_asked().unwrap_or_else(|| ctx.pager.waits_may_block())
}

/// Whether recomputed blocks keep their attention's output (`Gpt::set_keep_attention`) as
/// `PAGETRAIN_RECOMPUTE_ATTENTION` asks: `1` runs it again, `0` keeps it even where the run
/// pages; otherwise (`None`) it is kept until the run pages.
pub(super) fn attention_asked() -> Option<bool> {
    match std::env::var("PAGETRAIN_RECOMPUTE_ATTENTION").as_deref() {
        Ok("1") => Some(false),
        Ok("0") => Some(true),
        _ => None,
    }
}
