//! `pagetrain tune`: times each kernel family this adapter can run on a training step's shapes
//! and chooses the fastest per choice ([`crate::kernels::tuned`] keeps the result on disk).
//!
//! The choices are the per-adapter ones of [`crate::kernels::Tuning`]: the matmul family (the
//! products of a Linear forward and its two gradients, NN, NT and TN, timed together), and at
//! each of [`HEAD_SIZES`] the attention forward's kernels and the attention backward's. Shapes
//! are those of a GPT step, smaller on CPU adapters so the whole tune stays short (16 s on
//! lavapipe). A candidate is timed once to compile it, then the best of `repeats` timings of
//! `iters` back-to-back calls between two syncs; one already 4× slower than the best so far is
//! not repeated.

use super::kernels::{best_seconds, time_matmul, AttentionBuffers};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::attention::{self, Dims, Kernel};
use crate::kernels::matmul::Gemm;
use crate::kernels::tuned::{AttentionChoice, AttentionKind, MatmulFamily, Tuned};
use crate::tensor::DType;

/// One candidate's time.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Measured {
    /// `matmul`, or `attention forward` / `attention backward` and the head size.
    pub choice: String,
    pub candidate: String,
    /// Milliseconds per call (the matmul: the three layouts together).
    pub ms: f64,
}

/// What the tune measured and chose.
#[derive(Clone, Debug)]
pub struct Autotuned {
    pub tuned: Tuned,
    pub measured: Vec<Measured>,
    /// The shapes, for the report: "M×N×K" of the products and "B×T, H heads of D" of attention.
    pub shapes: String,
}

/// How hard to measure: calls per timing and timings per candidate.
#[derive(Clone, Copy, Debug)]
pub struct Effort {
    pub iters: usize,
    pub repeats: usize,
}

impl Default for Effort {
    fn default() -> Self {
        Effort { iters: 3, repeats: 3 }
    }
}

/// Times every candidate on this context's adapter and chooses the fastest of each.
pub fn autotune(ctx: &Context, effort: Effort) -> Result<Autotuned> {
    let cpu = ctx.gpu.info.device_type == wgpu::DeviceType::Cpu;
    // A GPT-2 small Linear on 4096 tokens; on a CPU adapter a 256-wide one on 1024.
    let (tokens, width) = if cpu { (1024, 256) } else { (4096, 768) };
    // Attention on 16 × 128 tokens, 4 heads, on a CPU adapter (the `small` preset); on GPT-2
    // small's 8 × 1024, 12 heads, elsewhere.
    let (b, t, h) = if cpu { (16, 128, 4) } else { (8, 1024, 12) };
    let mut measured = Vec::new();

    let g = Gemm::new(tokens, width, width);
    let layouts = [g, Gemm { trans_b: true, ..g }, Gemm { trans_a: true, m: width, k: tokens, ..g }];
    let families: Vec<MatmulFamily> = MatmulFamily::ALL.into_iter().filter(|f| f.runs_on(&ctx.gpu)).collect();
    let mut timed = Vec::new();
    for family in families {
        let mut ms = 0.0;
        for g in layouts {
            let effort = if ms > 4.0 * best(&timed) { Effort { iters: 1, repeats: 1 } } else { effort };
            let tflops = time_matmul(ctx, g, Some(family.variant()), DType::F32, effort.iters, effort.repeats)?;
            ms += 2.0 * (g.m * g.n * g.k) as f64 / tflops / 1e9;
        }
        timed.push((family, ms));
        measured.push(Measured { choice: "matmul".into(), candidate: format!("{family:?}").to_lowercase(), ms });
    }
    let matmul = fastest(&timed, "matmul")?;

    let mut attention = Vec::new();
    for d in HEAD_SIZES {
        let dims = Dims { b, t, h, d, scale: 1.0 / (d as f32).sqrt() };
        let forward = measure_attention(ctx, dims, false, effort, &mut measured)?;
        let backward = measure_attention(ctx, dims, true, effort, &mut measured)?;
        attention.push(AttentionChoice { head_size: d as u32, forward, backward });
    }
    Ok(Autotuned {
        tuned: Tuned::new(&ctx.gpu, matmul, attention),
        measured,
        shapes: format!(
            "products {tokens}×{width}×{width} (NN, NT) and {width}×{width}×{tokens} (TN); attention {b}×{t}, {h} heads of {HEAD_SIZES:?}"
        ),
    })
}

/// The head sizes attention is tuned at: the presets' (`small`: 32; GPT-2's: 64). Kernels rank
/// differently by head size (lavapipe: 2 lanes a row win at 64 and lose at 32).
pub const HEAD_SIZES: [usize; 2] = [32, 64];

/// The least time of `timed`.
fn best<T>(timed: &[(T, f64)]) -> f64 {
    timed.iter().map(|t| t.1).fold(f64::INFINITY, f64::min)
}

/// The candidate of `timed` with the least time (`choice` names it in the error where none ran).
fn fastest<T: Copy>(timed: &[(T, f64)], choice: &str) -> Result<T> {
    let least = timed.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    least.map(|t| t.0).ok_or_else(|| Error::invalid("pagetrain tune", format!("no candidate for {choice} ran")))
}

/// The kernel `kind` runs at head size `d` (as `attention::pick` would choose it), if it fits.
fn kernel_of(ctx: &Context, kind: AttentionKind, d: usize, backward: bool) -> Option<Kernel> {
    let blocked = |preferred| attention::blocked_tile(&ctx.kernels, d, backward, preferred);
    match kind {
        AttentionKind::Rows => Some(Kernel::Rows),
        AttentionKind::Blocked => blocked(None).map(|tile| Kernel::Blocked { tile }),
        AttentionKind::Blocked16 => blocked(Some(16)).filter(|&t| t == 16).map(|tile| Kernel::Blocked { tile }),
        lanes => Some(Kernel::Lanes { lanes: lanes.lanes() }),
    }
}

/// Times each attention kernel for one pass on `dims` (f32) and returns the fastest.
fn measure_attention(
    ctx: &Context,
    dims: Dims,
    backward: bool,
    effort: Effort,
    measured: &mut Vec<Measured>,
) -> Result<AttentionKind> {
    let (d, x) = (dims.d, AttentionBuffers::new(ctx, dims, DType::F32));
    // (a forward first: the backward reads its output and log-sum-exps)
    attention::forward_with(&ctx.kernels, Kernel::Rows, &x.out, &x.lse, &x.qkv, dims)?;
    let choice = format!("attention {} d={d}", if backward { "backward" } else { "forward" });
    let mut timed = Vec::new();
    for kind in AttentionKind::candidates(&ctx.gpu, backward) {
        let Some(kernel) = kernel_of(ctx, kind, d, backward) else { continue };
        let call = || match backward {
            true => attention::backward_with(
                &ctx.kernels,
                kernel,
                &x.dqkv,
                &x.delta,
                &x.qkv,
                &x.out,
                &x.dout,
                &x.lse,
                dims,
                true,
            ),
            false => attention::forward_with(&ctx.kernels, kernel, &x.out, &x.lse, &x.qkv, dims),
        };
        // (one already 4× the best so far is not timed again)
        let slow = |s: f64| s * 1e3 > 4.0 * best(&timed);
        let ms = best_seconds(ctx, effort.iters, effort.repeats, &call, &slow)? * 1e3;
        timed.push((kind, ms));
        measured.push(Measured { choice: choice.clone(), candidate: format!("{kind:?}").to_lowercase(), ms });
    }
    fastest(&timed, &choice)
}
