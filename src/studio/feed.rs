//! What flows between a training run and the studio: events from the run (step reports, pager
//! snapshots, checkpoints, failures) and commands to it, applied at step boundaries.

use crate::context::{Context, StoreKind};
use crate::device::DeviceOptions;
use crate::pager::{size_class, Counters, Snapshot};
use crate::train::{format_bytes, TrainConfig, Trainer};

/// Everything needed to start a run from the studio.
#[derive(Clone, Debug)]
pub struct RunSetup {
    pub train: TrainConfig,
    /// GPU byte budget; `None`: the pager's automatic one.
    pub budget: Option<u64>,
    pub store: StoreKind,
    pub device: DeviceOptions,
}

/// The run as it started: what the panels print in their headings.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// "4 layers, 4 heads, 128 channels, block 128, vocab 65".
    pub model: String,
    pub params: usize,
    pub data: String,
    pub adapter: String,
    pub optimizer: String,
    pub precision: String,
    pub store: String,
    pub first_step: u64,
    pub last_step: u64,
    pub tokens_per_step: u64,
}

/// One finished optimizer step, with the pager's work during it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepInfo {
    /// Steps done after this one (1 for the first step of a fresh run).
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    /// Wall time of the step.
    pub seconds: f64,
    /// Wall time of the run from its first step to the end of this one, pauses left out.
    pub elapsed_s: f64,
    pub tokens_per_s: f64,
    pub bytes_uploaded: u64,
    pub bytes_written_back: u64,
    /// Seconds the host waited on transfers during the step.
    pub stall_s: f64,
    pub micro_batch: usize,
    /// Times this step halved its micro-batch because one did not fit the GPU.
    pub shrinks: u64,
    /// The f16 loss scaler skipped this step's update (its gradients overflowed).
    pub skipped: bool,
    pub loss_scale: f32,
    /// From this step on, backward makes LayerNorm outputs and the MLP's hidden values again
    /// instead of paging them (the run turned it on after having to evict).
    pub began_remaking: bool,
    /// The recompute trial decided at this step: what it measured and kept.
    pub recompute_decided: Option<crate::train::RecomputeDecision>,
    /// The upload trial decided at this step: what it measured and kept.
    pub upload_decided: Option<crate::train::UploadDecision>,
}

/// What a [`StepInfo`] is measured from: the pager's counters and the trainer's skipped steps,
/// taken just before the step (natively and in the browser alike).
pub struct StepStart {
    counters: Counters,
    skipped_steps: u64,
    remaking: bool,
    recompute_decided: bool,
    upload_decided: bool,
}

impl StepStart {
    pub fn take(ctx: &Context, trainer: &Trainer) -> StepStart {
        StepStart {
            counters: ctx.pager.counters(),
            skipped_steps: trainer.skipped_steps,
            remaking: trainer.model.remakes(),
            recompute_decided: trainer.recompute_decision().is_some(),
            upload_decided: trainer.upload_decision().is_some(),
        }
    }

    /// The step just done: `seconds` its wall time, `elapsed_s` the run's from its first step on.
    pub fn info(&self, ctx: &Context, trainer: &Trainer, loss: f32, seconds: f64, elapsed_s: f64) -> StepInfo {
        let (before, after) = (&self.counters, ctx.pager.counters());
        let tokens_per_step = (trainer.effective_batch() * trainer.cfg.seq_len) as f64;
        StepInfo {
            step: trainer.step,
            loss,
            lr: trainer.cfg.lr_at(trainer.step.saturating_sub(1)),
            seconds,
            elapsed_s,
            tokens_per_s: tokens_per_step / seconds.max(1e-9),
            bytes_uploaded: after.bytes_uploaded - before.bytes_uploaded,
            bytes_written_back: after.bytes_written_back - before.bytes_written_back,
            stall_s: after.stall_s - before.stall_s,
            micro_batch: trainer.micro_batch,
            shrinks: after.micro_batch_shrinks - before.micro_batch_shrinks,
            skipped: trainer.skipped_steps > self.skipped_steps,
            loss_scale: trainer.loss_scale,
            began_remaking: !self.remaking && trainer.model.remakes(),
            recompute_decided: trainer.recompute_decision().filter(|_| !self.recompute_decided),
            upload_decided: trainer.upload_decision().filter(|_| !self.upload_decided),
        }
    }
}

