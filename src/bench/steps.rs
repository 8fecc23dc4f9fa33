//! Training steps timed resident and at GPU budgets (fractions of the footprint, or bytes):
//! step time, bytes over the bus each way, where the pager's host time goes, and where AdamW ran.

use std::time::Instant;

use crate::context::Context;
use crate::error::Result;

/// Step times of one model at several GPU budgets (fractions of its footprint).
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepReport {
    pub model: String,
    pub tokens_per_step: usize,
    pub footprint_bytes: u64,
    pub step_ms_resident: f64,
    /// None where the budget cannot hold one op's working set even at a micro-batch of 1.
    pub step_ms_budget50: Option<f64>,
    pub step_ms_budget25: Option<f64>,
    pub step_ms_budget10: Option<f64>,
    /// Whether those steps recomputed their blocks, and why (`StepTiming::recompute`).
    pub recompute_budget50: Option<String>,
    pub recompute_budget25: Option<String>,
    pub recompute_budget10: Option<String>,
    /// Bytes moved per step (up + back) at 50 / 25 / 10 % budgets.
    pub bytes_per_step_budget50: Option<u64>,
    pub bytes_per_step_budget25: Option<u64>,
    pub bytes_per_step_budget10: Option<u64>,
    /// Of those, host → GPU.
    pub bytes_up_per_step_budget50: Option<u64>,
    pub bytes_up_per_step_budget25: Option<u64>,
    pub bytes_up_per_step_budget10: Option<u64>,
    /// Written back and then freed unread (traffic a better plan would save).
    pub bytes_unread_writeback_per_step_budget50: Option<u64>,
    pub bytes_unread_writeback_per_step_budget25: Option<u64>,
    pub bytes_unread_writeback_per_step_budget10: Option<u64>,
    /// Seconds a step the host waited for transfers at 25 % (transfer time not hidden).
    pub exposed_ms_budget25: Option<f64>,
    /// The upload path the paged runs used.
    pub upload_path: String,
    /// How the paged runs' pool gave tensors GPU memory (`Pager::gpu_pool`, at the end of the
    /// first of them, else of the resident run).
    pub gpu_pool: String,
    /// Share of the transfer time (bytes / measured ring bandwidth) that did not add to the
    /// step time, at 25 % budget.
    pub hidden_fraction_budget25: Option<f64>,
    pub resident_tokens_per_s: f64,
    /// The same figure under the name the table uses (tokens trained a second, resident).
    pub train_tokens_per_s: f64,
    /// Seconds from opening the GPU to the end of the first resident step: device, model, data,
    /// every pipeline compiled (or loaded from the on-disk pipeline cache) and one step run.
    pub first_step_s: f64,
    /// Of `first_step_s`: seconds creating shader modules (naga) and pipelines (the driver).
    pub first_step_module_s: f64,
    pub first_step_pipeline_s: f64,
    /// Of `first_step_s`: seconds waiting for pipelines compiling on workers.
    pub first_step_pipeline_wait_s: f64,
    /// Per resident step: kernel dispatches, compute passes they were recorded in (a copy or
    /// clear ends one), submissions, and bind groups created (none once warm).
    pub dispatches_per_step: f64,
    pub compute_passes_per_step: f64,
    pub submissions_per_step: f64,
    pub bind_groups_per_step: f64,
    pub budget25_vs_resident: Option<f64>,
    /// Where AdamW ran in the resident steps (`gpu`, `host`), and why (`--optimizer-on auto`
    /// decides per budget: each budget's step below says where it ran).
    pub optimizer_resident: String,
    pub optimizer_resident_reason: String,
    /// Per resident step: host milliseconds in the host optimizer's passes (None: it ran on the GPU).
    pub host_optimizer_ms_resident: Option<f64>,
    /// Budgets (percent) where the GPU optimizer's working set did not fit and AdamW ran on the
    /// host instead (as `--optimizer-on auto` would choose).
    pub host_optimizer_at: Vec<u64>,
    /// Steps at budgets given in bytes (`pagetrain bench --budget 2GiB`).
    pub at_budgets: Vec<AtBudget>,
}

