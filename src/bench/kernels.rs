//! Kernel throughput for `pagetrain bench`: the f32 and f16 matmuls at 4096³ in the three layouts
//! the training step uses (NN forward, NT and TN in backward), timed over back-to-back dispatches
//! between two syncs, so launch gaps count against us as they would in a step. f16 products run
//! on cooperative matrices where the adapter has them; fused attention on GPT-2 small's shape.

use std::time::Instant;

use crate::context::Context;
use crate::error::Result;
use crate::kernels::attention;
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
    /// f16 A and B, f32 C (what `--precision f16` runs), A·B, A·Bᵀ and Aᵀ·B; absent without
    /// shader-f16.
    pub matmul_f16_4096_tflops: Option<f64>,
    pub matmul_f16_4096_nt_tflops: Option<f64>,
    pub matmul_f16_4096_tn_tflops: Option<f64>,
    /// The kernel the f16 products ran on (`Coop`: cooperative matrices).
    pub matmul_f16_kernel: Option<String>,
    /// Fused causal attention on GPT-2 small's shape (8 × 1024, 12 heads of 64), f32: the
    /// useful FLOPs (the causal half of QKᵀ and P·V, 2·B·H·T²·D) per second, forward and
    /// backward (5 products of the same size: 2.5× the forward's FLOPs).
    pub attention_tflops: f64,
    pub attention_backward_tflops: f64,
    /// The same with f16 qkv, out and gradients (what `--precision f16` runs); absent without
    /// shader-f16.
    pub attention_f16_tflops: Option<f64>,
    pub attention_f16_backward_tflops: Option<f64>,
    /// The kernels attention ran on at head size 64 (`attention::kernel_for`), forward and
    /// backward, in f32 and (with shader-f16) in f16.
    pub attention_kernel: String,
    pub attention_backward_kernel: String,
    pub attention_f16_kernel: Option<String>,
    pub attention_f16_backward_kernel: Option<String>,
}

/// (forward, backward) TFLOP/s of fused attention at B=8, T=1024, H=12, D=64 with qkv, out and
/// their gradients as `dtype` (see the report).
pub fn attention(ctx: &Context, dtype: DType, iters: usize, repeats: usize) -> Result<(f64, f64)> {
    let (b, t, h, d) = (8, 1024, 12, 64);
    let dims = attention::Dims { b, t, h, d, scale: 0.125 };
    let x = AttentionBuffers::new(ctx, dims, dtype);
    let flop = 2.0 * (b * h * t * t * d) as f64;
    let fwd =
        best_seconds(ctx, iters, repeats, &|| attention::forward(&ctx.kernels, &x.out, &x.lse, &x.qkv, dims), &|_| {
            false
        })?;
    let backward = || attention::backward(&ctx.kernels, &x.dqkv, &x.delta, &x.qkv, &x.out, &x.dout, &x.lse, dims, true);
    let bwd = best_seconds(ctx, iters, repeats, &backward, &|_| false)?;
    Ok((flop / fwd / 1e12, 2.5 * flop / bwd / 1e12))
}

/// What one attention call on `dims` reads and writes: qkv, out and their gradients as `dtype`
/// (deterministic values), the log-sum-exps and deltas f32.
pub struct AttentionBuffers {
    pub qkv: View,
    pub out: View,
    pub dout: View,
    pub dqkv: View,
    pub lse: View,
    pub delta: View,
}

impl AttentionBuffers {
    pub fn new(ctx: &Context, dims: attention::Dims, dtype: DType) -> AttentionBuffers {
        let attention::Dims { b, t, h, d, .. } = dims;
        let (rows, f32s) = (b * t * h * d, |n, seed| buffer(ctx, n, seed, DType::F32));
        AttentionBuffers {
            qkv: buffer(ctx, 3 * rows, 1, dtype),
            out: buffer(ctx, rows, 2, dtype),
            dout: buffer(ctx, rows, 3, dtype),
            dqkv: buffer(ctx, 3 * rows, 4, dtype),
            lse: f32s(b * h * t, 5),
            delta: f32s(b * h * t, 6),
        }
    }
}

/// Seconds a call of `f` takes: one untimed call first (its compile), then the best of `repeats`
/// timings of `iters` calls back to back between two syncs, so launch gaps count as they would
/// in a step. Stops repeating once `enough(best so far)` says so.
pub fn best_seconds(
    ctx: &Context,
    iters: usize,
    repeats: usize,
    f: &dyn Fn() -> Result<()>,
    enough: &dyn Fn(f64) -> bool,
) -> Result<f64> {
    f()?;
    ctx.sync()?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        for _ in 0..iters.max(1) {
            f()?;
        }
        ctx.sync()?;
        best = best.min(start.elapsed().as_secs_f64() / iters.max(1) as f64);
        if enough(best) {
            break;
        }
    }
    Ok(best)
}

