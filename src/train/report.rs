//! What a training run tells: a report after each step (to a [`Reporter`]: the CLI's progress bar,
//! the studio) and the summary at its end.

use super::trainer::Trainer;
use crate::dist::CommStats;

/// One finished optimizer step.
#[derive(Clone, Copy, Debug)]
pub struct StepReport {
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub tokens_per_s: f64,
    pub micro_batch: usize,
}

/// Receives progress; every method has a do-nothing default.
pub trait Reporter {
    fn on_start(&mut self, _trainer: &Trainer) {}
    fn on_step(&mut self, _r: &StepReport) {}
    fn on_eval(&mut self, _step: u64, _val_loss: f32) {}
    fn on_message(&mut self, _msg: &str) {}
}

/// A reporter that stays silent.
pub struct Quiet;
impl Reporter for Quiet {}

/// What a finished run reports (the CLI's `--json` line).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    pub final_train_loss: f32,
    pub final_val_loss: f32,
    pub baseline_loss: f32,
    pub tokens_per_s: f64,
    pub steps: u64,
    pub params: usize,
    pub losses: Vec<f32>,
    pub sample: String,
    pub adapter: String,
    /// Most bytes the GPU pool held at once; never above `budget_bytes`.
    pub peak_gpu_bytes: u64,
    pub budget_bytes: u64,
    /// Most bytes of live tensors at once (what a fully resident run would need).
    pub footprint_bytes: u64,
    pub bytes_uploaded: u64,
    pub bytes_written_back: u64,
    /// Seconds the host waited for transfers.
    pub stall_s: f64,
    /// Micro-batch the run ended with (smaller than --batch-size after out-of-memory shrinks).
    pub micro_batch: usize,
    pub accum: usize,
    pub optimizer_on: String,
    /// Whether the blocks were recomputed at the end of the run (asked for, or kept by the
    /// recompute trial).
    pub recompute: bool,
    /// What the recompute trial measured and kept (`TrainConfig::auto_recompute`), where it ran.
    pub recompute_choice: Option<String>,
    /// What the upload trial measured and kept (`train::upload_trial`), where it ran.
    pub upload_choice: Option<String>,
    /// Activation bytes per step (summed over its micro-batches) not kept from forward to
    /// backward: by the checkpointed blocks (`--recompute`; a micro-batch's footprint is lower by
    /// about its share of this, less one block's worth) or as LayerNorm and MLP outputs made
    /// again in backward (`TrainConfig::remake`).
    pub recompute_dropped_bytes_per_step: u64,
    pub precision: String,
    pub loss_scale: f32,
    pub skipped_steps: u64,
    /// Processes training together (1: a single process); the batch figures above are global.
    pub ranks: usize,
    /// Per step, this rank's communication (all zero for a single process).
    pub comm_per_step: CommStats,
    /// Bytes of AdamW state in this rank's host store, and every rank's (sharded runs).
    pub optimizer_state_bytes: u64,
    pub optimizer_state_bytes_per_rank: Vec<u64>,
    /// Seconds from the process's start to the end of this run's first step (its GPU work
    /// included): what a user waits before training is under way. None when no step ran.
    pub first_step_s: Option<f64>,
}