/// A step timed at a budget given in bytes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AtBudget {
    pub budget_bytes: u64,
    /// None where one op's working set does not fit even at a micro-batch of 1.
    pub step_ms: Option<f64>,
    pub bytes_up_per_step: Option<u64>,
    pub bytes_down_per_step: Option<u64>,
    /// Bytes moved inside GPU memory a step to open ranges in slabs (compaction).
    pub bytes_moved_in_gpu_per_step: Option<u64>,
    pub tokens_per_s: Option<f64>,
    /// Resident step time / this step time, each step with the optimizer its run chose.
    pub vs_resident: Option<f64>,
    /// Where AdamW ran in these steps, and why; and what `vs_resident` compares, in words.
    pub optimizer: Option<String>,
    pub optimizer_reason: Option<String>,
    /// Whether the paged steps recomputed their blocks, and why (what the recompute trial
    /// measured, where it ran).
    pub recompute: Option<String>,
    /// How the paged steps' uploads crossed the bus, and why (what the upload trial measured,
    /// where it ran).
    pub upload: Option<String>,
    pub compared: Option<String>,
    /// Per step: host milliseconds in the host optimizer's passes (None: it ran on the GPU).
    pub host_optimizer_ms_per_step: Option<f64>,
    /// The timed steps' bets on being unclipped (`optim::speculative_update`): kept, lost; and
    /// what the bet trial measured, where it ran.
    pub bets_kept_lost: Option<[u64; 2]>,
    pub bet_trial: Option<String>,
    /// Per step: host milliseconds in the pager's accesses (placing, evicting, recording the
    /// copies, waiting), and of those, waiting for transfers.
    pub pager_ms_per_step: Option<f64>,
    pub stall_ms_per_step: Option<f64>,
    /// Per step: milliseconds submissions waited for the upload ring's copy threads.
    pub fill_wait_ms_per_step: Option<f64>,
    /// Per step: host milliseconds in submissions (the waits for fills included) and in polls
    /// of the device (which run map callbacks).
    pub submit_ms_per_step: Option<f64>,
    pub poll_ms_per_step: Option<f64>,
    /// Bytes of upload staging slots made (on a discrete GPU they are VRAM behind the BAR,
    /// beside the budget).
    pub upload_ring_bytes: Option<u64>,
    /// Per step: uploads by DMA behind their own write-back (`Counters::uploads_behind_writeback`).
    pub uploads_behind_writeback_per_step: Option<f64>,
    /// Per step: uploads whose staging slots were filled ahead by the plan, and bytes filled
    /// ahead but not used (`Counters::prefilled_uploads`, `prefill_wasted_bytes`).
    pub prefilled_uploads_per_step: Option<f64>,
    pub prefill_wasted_bytes_per_step: Option<f64>,
    /// Per step: dispatches and submissions recorded, bind groups made, and GPU buffers the
    /// pool created (each a driver allocation).
    pub dispatches_per_step: Option<f64>,
    pub submissions_per_step: Option<f64>,
    pub bind_groups_per_step: Option<f64>,
    pub buffers_created_per_step: Option<f64>,
}

