//! Kernel throughput for `pagetrain bench`: the f32 matmul at 4096³ in the three layouts the
//! training step uses (NN forward, NT and TN in backward), timed over back-to-back dispatches
//! between two syncs, so launch gaps count against us as they would in a step.

use std::time::Instant;

use crate::context::Context;
use crate::error::Result;
use crate::kernels::matmul::{self, Gemm};
use crate::kernels::MatmulVariant;
use crate::pager::View;
use crate::tensor::DType;

/// TFLOP/s of the f32 matmul kernels.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MatmulReport {
    /// C = A·B, all 4096 × 4096 (the headline figure).
    pub matmul_f32_4096_tflops: f64,
    /// C = A·Bᵀ (input gradients of a Linear).
    pub matmul_f32_4096_nt_tflops: f64,
    /// C = Aᵀ·B (weight gradients of a Linear).
    pub matmul_f32_4096_tn_tflops: f64,
}

fn buffer(ctx: &Context, n: usize, seed: u32) -> View {
    let data: Vec<f32> =
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 20) as f32 / 4096.0 - 0.5).collect();
    let buffer = ctx.gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("matmul bench"),
        size: (n * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.gpu.queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&data));
    View { buffer, offset: 0, size: (n * 4) as u64, dtype: DType::F32 }
}

/// Best of `repeats` timings of `iters` products `g` back to back, in TFLOP/s, by the variant
/// the adapter's tuning picks or by `variant`.
pub fn time_matmul(
    ctx: &Context,
    g: Gemm,
    variant: Option<MatmulVariant>,
    iters: usize,
    repeats: usize,
) -> Result<f64> {
    let variant = variant.unwrap_or_else(|| matmul::pick(ctx.kernels.tuning.matmul, &g));
    let (a, b, c) =
        (buffer(ctx, g.batch * g.m * g.k, 1), buffer(ctx, g.batch * g.k * g.n, 2), buffer(ctx, g.batch * g.m * g.n, 3));
    let dummy = buffer(ctx, 4, 4);
    matmul::matmul_variant(&ctx.kernels, variant, &c, &a, &b, None, &dummy, g)?;
    ctx.sync()?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        for _ in 0..iters.max(1) {
            matmul::matmul_variant(&ctx.kernels, variant, &c, &a, &b, None, &dummy, g)?;
        }
        ctx.sync()?;
        best = best.min(start.elapsed().as_secs_f64() / iters.max(1) as f64);
    }
    Ok(2.0 * (g.batch * g.m * g.n * g.k) as f64 / best / 1e12)
}

/// The 4096³ products in NN, NT and TN layouts, `iters` dispatches each, best of `repeats`.
pub fn matmuls(ctx: &Context, iters: usize, repeats: usize) -> Result<MatmulReport> {
    let n = 4096;
    let g = Gemm::new(n, n, n);
    Ok(MatmulReport {
        matmul_f32_4096_tflops: time_matmul(ctx, g, None, iters, repeats)?,
        matmul_f32_4096_nt_tflops: time_matmul(ctx, Gemm { trans_b: true, ..g }, None, iters, repeats)?,
        matmul_f32_4096_tn_tflops: time_matmul(ctx, Gemm { trans_a: true, ..g }, None, iters, repeats)?,
    })
}
