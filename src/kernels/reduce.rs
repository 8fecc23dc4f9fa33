//! Launchers for `shaders/reduce.wgsl`: deterministic two-stage sums and column sums.

use super::{grid_1d, Kernels, REDUCE};
use crate::error::Result;
use crate::pager::View;

#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    squares: u32,
    slot: u32,
    accumulate: u32,
    scale: f32,
    cols: u32,
    _pad: [u32; 2],
}

/// Most partial sums stage one writes; the scratch buffer for `sum` needs this many floats.
pub const MAX_PARTIALS: usize = 1024;

/// What `sum` adds up.
#[derive(Clone, Copy, Debug)]
pub struct SumSpec {
    /// Sum x² instead of x.
    pub squares: bool,
    /// Multiply the total by this (1/n for a mean).
    pub scale: f32,
    /// Element of `out` that receives the total.
    pub slot: usize,
    /// Add to `out[slot]` instead of overwriting it.
    pub accumulate: bool,
}

/// out[slot] (=|+=) scale · Σ x (or Σ x²); x (n), `partials` scratch of MAX_PARTIALS floats.
pub fn sum(k: &Kernels, out: &View, x: &View, partials: &View, n: usize, spec: SumSpec) -> Result<()> {
    let groups = n.div_ceil(256 * 4).clamp(1, MAX_PARTIALS);
    let stage1 = Params { n: n as u32, squares: spec.squares as u32, scale: 1.0, ..Default::default() };
    k.dispatch(REDUCE, "reduce_partials", &[partials, x], &stage1, [groups as u32, 1, 1])?;
    let stage2 = Params {
        n: groups as u32,
        slot: spec.slot as u32,
        accumulate: spec.accumulate as u32,
        scale: spec.scale,
        ..Default::default()
    };
    k.dispatch(REDUCE, "reduce_final", &[out, partials], &stage2, [1, 1, 1])
}

/// out (C) += column sums of x (R,C).
pub fn sum_rows(k: &Kernels, out: &View, x: &View, rows: usize, cols: usize) -> Result<()> {
    let p = Params { n: (rows * cols) as u32, cols: cols as u32, ..Default::default() };
    k.dispatch(REDUCE, "sum_rows", &[out, x], &p, grid_1d(cols as u64))
}