/// Timed steps under one budget.
#[derive(Clone, Debug)]
pub struct StepTiming {
    pub ms: f64,
    /// Per step: bytes up and back, bytes written back and freed unread, seconds stalled.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub unread_writeback: u64,
    /// Per step: bytes moved inside GPU memory (`Counters::bytes_relocated`).
    pub bytes_moved_in_gpu: u64,
    pub exposed_s: f64,
    /// Per step: seconds in the pager's accesses (`Counters::access_s`).
    pub access_s: f64,
    /// Per step: seconds submissions waited for upload-ring fills (`Counters::fill_wait_s`).
    pub fill_wait_s: f64,
    /// Per step: host seconds in submissions and in device polls (`Recorder::host_seconds`).
    pub submit_s: f64,
    pub poll_s: f64,
    /// Bytes of upload staging slots made by the end.
    pub upload_ring_bytes: u64,
    pub uploads_behind_writeback: f64,
    pub prefilled_uploads: f64,
    pub prefill_wasted_bytes: f64,
    /// Bytes of all live tensors at most (what a resident run needs).
    pub footprint: u64,
    pub upload_path: String,
    /// `Pager::gpu_pool` at the end.
    pub gpu_pool: String,
    /// Seconds from opening the context to the end of the first step.
    pub first_step_s: f64,
    /// Of those, seconds creating shader modules and pipelines.
    pub first_step_creation: crate::kernels::Creation,
    /// Per timed step: dispatches, compute passes, submissions, bind groups created, GPU buffers
    /// the pool created.
    pub recording: [f64; 5],
    /// Where AdamW ran (`Optimizer::name`) and why; per step, host seconds in the host
    /// optimizer's passes (None where none runs on the main thread's behalf).
    pub optimizer: String,
    pub optimizer_reason: String,
    pub host_optimizer_s: Option<f64>,
    /// The timed steps' bets on being unclipped, kept and lost (None without host AdamW), and
    /// the bet trial's decision.
    pub bets: Option<[u64; 2]>,
    pub bet_trial: Option<String>,
    /// Whether the blocks were recomputed, and why (`Trainer::recompute_decision`).
    pub recompute: String,
}

/// Runs `warmup + steps` training steps under `budget` and times the last `steps`.
pub fn time_steps(
    make_ctx: &dyn Fn(Option<u64>) -> Result<Context>,
    cfg: &crate::train::TrainConfig,
    data: &dyn Fn() -> Result<crate::train::Dataset>,
    budget: Option<u64>,
    warmup: usize,
    steps: usize,
) -> Result<StepTiming> {
    let opened = Instant::now();
    let ctx = make_ctx(budget)?;
    let mut t = crate::train::Trainer::new(&ctx, cfg.clone(), Some(data()?))?;
    let mut first_step_s = None;
    let mut first_step_creation = Default::default();
    // (the warm-up lasts until a paged run's trials have chosen: they time steps themselves)
    let mut warmed = 0;
    while warmed < warmup.max(1) || t.trials_running() {
        warmed += 1;
        ctx.kernels.profile_step();
        pollster::block_on(t.train_step(&ctx))?;
        if first_step_s.is_none() {
            ctx.sync()?;
            first_step_s = Some(opened.elapsed().as_secs_f64());
            first_step_creation = ctx.kernels.creation();
        }
    }
    ctx.sync()?;
    ctx.kernels.profile_restart();
    let before = ctx.pager.counters();
    let host_before = ctx.recorder.host_seconds();
    let recording = || {
        let (k, r) = (&ctx.kernels, &ctx.recorder);
        [k.dispatch_count(), r.passes(), r.submissions(), k.bind_groups_created(), ctx.pager.pool_buffers_created()]
            .map(|c| c as f64)
    };
    let recorded_before = recording();
    let host_optimizer_before = t.opt.host_seconds();
    let bets_before = t.opt.bets();
    let start = Instant::now();
    // As the training loop runs: a step's loss is read once the next step is recorded.
    let mut pending = None;
    for _ in 0..steps {
        ctx.kernels.profile_step();
        let loss = pollster::block_on(t.train_step_pending(&ctx))?;
        if let Some(prev) = pending.replace(loss) {
            pollster::block_on(prev.get(&ctx))?;
        }
    }
    if let Some(last) = pending {
        pollster::block_on(last.get(&ctx))?;
    }
    ctx.sync()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let mut per_step = recording();
    for (after, before) in per_step.iter_mut().zip(recorded_before) {
        *after = (*after - before) / steps.max(1) as f64;
    }
    // PAGETRAIN_PROFILE=1: GPU time per kernel entry and timed step (not the warm-up steps,
    // which compile and run at cold clocks: a paged H100's first steps took 3× the kernel time).
    let profile = ctx.kernels.profile();
    if let Some((how, lost)) = ctx.kernels.profile_method() {
        eprintln!("profile: GPU time per kernel entry, timed by {how}; {lost} dispatches' timestamps lost");
    }
    for (entry, n, secs) in profile {
        let per = steps.max(1) as f64;
        eprintln!("profile: {entry:<28} {:>8.1} dispatches {:>9.2} ms a step", n as f64 / per, secs * 1e3 / per);
    }
    print_timeline(&ctx.kernels.profile_timeline());
    let after = ctx.pager.counters();
    let host_after = ctx.recorder.host_seconds();
    let n = steps.max(1) as u64;
    let recompute: String = match (cfg.recompute, t.recompute_decision()) {
        (true, _) if t.model.recompute_blocks() < t.model.blocks.len() => {
            format!("on for the first {} of {} blocks (asked for)", t.model.recompute_blocks(), t.model.blocks.len())
        }
        (true, _) => "on (asked for)".into(),
        (false, Some(decided)) => decided.to_string(),
        (false, None) => "off".into(),
    };
    let kept = if t.model.recomputes() && t.model.keeps_attention() { "; attention kept" } else { "" };
    let recompute = recompute + kept;
    Ok(StepTiming {
        ms,
        bytes_up: (after.bytes_uploaded - before.bytes_uploaded) / n,
        bytes_down: (after.bytes_written_back - before.bytes_written_back) / n,
        unread_writeback: (after.writeback_unread_bytes - before.writeback_unread_bytes) / n,
        bytes_moved_in_gpu: (after.bytes_relocated - before.bytes_relocated) / n,
        exposed_s: (after.stall_s - before.stall_s) / n as f64,
        access_s: (after.access_s - before.access_s) / n as f64,
        fill_wait_s: (after.fill_wait_s - before.fill_wait_s) / n as f64,
        submit_s: (host_after.0 - host_before.0) / n as f64,
        poll_s: (host_after.1 - host_before.1) / n as f64,
        upload_ring_bytes: ctx.pager.staging_bytes().0,
        uploads_behind_writeback: (after.uploads_behind_writeback - before.uploads_behind_writeback) as f64 / n as f64,
        prefilled_uploads: (after.prefilled_uploads - before.prefilled_uploads) as f64 / n as f64,
        prefill_wasted_bytes: (after.prefill_wasted_bytes - before.prefill_wasted_bytes) as f64 / n as f64,
        footprint: ctx.pager.live_bytes().1,
        upload_path: ctx.pager.upload_path(),
        gpu_pool: ctx.pager.gpu_pool(),
        first_step_s: first_step_s.unwrap_or_default(),
        first_step_creation,
        recording: per_step,
        optimizer: t.opt.name().to_string(),
        optimizer_reason: t.optimizer_reason.clone(),
        recompute,
        bets: t.opt.bets().zip(bets_before).map(|(a, b)| [a.0 - b.0, a.1 - b.1]),
        bet_trial: t.bet_decision().map(|d| d.to_string()),
        host_optimizer_s: t
            .opt
            .host_seconds()
            .zip(host_optimizer_before)
            .map(|(after, before)| (after - before) / n as f64),
    })
}

