//! Launchers for `shaders/reduce.wgsl`: deterministic two-stage sums and column sums.

use super::{grid_1d, Kernels, MAX_GROUPS, REDUCE};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        n: u32,
        squares: u32,
        slot: u32,
        accumulate: u32,
        scale: f32,
        cols: u32,
        block_rows: u32,
        _pad: u32,
    }
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

/// Longest x `sum` reduces in one workgroup, skipping the partials (a dispatch saved per small
/// tensor: the gradient norm sums one per parameter, and half of GPT-2's are biases and gains).
pub const ONE_STAGE: usize = 16384;

/// out[slot] (=|+=) scale · Σ x (or Σ x²); x (n), `partials` scratch of MAX_PARTIALS floats.
pub fn sum(k: &Kernels, out: &View, x: &View, partials: &View, n: usize, spec: SumSpec) -> Result<()> {
    if n <= ONE_STAGE {
        let p = Params {
            n: n as u32,
            squares: spec.squares as u32,
            slot: spec.slot as u32,
            accumulate: spec.accumulate as u32,
            scale: spec.scale,
            ..Default::default()
        };
        return k.dispatch(REDUCE, "reduce_final", &[out, x], &p, [1, 1, 1]);
    }
    let groups = partial_sums(k, partials, x, n, spec.squares)?;
    let stage2 = Params {
        n: groups as u32,
        slot: spec.slot as u32,
        accumulate: spec.accumulate as u32,
        scale: spec.scale,
        ..Default::default()
    };
    k.dispatch(REDUCE, "reduce_final", &[out, partials], &stage2, [1, 1, 1])
}

/// Partial sums stage one of [`sum`] writes for `n` elements: ⌈n / 1024⌉, 1 to MAX_PARTIALS.
pub fn partial_groups(n: usize) -> usize {
    n.div_ceil(256 * 4).clamp(1, MAX_PARTIALS)
}

/// Stage one of [`sum`] alone: out[g] = Σ x (or x²) over workgroup g's grid-stride slice, for
/// g < [`partial_groups`]`(n)`; returns that count.
pub fn partial_sums(k: &Kernels, out: &View, x: &View, n: usize, squares: bool) -> Result<usize> {
    let groups = partial_groups(n);
    let p = Params { n: n as u32, squares: squares as u32, scale: 1.0, ..Default::default() };
    k.dispatch(REDUCE, "reduce_partials", &[out, x], &p, [groups as u32, 1, 1])?;
    Ok(groups)
}

/// out[j] = Σ x[j·len .. (j + 1)·len] for j < regions: a workgroup a region.
pub fn region_sums(k: &Kernels, out: &View, x: &View, regions: usize, len: usize) -> Result<()> {
    if regions > MAX_GROUPS as usize {
        return Err(Error::invalid("region_sums", format!("{regions} regions is more than one dispatch covers")));
    }
    let p = Params { n: len as u32, ..Default::default() };
    k.dispatch(REDUCE, "region_sums", &[out, x], &p, [regions as u32, 1, 1])
}

/// Fewest rows a column sum splits into blocks.
pub const TWO_STAGE_ROWS: usize = 1024;

/// Columns one workgroup of `column_sums` and `column_block_sums` covers.
const GROUP_COLUMNS: usize = 64;

/// From this many columns a thread per column (`sum_rows`) fills the GPU by itself: split-K's
/// partial products (m·n columns, a few rows).
const WIDE_COLUMNS: usize = 16384;

/// Row blocks of a column sum over (rows, cols) done in two stages: with few columns (768 for
/// GPT-2's biases) one stage leaves a GPU idle, so blocks of rows are summed side by side first
/// (~2048 workgroups in all), then the block sums. 1: one stage, also under TWO_STAGE_ROWS rows,
/// where the walk is short and a second dispatch costs more. Blocks and their order depend on
/// the shape only, so results are deterministic.
pub fn column_blocks(rows: usize, cols: usize) -> usize {
    let col_groups = cols.div_ceil(GROUP_COLUMNS).max(1);
    if cols >= WIDE_COLUMNS || rows < TWO_STAGE_ROWS {
        return 1;
    }
    let block_rows = rows.div_ceil((2048 / col_groups).clamp(1, rows.div_ceil(32)));
    rows.div_ceil(block_rows)
}

/// Rows in each of the `column_blocks(rows, cols)` blocks.
pub fn column_block_rows(rows: usize, cols: usize) -> usize {
    rows.div_ceil(column_blocks(rows, cols))
}

/// out (C) += column sums of x (R,C). With `partials` (scratch of `column_blocks(R, C)·C`
/// floats) in two stages when [`column_blocks`] says so.
pub fn sum_rows(k: &Kernels, out: &View, x: &View, partials: Option<&View>, rows: usize, cols: usize) -> Result<()> {
    let p = Params { n: (rows * cols) as u32, cols: cols as u32, ..Default::default() };
    if cols >= WIDE_COLUMNS {
        return k.dispatch(REDUCE, "sum_rows", &[out, x], &p, grid_1d(cols as u64));
    }
    let groups = cols.div_ceil(GROUP_COLUMNS) as u32;
    let blocks = column_blocks(rows, cols);
    match partials {
        Some(parts) if blocks > 1 => {
            let stage1 = Params { block_rows: column_block_rows(rows, cols) as u32, ..p };
            k.dispatch(REDUCE, "column_block_sums", &[parts, x], &stage1, [groups, blocks as u32, 1])?;
            let stage2 = Params { n: (blocks * cols) as u32, ..p };
            k.dispatch(REDUCE, "column_sums", &[out, parts], &stage2, [groups, 1, 1])
        }
        _ => k.dispatch(REDUCE, "column_sums", &[out, x], &p, [groups, 1, 1]),
    }
}