/// Host memory beside a pager snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostMemory {
    /// Resident set of this process (`None` where the OS does not say).
    pub rss_bytes: Option<u64>,
    /// Bytes of tensors held only on the host, and of those the ones whose pages are in RAM.
    pub host_only_bytes: u64,
    pub host_in_ram_bytes: u64,
}

impl HostMemory {
    /// Reads the process's resident set and splits the snapshot's host-only tensors by residency.
    pub fn measure(snapshot: &Snapshot) -> HostMemory {
        use crate::pager::Location;
        let (mut host_only, mut in_ram) = (0, 0);
        for t in &snapshot.tensors {
            match t.location {
                Location::HostRam => {
                    host_only += t.bytes;
                    in_ram += t.bytes;
                }
                Location::Disk => host_only += t.bytes,
                Location::Gpu | Location::Remade | Location::Nowhere => {}
            }
        }
        HostMemory { rss_bytes: resident_set_bytes(), host_only_bytes: host_only, host_in_ram_bytes: in_ram }
    }
}

#[cfg(target_os = "linux")]
fn resident_set_bytes() -> Option<u64> {
    // statm: sizes in pages; the second field is the resident set.
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(1) as u64)
}

#[cfg(not(target_os = "linux"))]
fn resident_set_bytes() -> Option<u64> {
    None
}

/// From a run to the studio.
#[derive(Clone, Debug)]
pub enum Event {
    Started(RunInfo),
    Step(StepInfo),
    Eval {
        step: u64,
        loss: f32,
    },
    Snapshot {
        step: u64,
        snapshot: Box<Snapshot>,
        host: HostMemory,
    },
    Checkpoint {
        step: u64,
        path: String,
    },
    /// The pager's budget changed (applied at a step boundary).
    Budget {
        step: u64,
        bytes: u64,
    },
    Sample(String),
    Paused,
    Resumed,
    /// A command could not be carried out; the run goes on.
    Error(String),
    /// The run could not start or stopped on an error; everything written so far is kept.
    Failed(String),
    /// All steps done; the run still answers samples and saves until stopped.
    Finished {
        step: u64,
    },
    /// Stopped on request.
    Stopped {
        step: u64,
    },
}

/// From the studio to a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Pause,
    Resume,
    Stop,
    SetBudget(u64),
    Save,
    Sample { prompt: String, tokens: usize, temperature: f32, seed: u64 },
}

impl RunInfo {
    /// What the panels print about a run set up as `t` in `ctx`.
    pub fn of(ctx: &Context, t: &Trainer, store: &StoreKind) -> RunInfo {
        let c = t.model.config;
        RunInfo {
            model: format!(
                "{} layers, {} heads, {} channels, block {}, vocab {}",
                c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size
            ),
            params: crate::nn::Module::num_params(&t.model),
            data: format!("{} ({} tokens)", t.data.path.display(), t.data.len()),
            adapter: ctx.gpu.describe(),
            optimizer: format!("{} ({})", t.opt.name(), t.optimizer_reason),
            precision: t.precision_note.clone(),
            store: match store {
                StoreKind::Memory => "host memory".into(),
                StoreKind::Mmap(dir) => format!("mmap files in {}", dir.display()),
            },
            first_step: t.step,
            last_step: t.cfg.steps,
            tokens_per_step: (t.effective_batch() * t.cfg.seq_len) as u64,
        }
    }
}

/// Refuses a budget below the largest tensor alive now (it could never be placed).
pub fn check_budget(ctx: &Context, bytes: u64) -> std::result::Result<(), String> {
    let snap = ctx.pager.snapshot();
    match snap.tensors.iter().max_by_key(|t| t.bytes) {
        Some(t) if size_class(t.bytes) > bytes => Err(format!(
            "a GPU budget of {} is below the largest tensor, {} ({}); the budget stays {}",
            format_bytes(bytes),
            t.name,
            format_bytes(size_class(t.bytes)),
            format_bytes(snap.budget)
        )),
        _ => Ok(()),
    }
}