/// `PAGETRAIN_PROFILE=timeline`: per step, its time on the GPU, the kernels' share, and the
/// longest gaps between dispatches (copies, or the GPU waiting for the host): ten, or
/// `PAGETRAIN_TIMELINE_GAPS` (a paged f16 step's forward waits at each of its host-updated
/// blocks, more than ten places).
fn print_timeline(steps: &[crate::kernels::timeline::StepTimeline]) {
    let shown = std::env::var("PAGETRAIN_TIMELINE_GAPS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    for (i, s) in steps.iter().enumerate() {
        eprintln!(
            "timeline: step {i}: {:.1} ms on the GPU, {} dispatches, kernels {:.1} ms, between them {:.1} ms",
            s.span_ms,
            s.dispatches,
            s.kernel_ms,
            s.between_ms()
        );
        for g in s.gaps.iter().take(shown).filter(|g| g.ms >= 0.05) {
            let why = if g.profiler_wait { " (the profiler's read-back)" } else { "" };
            eprintln!(
                "timeline:   {:>7.2} ms after dispatch {:>4} {} -> {}{why}",
                g.ms, g.after_index, g.before, g.after
            );
        }
    }
}

/// The budgets [`step_times`] times steps at, besides resident.
#[derive(Clone, Copy, Debug, Default)]
pub struct Budgets<'a> {
    /// Those of 50, 25 and 10 (percent of the footprint) to time; None in the report for others.
    pub percent: &'a [u64],
    /// Budgets in bytes.
    pub bytes: &'a [u64],
}

