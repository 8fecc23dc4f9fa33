//! Launcher for `shaders/transpose.wgsl`: a row-major matrix transposed, f32 or f16 either side.

use super::{Kernels, TRANSPOSE};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        rows: u32,
        cols: u32,
        out_stride: u32,
        _pad0: u32,
    }
}

/// `out` (cols, rows) = `x` (rows, cols) transposed.
pub fn transpose(k: &Kernels, out: &View, x: &View, rows: usize, cols: usize) -> Result<()> {
    transpose_padded(k, out, x, rows, cols, rows)
}

/// [`transpose`] into rows of `out_stride` (>= rows) elements, the padding zeroed: a copy that
/// cooperative-matrix products read 8 halves at a time where `rows` is no multiple of 8.
pub fn transpose_padded(k: &Kernels, out: &View, x: &View, rows: usize, cols: usize, out_stride: usize) -> Result<()> {
    let groups = [cols.div_ceil(32), out_stride.div_ceil(32)];
    if groups.iter().any(|&g| g > super::MAX_GROUPS as usize) || cols * out_stride > u32::MAX as usize {
        return Err(Error::invalid("transpose", format!("{rows}x{cols} is more than one dispatch covers")));
    }
    if out_stride < rows || (rows == 0 && out_stride > 0) {
        return Err(Error::invalid("transpose", format!("rows of {out_stride} cannot hold {rows}")));
    }
    let p = Params { rows: rows as u32, cols: cols as u32, out_stride: out_stride as u32, ..Default::default() };
    k.dispatch(TRANSPOSE, "transpose", &[out, x], &p, [groups[0] as u32, groups[1] as u32, 1])
}
