//! Launcher for `shaders/sumsq.wgsl`: sums of squares of up to [`TENSORS`] tensors per dispatch
//! (the gradient norm's first stage).

use super::reduce::ONE_STAGE;
use super::{Kernels, SUMSQ};
use crate::error::{Error, Result};
use crate::pager::View;
use crate::tensor::DType;

gpu_params! {
    pub(super) struct Params {
        /// n[j / 4][j % 4]: elements of tensor j
        n: [u32; 8] as "array<vec4<u32>, 2>",
        /// slot[j / 4][j % 4]: where `sumsq_slots` writes tensor j's sum
        slot: [u32; 8] as "array<vec4<u32>, 2>",
        base: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Tensors one dispatch reads (its storage bindings are these and the output: WebGPU's default
/// limit of 8 per stage).
pub const TENSORS: usize = 7;

/// Storage buffers per stage a `sumsq_multi` or `sumsq_slots` dispatch needs.
pub const STORAGE_BINDINGS: u32 = TENSORS as u32 + 1;

/// Whether an adapter with `limits` binds enough storage buffers for these kernels (else sums
/// of squares take a dispatch or two per tensor through `reduce::sum`).
pub fn available(limits: &wgpu::Limits) -> bool {
    limits.max_storage_buffers_per_shader_stage >= STORAGE_BINDINGS
}

/// Workgroups per tensor for a group whose largest tensor has `max_n` elements: about 4096
/// elements each, at most 256 (so a big gradient still fills the GPU).
pub fn blocks_for(max_n: usize) -> usize {
    max_n.div_ceil(4096).clamp(1, 256)
}

/// Consecutive groups of the tensors with element counts `lens` for one dispatch each: at most
/// [`TENSORS`], and together at most `max_bytes` of f32 (they are on the GPU at once, under the
/// pager's budget) unless alone.
pub fn groups(lens: &[usize], max_bytes: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, &n) in lens.iter().enumerate() {
        let b = n as u64 * 4;
        if i > start && (i - start == TENSORS || bytes + b > max_bytes) {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    if start < lens.len() {
        out.push(start..lens.len());
    }
    out
}

/// Partial sums `sumsq_multi` writes for the tensors of `lens` in `groups`.
pub fn partials_for(lens: &[usize], groups: &[std::ops::Range<usize>]) -> usize {
    groups.iter().map(|g| g.len() * blocks_for(lens[g.clone()].iter().copied().max().unwrap_or(0))).sum()
}

/// out[base + j·blocks + g] = Σ x_j² over workgroup g's slice, for each of `xs` (at most
/// [`TENSORS`], f32, with their element counts); blocks = [`blocks_for`] of the largest.
/// Returns the partial sums written (`xs.len() · blocks`).
pub fn sumsq_multi(k: &Kernels, out: &View, xs: &[(&View, usize)], base: usize) -> Result<usize> {
    check(xs)?;
    let blocks = blocks_for(xs.iter().map(|x| x.1).max().unwrap_or(0));
    let mut p = Params { base: base as u32, ..Default::default() };
    for (j, (_, n)) in xs.iter().enumerate() {
        p.n[j] = *n as u32;
    }
    k.dispatch(SUMSQ, "sumsq_multi", &bindings(out, xs), &p, [blocks as u32, xs.len() as u32, 1])?;
    Ok(xs.len() * blocks)
}

/// out[slot] = Σ x² for each (x, n, slot) of `xs` (at most [`TENSORS`], f32, n ≤
/// [`ONE_STAGE`]: one workgroup walks each).
pub fn sumsq_slots(k: &Kernels, out: &View, xs: &[(&View, usize, usize)]) -> Result<()> {
    let plain: Vec<(&View, usize)> = xs.iter().map(|&(v, n, _)| (v, n)).collect();
    check(&plain)?;
    if let Some((_, n, _)) = xs.iter().find(|x| x.1 > ONE_STAGE) {
        return Err(Error::invalid("sumsq_slots", format!("takes tensors of at most {ONE_STAGE} elements, got {n}")));
    }
    let mut p = Params::default();
    for (j, &(_, n, slot)) in xs.iter().enumerate() {
        (p.n[j], p.slot[j]) = (n as u32, slot as u32);
    }
    k.dispatch(SUMSQ, "sumsq_slots", &bindings(out, &plain), &p, [xs.len() as u32, 1, 1])
}

/// 1 to [`TENSORS`] f32 tensors, or an error naming what is wrong.
fn check(xs: &[(&View, usize)]) -> Result<()> {
    if xs.is_empty() || xs.len() > TENSORS {
        return Err(Error::invalid("sumsq", format!("takes 1 to {TENSORS} tensors, got {}", xs.len())));
    }
    if let Some((v, _)) = xs.iter().find(|(v, _)| v.dtype != DType::F32) {
        return Err(Error::invalid("sumsq", format!("reads f32 tensors, got {:?}", v.dtype)));
    }
    Ok(())
}

/// The output, then the tensors; bindings past the tensors given repeat the first (read by no
/// workgroup).
fn bindings<'a>(out: &'a View, xs: &[(&'a View, usize)]) -> Vec<&'a View> {
    let mut buffers = vec![out];
    buffers.extend((0..TENSORS).map(|j| xs.get(j).unwrap_or(&xs[0]).0));
    buffers
}