/// Step time resident and at `budgets`; `ring_gbps` converts bytes moved into transfer time for
/// the hidden fraction.
pub fn step_times(
    make_ctx: &dyn Fn(Option<u64>) -> Result<Context>,
    cfg: &crate::train::TrainConfig,
    data: &dyn Fn() -> Result<crate::train::Dataset>,
    ring_gbps: f64,
    budgets: Budgets,
    warmup: usize,
    steps: usize,
) -> Result<StepReport> {
    let full = time_steps(make_ctx, cfg, data, None, warmup, steps)?;
    let (resident, footprint) = (full.ms, full.footprint);
    let mut at: Vec<Option<StepTiming>> = Vec::new();
    let mut host_optimizer_at = Vec::new();
    let on_host = crate::train::TrainConfig { optimizer_on: crate::train::OptimizerOn::Host, ..cfg.clone() };
    for pct in [50u64, 25, 10] {
        if !budgets.percent.contains(&pct) {
            at.push(None);
            continue;
        }
        let budget = Some(footprint * pct / 100);
        let r = match time_steps(make_ctx, cfg, data, budget, warmup, steps) {
            Err(e) if crate::train::trainer::is_out_of_memory(&e) && cfg.optimizer_on != on_host.optimizer_on => {
                host_optimizer_at.push(pct);
                time_steps(make_ctx, &on_host, data, budget, warmup, steps)
            }
            r => r,
        };
        match r {
            Ok(r) => at.push(Some(r)),
            Err(e) if crate::train::trainer::is_out_of_memory(&e) => at.push(None),
            Err(e) => return Err(e),
        }
    }
    let hidden = at[1].as_ref().map(|t| {
        let (ms, bytes) = (t.ms, t.bytes_up + t.bytes_down);
        let transfer_ms = bytes as f64 / (ring_gbps * 1e9) * 1e3;
        let exposed = (ms - resident).max(0.0);
        if transfer_ms > 0.0 {
            (1.0 - exposed / transfer_ms).clamp(0.0, 1.0)
        } else {
            1.0
        }
    });
    let tokens = cfg.batch_size * cfg.accum * cfg.seq_len;
    let host_ms = |t: &StepTiming| t.host_optimizer_s.map(|s| s * 1e3);
    let mut at_budgets = Vec::new();
    for &b in budgets.bytes {
        let t = match time_steps(make_ctx, cfg, data, Some(b), warmup, steps) {
            Ok(t) => Some(t),
            Err(e) if crate::train::trainer::is_out_of_memory(&e) => None,
            Err(e) => return Err(e),
        };
        at_budgets.push(AtBudget {
            budget_bytes: b,
            step_ms: t.as_ref().map(|t| t.ms),
            bytes_up_per_step: t.as_ref().map(|t| t.bytes_up),
            bytes_down_per_step: t.as_ref().map(|t| t.bytes_down),
            bytes_moved_in_gpu_per_step: t.as_ref().map(|t| t.bytes_moved_in_gpu),
            tokens_per_s: t.as_ref().map(|t| tokens as f64 / (t.ms / 1e3)),
            vs_resident: t.as_ref().map(|t| resident / t.ms),
            optimizer: t.as_ref().map(|t| t.optimizer.clone()),
            optimizer_reason: t.as_ref().map(|t| t.optimizer_reason.clone()),
            recompute: t.as_ref().map(|t| t.recompute.clone()),
            upload: t.as_ref().map(|t| t.upload_path.clone()),
            compared: t.as_ref().map(|t| {
                format!(
                    "this paged step (AdamW on the {}) against the resident step of the same model (AdamW on the {}), each where --optimizer-on {} put it",
                    t.optimizer,
                    full.optimizer,
                    format!("{:?}", cfg.optimizer_on).to_lowercase()
                )
            }),
            host_optimizer_ms_per_step: t.as_ref().and_then(&host_ms),
            bets_kept_lost: t.as_ref().and_then(|t| t.bets),
            bet_trial: t.as_ref().and_then(|t| t.bet_trial.clone()),
            pager_ms_per_step: t.as_ref().map(|t| t.access_s * 1e3),
            stall_ms_per_step: t.as_ref().map(|t| t.exposed_s * 1e3),
            fill_wait_ms_per_step: t.as_ref().map(|t| t.fill_wait_s * 1e3),
            submit_ms_per_step: t.as_ref().map(|t| t.submit_s * 1e3),
            poll_ms_per_step: t.as_ref().map(|t| t.poll_s * 1e3),
            upload_ring_bytes: t.as_ref().map(|t| t.upload_ring_bytes),
            uploads_behind_writeback_per_step: t.as_ref().map(|t| t.uploads_behind_writeback),
            prefilled_uploads_per_step: t.as_ref().map(|t| t.prefilled_uploads),
            prefill_wasted_bytes_per_step: t.as_ref().map(|t| t.prefill_wasted_bytes),
            dispatches_per_step: t.as_ref().map(|t| t.recording[0]),
            submissions_per_step: t.as_ref().map(|t| t.recording[2]),
            bind_groups_per_step: t.as_ref().map(|t| t.recording[3]),
            buffers_created_per_step: t.as_ref().map(|t| t.recording[4]),
        });
    }
    Ok(StepReport {
        at_budgets,
        model: cfg.model.clone(),
        tokens_per_step: tokens,
        footprint_bytes: footprint,
        step_ms_resident: resident,
        step_ms_budget50: at[0].as_ref().map(|r| r.ms),
        step_ms_budget25: at[1].as_ref().map(|r| r.ms),
        step_ms_budget10: at[2].as_ref().map(|r| r.ms),
        recompute_budget50: at[0].as_ref().map(|r| r.recompute.clone()),
        recompute_budget25: at[1].as_ref().map(|r| r.recompute.clone()),
        recompute_budget10: at[2].as_ref().map(|r| r.recompute.clone()),
        bytes_per_step_budget50: at[0].as_ref().map(|r| r.bytes_up + r.bytes_down),
        bytes_per_step_budget25: at[1].as_ref().map(|r| r.bytes_up + r.bytes_down),
        bytes_per_step_budget10: at[2].as_ref().map(|r| r.bytes_up + r.bytes_down),
        bytes_up_per_step_budget50: at[0].as_ref().map(|r| r.bytes_up),
        bytes_up_per_step_budget25: at[1].as_ref().map(|r| r.bytes_up),
        bytes_up_per_step_budget10: at[2].as_ref().map(|r| r.bytes_up),
        bytes_unread_writeback_per_step_budget50: at[0].as_ref().map(|r| r.unread_writeback),
        bytes_unread_writeback_per_step_budget25: at[1].as_ref().map(|r| r.unread_writeback),
        bytes_unread_writeback_per_step_budget10: at[2].as_ref().map(|r| r.unread_writeback),
        exposed_ms_budget25: at[1].as_ref().map(|r| r.exposed_s * 1e3),
        upload_path: at.iter().flatten().next().unwrap_or(&full).upload_path.clone(),
        gpu_pool: at.iter().flatten().next().unwrap_or(&full).gpu_pool.clone(),
        hidden_fraction_budget25: hidden,
        resident_tokens_per_s: tokens as f64 / (resident / 1e3),
        train_tokens_per_s: tokens as f64 / (resident / 1e3),
        first_step_s: full.first_step_s,
        first_step_module_s: full.first_step_creation.module_s,
        first_step_pipeline_s: full.first_step_creation.pipeline_s,
        first_step_pipeline_wait_s: full.first_step_creation.pipeline_wait_s,
        dispatches_per_step: full.recording[0],
        compute_passes_per_step: full.recording[1],
        submissions_per_step: full.recording[2],
        bind_groups_per_step: full.recording[3],
        budget25_vs_resident: at[1].as_ref().map(|r| resident / r.ms),
        host_optimizer_at,
        optimizer_resident: full.optimizer.clone(),
        optimizer_resident_reason: full.optimizer_reason.clone(),
        host_optimizer_ms_resident: host_ms(&full),
    })
}
