//! Transfer benchmarks shared by `pagetrain bench` and `benches/`: the pager's staging ring
//! against `queue.write_buffer` (the peer, measured in the same run) for uploads, and the
//! readback ring for write-backs. Bandwidths are bytes of tensor data per second, end to end:
//! from host memory until the GPU has them (or back into the host store).

pub mod kernels;

use std::time::Instant;

use crate::context::Context;
use crate::error::Result;
use crate::kernels::elementwise;
use crate::tensor::Tensor;

/// One transfer measurement.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Transfer {
    pub bytes: u64,
    pub seconds: f64,
}

impl Transfer {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

/// `count` tensors of `bytes` bytes each, holding host data.
pub fn host_tensors(ctx: &Context, count: usize, bytes: usize) -> Result<Vec<Tensor>> {
    let n = bytes / 4;
    let data: Vec<f32> = (0..n).map(|i| (i % 977) as f32).collect();
    (0..count).map(|i| ctx.from_f32(&format!("bench {i}"), &[n], &data, false)).collect()
}

/// Uploads every tensor through the pager's upload path (staging ring or zero-copy) and waits
/// until the GPU has them.
pub fn upload_ring(ctx: &Context, tensors: &[Tensor]) -> Result<Transfer> {
    for t in tensors {
        ctx.pager.evict(t.id())?;
    }
    ctx.sync()?;
    let start = Instant::now();
    for t in tensors {
        let _op = ctx.op();
        ctx.read(t)?;
    }
    ctx.sync()?;
    Ok(Transfer { bytes: tensors.iter().map(|t| t.bytes()).sum(), seconds: start.elapsed().as_secs_f64() })
}

/// The same bytes through `queue.write_buffer` into GPU buffers of the same sizes.
pub fn upload_write_buffer(ctx: &Context, count: usize, bytes: usize) -> Result<Transfer> {
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let buffers: Vec<wgpu::Buffer> = (0..count)
        .map(|i| {
            ctx.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("write_buffer bench {i}")),
                size: bytes as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
        .collect();
    ctx.sync()?;
    let start = Instant::now();
    for b in &buffers {
        ctx.gpu.queue.write_buffer(b, 0, &data);
    }
    ctx.gpu.queue.submit([]);
    ctx.sync()?;
    Ok(Transfer { bytes: (count * bytes) as u64, seconds: start.elapsed().as_secs_f64() })
}

/// Makes every tensor dirty on the GPU, then writes them all back into the host store.
pub fn writeback(ctx: &Context, tensors: &[Tensor]) -> Result<Transfer> {
    for t in tensors {
        let _op = ctx.op();
        elementwise::fill(&ctx.kernels, &ctx.write(t)?, 1.5, t.len())?;
    }
    ctx.sync()?;
    let start = Instant::now();
    for t in tensors {
        ctx.pager.evict(t.id())?;
    }
    ctx.pager.drain()?;
    Ok(Transfer { bytes: tensors.iter().map(|t| t.bytes()).sum(), seconds: start.elapsed().as_secs_f64() })
}

/// Results of `pagetrain bench` (transfer part).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TransferReport {
    pub adapter: String,
    pub tensor_bytes: u64,
    pub tensors: usize,
    pub upload_ring_gbps: f64,
    /// Straight into host-visible GPU buffers, where memory is unified (else None).
    pub upload_zero_copy_gbps: Option<f64>,
    pub upload_write_buffer_gbps: f64,
    /// The path the pager picked on this adapter, and why.
    pub upload_path: String,
    pub writeback_gbps: f64,
    pub upload_ring_vs_write_buffer: f64,
}

/// Best of `repeats` runs of each transfer over `count` tensors of `bytes` bytes.
pub fn transfers(ctx: &Context, count: usize, bytes: usize, repeats: usize) -> Result<TransferReport> {
    let tensors = host_tensors(ctx, count, bytes)?;
    let best = |f: &mut dyn FnMut() -> Result<Transfer>| -> Result<f64> {
        let mut best = 0.0f64;
        for _ in 0..repeats.max(1) {
            best = best.max(f()?.gbps());
        }
        Ok(best)
    };
    let chosen = ctx.pager.upload_path();
    ctx.pager.set_upload_path(crate::pager::UploadPath::Ring);
    let ring = best(&mut || upload_ring(ctx, &tensors))?;
    let zero_copy = if ctx.gpu.unified_memory() {
        ctx.pager.set_upload_path(crate::pager::UploadPath::ZeroCopy);
        let z = best(&mut || upload_ring(ctx, &tensors))?;
        ctx.pager.set_upload_path(crate::pager::UploadPath::Ring);
        Some(z)
    } else {
        None
    };
    let wb = best(&mut || upload_write_buffer(ctx, count, bytes))?;
    let back = best(&mut || writeback(ctx, &tensors))?;
    Ok(TransferReport {
        adapter: ctx.gpu.describe(),
        tensor_bytes: bytes as u64,
        tensors: count,
        upload_ring_gbps: ring,
        upload_zero_copy_gbps: zero_copy,
        upload_write_buffer_gbps: wb,
        upload_path: chosen,
        writeback_gbps: back,
        upload_ring_vs_write_buffer: ring / wb,
    })
}

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
    /// Bytes moved per step (up + back) at 50 / 25 / 10 % budgets.
    pub bytes_per_step_budget50: Option<u64>,
    pub bytes_per_step_budget25: Option<u64>,
    pub bytes_per_step_budget10: Option<u64>,
    /// Share of the transfer time (bytes / measured ring bandwidth) that did not add to the
    /// step time, at 25 % budget.
    pub hidden_fraction_budget25: Option<f64>,
    pub resident_tokens_per_s: f64,
    /// The same figure under the name the table uses (tokens trained a second, resident).
    pub train_tokens_per_s: f64,
    /// Seconds from opening the GPU to the end of the first resident step: device, model, data,
    /// every pipeline compiled (or loaded from the on-disk pipeline cache) and one step run.
    pub first_step_s: f64,
    pub budget25_vs_resident: Option<f64>,
    /// Budgets (percent) where the GPU optimizer's working set did not fit and AdamW ran on the
    /// host instead (as `--optimizer-on auto` would choose).
    pub host_optimizer_at: Vec<u64>,
}

