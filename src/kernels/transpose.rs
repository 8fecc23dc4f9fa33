//! Launcher for `shaders/transpose.wgsl`: a row-major matrix transposed, f32 or f16 either side.

use super::{Kernels, TRANSPOSE};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        rows: u32,
        cols: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// `out` (cols, rows) = `x` (rows, cols) transposed.
pub fn transpose(k: &Kernels, out: &View, x: &View, rows: usize, cols: usize) -> Result<()> {
    let groups = [cols.div_ceil(32), rows.div_ceil(32)];
    if groups.iter().any(|&g| g > super::MAX_GROUPS as usize) || rows * cols > u32::MAX as usize {
        return Err(Error::invalid("transpose", format!("{rows}x{cols} is more than one dispatch covers")));
    }
    let p = Params { rows: rows as u32, cols: cols as u32, ..Default::default() };
    k.dispatch(TRANSPOSE, "transpose", &[out, x], &p, [groups[0] as u32, groups[1] as u32, 1])
}
