//! Launchers for `shaders/softmax.wgsl`: row softmax, optionally causal and scaled.

use super::{row_launch, Kernels, SOFTMAX};
use crate::error::Result;
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        rows: u32,
        len: u32,
        causal_t: u32,
        scale: f32,
    }
}

/// y (R,L) = softmax(scale·x) per row; `causal_t > 0` masks j > (row % causal_t).
pub fn forward(k: &Kernels, y: &View, x: &View, rows: usize, len: usize, causal_t: usize, scale: f32) -> Result<()> {
    let p = Params { rows: rows as u32, len: len as u32, causal_t: causal_t as u32, scale };
    let (entry, grid) = row_launch(rows, len, "softmax_forward", "softmax_forward_rows");
    k.dispatch(SOFTMAX, entry, &[y, x], &p, grid)
}

/// dx (R,L) += scale · y ⊙ (dy − rowsum(dy ⊙ y)).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dx: &View,
    y: &View,
    dy: &View,
    rows: usize,
    len: usize,
    causal_t: usize,
    scale: f32,
) -> Result<()> {
    let p = Params { rows: rows as u32, len: len as u32, causal_t: causal_t as u32, scale };
    let (entry, grid) = row_launch(rows, len, "softmax_backward", "softmax_backward_rows");
    k.dispatch(SOFTMAX, entry, &[dx, y, dy], &p, grid)
}