/// Runs `warmup + steps` training steps under `budget` and returns (ms per step, bytes moved per
/// step, footprint bytes, seconds from opening the context to the end of the first step).
pub fn time_steps(
    make_ctx: &dyn Fn(Option<u64>) -> Result<Context>,
    cfg: &crate::train::TrainConfig,
    data: &dyn Fn() -> Result<crate::train::Dataset>,
    budget: Option<u64>,
    warmup: usize,
    steps: usize,
) -> Result<(f64, u64, u64, f64)> {
    let opened = Instant::now();
    let ctx = make_ctx(budget)?;
    let mut t = crate::train::Trainer::new(&ctx, cfg.clone(), Some(data()?))?;
    let mut first_step_s = None;
    for _ in 0..warmup.max(1) {
        pollster::block_on(t.train_step(&ctx))?;
        if first_step_s.is_none() {
            ctx.sync()?;
            first_step_s = Some(opened.elapsed().as_secs_f64());
        }
    }
    ctx.sync()?;
    let before = ctx.pager.counters();
    let start = Instant::now();
    for _ in 0..steps {
        pollster::block_on(t.train_step(&ctx))?;
    }
    ctx.sync()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
    // PAGETRAIN_PROFILE=1: GPU time per kernel entry and step (warm-up steps included).
    for (entry, n, secs) in ctx.kernels.profile() {
        let per = (warmup + steps) as f64;
        eprintln!("profile: {entry:<28} {:>8.1} dispatches {:>9.2} ms a step", n as f64 / per, secs * 1e3 / per);
    }
    let after = ctx.pager.counters();
    let moved = (after.bytes_uploaded - before.bytes_uploaded + after.bytes_written_back - before.bytes_written_back)
        / steps as u64;
    Ok((ms, moved, ctx.pager.live_bytes().1, first_step_s.unwrap_or_default()))
}

/// Step time resident and at those of 50 %, 25 %, 10 % of the footprint listed in `budgets`
/// (None for the others); `ring_gbps` converts bytes moved into transfer time for the hidden fraction.
pub fn step_times(
    make_ctx: &dyn Fn(Option<u64>) -> Result<Context>,
    cfg: &crate::train::TrainConfig,
    data: &dyn Fn() -> Result<crate::train::Dataset>,
    ring_gbps: f64,
    budgets: &[u64],
    warmup: usize,
    steps: usize,
) -> Result<StepReport> {
    let (resident, _, footprint, first_step_s) = time_steps(make_ctx, cfg, data, None, warmup, steps)?;
    let mut at: Vec<Option<(f64, u64, u64, f64)>> = Vec::new();
    let mut host_optimizer_at = Vec::new();
    let on_host = crate::train::TrainConfig { optimizer_on: crate::train::OptimizerOn::Host, ..cfg.clone() };
    for pct in [50u64, 25, 10] {
        if !budgets.contains(&pct) {
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
    let hidden = at[1].map(|(ms, bytes, _, _)| {
        let transfer_ms = bytes as f64 / (ring_gbps * 1e9) * 1e3;
        let exposed = (ms - resident).max(0.0);
        if transfer_ms > 0.0 {
            (1.0 - exposed / transfer_ms).clamp(0.0, 1.0)
        } else {
            1.0
        }
    });
    let tokens = cfg.batch_size * cfg.accum * cfg.seq_len;
    Ok(StepReport {
        model: cfg.model.clone(),
        tokens_per_step: tokens,
        footprint_bytes: footprint,
        step_ms_resident: resident,
        step_ms_budget50: at[0].map(|r| r.0),
        step_ms_budget25: at[1].map(|r| r.0),
        step_ms_budget10: at[2].map(|r| r.0),
        bytes_per_step_budget50: at[0].map(|r| r.1),
        bytes_per_step_budget25: at[1].map(|r| r.1),
        bytes_per_step_budget10: at[2].map(|r| r.1),
        hidden_fraction_budget25: hidden,
        resident_tokens_per_s: tokens as f64 / (resident / 1e3),
        train_tokens_per_s: tokens as f64 / (resident / 1e3),
        first_step_s,
        budget25_vs_resident: at[1].map(|r| resident / r.0),
        host_optimizer_at,
    })
}