/// A storage buffer of `n` deterministic values in [-0.5, 0.5) as `dtype` (f32 or f16).
pub fn buffer(ctx: &Context, n: usize, seed: u32, dtype: DType) -> View {
    let data: Vec<f32> =
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 20) as f32 / 4096.0 - 0.5).collect();
    let bytes: Vec<u8> = match dtype {
        DType::F16 => data.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        _ => bytemuck::cast_slice(&data).to_vec(),
    };
    let size = (bytes.len() as u64).div_ceil(16) * 16;
    let buffer = ctx.gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("matmul bench"),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.gpu.queue.write_buffer(&buffer, 0, &bytes);
    View { buffer, offset: 0, size, dtype }
}

/// Best of `repeats` timings of `iters` products `g` back to back, in TFLOP/s, by the variant
/// the adapter's tuning picks or by `variant`. A and B hold `operands` (f32 or f16), C f32.
pub fn time_matmul(
    ctx: &Context,
    g: Gemm,
    variant: Option<MatmulVariant>,
    operands: DType,
    iters: usize,
    repeats: usize,
) -> Result<f64> {
    let (a, b, c) = (
        buffer(ctx, g.batch * g.m * g.k, 1, operands),
        buffer(ctx, g.batch * g.k * g.n, 2, operands),
        buffer(ctx, g.batch * g.m * g.n, 3, DType::F32),
    );
    let variant = variant.unwrap_or_else(|| picked(ctx, &g, operands));
    let dummy = buffer(ctx, 4, 4, DType::F32);
    let product = || matmul::matmul_variant(&ctx.kernels, variant, &c, &a, &b, None, &dummy, g);
    let best = best_seconds(ctx, iters, repeats, &product, &|_| false)?;
    Ok(2.0 * (g.batch * g.m * g.n * g.k) as f64 / best / 1e12)
}

/// The variant `matmul` picks for `g` with A and B in `operands`.
pub fn picked(ctx: &Context, g: &Gemm, operands: DType) -> MatmulVariant {
    let variant = matmul::pick(ctx.kernels.tuning.matmul, g);
    if operands == DType::F16 && ctx.kernels.tuning.coop_f16 && variant != MatmulVariant::Direct {
        // (what matmul::for_operands picks for two f16 views)
        MatmulVariant::Coop
    } else {
        variant
    }
}

/// The 4096³ products in NN, NT and TN layouts, `iters` dispatches each, best of `repeats`; in
/// f16 too where the adapter has shader-f16.
pub fn matmuls(ctx: &Context, iters: usize, repeats: usize) -> Result<MatmulReport> {
    let n = 4096;
    let g = Gemm::new(n, n, n);
    let layouts = [g, Gemm { trans_b: true, ..g }, Gemm { trans_a: true, ..g }];
    let mut f32s = [0.0; 3];
    for (t, g) in f32s.iter_mut().zip(layouts) {
        *t = time_matmul(ctx, g, None, DType::F32, iters, repeats)?;
    }
    let mut f16s = [None; 3];
    let has_f16 = ctx.gpu.features.contains(wgpu::Features::SHADER_F16);
    if has_f16 {
        for (t, g) in f16s.iter_mut().zip(layouts) {
            *t = Some(time_matmul(ctx, g, None, DType::F16, iters, repeats)?);
        }
    }
    let (attention_tflops, attention_backward_tflops) = attention(ctx, DType::F32, iters / 4, repeats)?;
    let f16_attention = if has_f16 { Some(attention(ctx, DType::F16, iters / 4, repeats)?) } else { None };
    Ok(MatmulReport {
        attention_tflops,
        attention_backward_tflops,
        attention_f16_tflops: f16_attention.map(|a| a.0),
        attention_f16_backward_tflops: f16_attention.map(|a| a.1),
        attention_kernel: format!("{:?}", attention::kernel_for(&ctx.kernels, DType::F32, 64, false)),
        attention_backward_kernel: format!("{:?}", attention::kernel_for(&ctx.kernels, DType::F32, 64, true)),
        attention_f16_kernel: has_f16
            .then(|| format!("{:?}", attention::kernel_for(&ctx.kernels, DType::F16, 64, false))),
        attention_f16_backward_kernel: has_f16
            .then(|| format!("{:?}", attention::kernel_for(&ctx.kernels, DType::F16, 64, true))),
        matmul_f32_4096_tflops: f32s[0],
        matmul_f32_4096_nt_tflops: f32s[1],
        matmul_f32_4096_tn_tflops: f32s[2],
        matmul_f16_4096_tflops: f16s[0],
        matmul_f16_4096_nt_tflops: f16s[1],
        matmul_f16_4096_tn_tflops: f16s[2],
        matmul_f16_kernel: has_f16.then(|| format!("{:?}", picked(ctx, &g, DType::F16))),
    })
}
