//! Launchers for `shaders/layernorm.wgsl`.

use super::reduce::{column_block_rows, column_blocks, sum_rows};
use super::{grid_1d, row_launch, Kernels, LAYERNORM};
use crate::error::Result;
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        rows: u32,
        c: u32,
        eps: f32,
        block_rows: u32,
    }
}

fn params(rows: usize, c: usize, eps: f32) -> Params {
    Params { rows: rows as u32, c: c as u32, eps, block_rows: 0 }
}

/// out (N,C), mean (N), rstd (N) from x (N,C), weight (C), bias (C).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    k: &Kernels,
    out: &View,
    mean: &View,
    rstd: &View,
    x: &View,
    w: &View,
    b: &View,
    rows: usize,
    c: usize,
    eps: f32,
) -> Result<()> {
    let (entry, grid) = row_launch(rows, c, "layernorm_forward", "layernorm_forward_rows");
    k.dispatch(LAYERNORM, entry, &[out, mean, rstd, x, w, b], &params(rows, c, eps), grid)
}

/// dx (N,C) += ..., and dweight (C), dbias (C) += ... (accumulating). With `partials` (two
/// scratches of `column_blocks(N, C)·C` floats, for dweight and dbias) the parameter sums run
/// in two stages where [`column_blocks`] says so (see there), else a thread per column.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dx: Option<&View>,
    dw: &View,
    db: &View,
    dout: &View,
    x: &View,
    w: &View,
    mean: &View,
    rstd: &View,
    partials: Option<(&View, &View)>,
    rows: usize,
    c: usize,
) -> Result<()> {
    let p = params(rows, c, 0.0);
    if let Some(dx) = dx {
        let (entry, grid) = row_launch(rows, c, "layernorm_backward", "layernorm_backward_rows");
        k.dispatch(LAYERNORM, entry, &[dx, dout, x, w, mean, rstd], &p, grid)?;
    }
    let blocks = column_blocks(rows, c);
    match partials {
        Some((pw, pb)) if blocks > 1 => {
            let stage1 = Params { block_rows: column_block_rows(rows, c) as u32, ..p };
            let grid = [c.div_ceil(256) as u32, blocks as u32, 1];
            k.dispatch(LAYERNORM, "layernorm_backward_param_blocks", &[pw, pb, dout, x, mean, rstd], &stage1, grid)?;
            sum_rows(k, dw, pw, None, blocks, c)?;
            sum_rows(k, db, pb, None, blocks, c)
        }
        _ => k.dispatch(LAYERNORM, "layernorm_backward_params", &[dw, db, dout, x, mean, rstd], &p, grid_1d(c as u64)),
    }
}
