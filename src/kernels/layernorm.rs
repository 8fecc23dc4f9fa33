//! Launchers for `shaders/layernorm.wgsl`.

use super::{grid_1d, row_launch, Kernels, LAYERNORM};
use crate::error::Result;
use crate::pager::View;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    c: u32,
    eps: f32,
    _pad: u32,
}

fn params(rows: usize, c: usize, eps: f32) -> Params {
    Params { rows: rows as u32, c: c as u32, eps, _pad: 0 }
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

/// dx (N,C) += ..., and dweight (C), dbias (C) += ... (accumulating).
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
    rows: usize,
    c: usize,
) -> Result<()> {
    let p = params(rows, c, 0.0);
    if let Some(dx) = dx {
        let (entry, grid) = row_launch(rows, c, "layernorm_backward", "layernorm_backward_rows");
        k.dispatch(LAYERNORM, entry, &[dx, dout, x, w, mean, rstd], &p, grid)?;
    }
    k.dispatch(LAYERNORM, "layernorm_backward_params", &[dw, db, dout, x, mean, rstd], &p, grid_1d(c as u64))
}
