//! Transfer benchmarks shared by `pagetrain bench` and `benches/`: the pager's staging ring
//! against `queue.write_buffer` (the peer, measured in the same run) for uploads, and the
//! readback ring for write-backs. Bandwidths are bytes of tensor data per second, end to end:
//! from host memory until the GPU has them (or back into the host store).

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

/// Uploads every tensor through the pager's staging ring and waits until the GPU has them.
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
    pub upload_write_buffer_gbps: f64,
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
    let ring = best(&mut || upload_ring(ctx, &tensors))?;
    let wb = best(&mut || upload_write_buffer(ctx, count, bytes))?;
    let back = best(&mut || writeback(ctx, &tensors))?;
    Ok(TransferReport {
        adapter: ctx.gpu.describe(),
        tensor_bytes: bytes as u64,
        tensors: count,
        upload_ring_gbps: ring,
        upload_write_buffer_gbps: wb,
        writeback_gbps: back,
        upload_ring_vs_write_buffer: ring / wb,
    })
}
