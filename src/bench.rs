//! Transfer benchmarks shared by `pagetrain bench` and `benches/`: the pager's upload paths
//! (staging ring, pinned memory, zero-copy) against `queue.write_buffer` (the peer, measured in
//! the same run), and write-backs (by DMA into a pinned store, else the readback ring). Bandwidths are bytes of tensor data per second, end to end:
//! from host memory until the GPU has them (or back into the host store).

pub mod autotune;
pub mod kernels;
mod steps;

pub use steps::{step_times, time_steps, AtBudget, Budgets, StepReport, StepTiming};

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
    /// Where the kernel choices came from: `built-in`, or the file `pagetrain tune` kept.
    pub kernel_choices: String,
    pub tensor_bytes: u64,
    pub tensors: usize,
    pub upload_ring_gbps: f64,
    /// Through the ring in pinned host memory, copied by DMA (Vulkan; else None).
    pub upload_pinned_gbps: Option<f64>,
    /// Straight into host-visible GPU buffers, where memory is unified (else None).
    pub upload_zero_copy_gbps: Option<f64>,
    pub upload_write_buffer_gbps: f64,
    /// The path the pager picked on this adapter, and why.
    pub upload_path: String,
    /// The host store the tensors live in (pinned memory: write-backs and pinned-path uploads
    /// go by DMA straight to and from it).
    pub host_store: String,
    /// The measured bandwidth of that path here.
    pub upload_chosen_gbps: f64,
    /// The budget `--gpu-budget auto` gives on this adapter, and how it was found.
    pub budget_auto_bytes: u64,
    pub budget_auto_source: String,
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
    use crate::pager::UploadPath;
    let chosen = ctx.pager.upload_path();
    let kind = ctx.pager.upload_path_kind();
    ctx.pager.set_upload_path(UploadPath::Ring);
    let ring = best(&mut || upload_ring(ctx, &tensors))?;
    // Each other path where the adapter offers it (the pager falls back to the ring otherwise).
    let on = |path: UploadPath| -> Result<Option<f64>> {
        ctx.pager.set_upload_path(path);
        if ctx.pager.upload_path_kind() != path {
            return Ok(None);
        }
        best(&mut || upload_ring(ctx, &tensors)).map(Some)
    };
    let pinned = on(UploadPath::Pinned)?;
    let zero_copy = on(UploadPath::ZeroCopy)?;
    ctx.pager.set_upload_path(kind);
    let wb = best(&mut || upload_write_buffer(ctx, count, bytes))?;
    let back = best(&mut || writeback(ctx, &tensors))?;
    Ok(TransferReport {
        adapter: ctx.gpu.describe(),
        kernel_choices: ctx.kernels.choices_from(),
        tensor_bytes: bytes as u64,
        tensors: count,
        upload_ring_gbps: ring,
        upload_pinned_gbps: pinned,
        upload_zero_copy_gbps: zero_copy,
        upload_write_buffer_gbps: wb,
        upload_path: chosen,
        host_store: ctx.pager.describe_store(),
        budget_auto_bytes: ctx.pager.budget(),
        budget_auto_source: ctx.pager.budget_source().to_string(),
        upload_chosen_gbps: match kind {
            UploadPath::Pinned => pinned.unwrap_or(ring),
            UploadPath::ZeroCopy => zero_copy.unwrap_or(ring),
            _ => ring,
        },
        writeback_gbps: back,
        upload_ring_vs_write_buffer: ring / wb,
    })
}
