//! Launchers for `shaders/cross_entropy.wgsl`: fused softmax cross-entropy.

use super::{grid_1d, row_launch, Kernels, CROSS_ENTROPY};
use crate::error::Result;
use crate::pager::View;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    v: u32,
    ignore: u32,
    inv_count: f32,
}

/// losses (N), lse (N) from logits (N,V) and targets (N); rows with target `ignore` give 0.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    k: &Kernels,
    losses: &View,
    lse: &View,
    logits: &View,
    targets: &View,
    rows: usize,
    v: usize,
    ignore: u32,
) -> Result<()> {
    let p = Params {
        rows: rows as u32,
        v: v as u32,
        ignore,
        inv_count: 0.0,
    };
    let (entry, grid) = row_launch(
        rows,
        v,
        "cross_entropy_forward",
        "cross_entropy_forward_rows",
    );
    k.dispatch(
        CROSS_ENTROPY,
        entry,
        &[losses, lse, logits, targets],
        &p,
        grid,
    )
}

/// dlogits (N,V) += dloss[0] · inv_count · (softmax − onehot).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dlogits: &View,
    logits: &View,
    targets: &View,
    lse: &View,
    dloss: &View,
    rows: usize,
    v: usize,
    ignore: u32,
    inv_count: f32,
) -> Result<()> {
    let p = Params {
        rows: rows as u32,
        v: v as u32,
        ignore,
        inv_count,
    };
    k.dispatch(
        CROSS_ENTROPY,
        "cross_entropy_backward",
        &[dlogits, logits, targets, lse, dloss],
        &p,
        grid_1d((rows * v) as u64),
    )
}
