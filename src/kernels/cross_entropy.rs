//! Launchers for `shaders/cross_entropy.wgsl`: fused softmax cross-entropy.

use super::{grid_1d, row_launch, Kernels, CROSS_ENTROPY, PER_THREAD, WG};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        rows: u32,
        v: u32,
        ignore: u32,
        inv_count: f32,
        row0: u32,
        accumulate: u32,
        /// backward: elements a row of dlogits holds (0: v)
        stride: u32,
        _pad: u32,
    }
}

/// Which rows a launch covers: `rows` rows of `v` classes held in the logits it is given, which
/// are rows `row0..row0 + rows` of the targets, losses and lse. Targets equal to `ignore` count
/// for nothing.
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    pub rows: usize,
    pub v: usize,
    pub ignore: u32,
    pub row0: usize,
}

fn params(r: Rows, inv_count: f32) -> Params {
    Params {
        rows: r.rows as u32,
        v: r.v as u32,
        ignore: r.ignore,
        inv_count,
        row0: r.row0 as u32,
        accumulate: 0,
        stride: 0,
        _pad: 0,
    }
}

/// losses, lse (rows of `r`) from logits (r.rows, V) and targets.
pub fn forward(k: &Kernels, losses: &View, lse: &View, logits: &View, targets: &View, r: Rows) -> Result<()> {
    let (entry, grid) = row_launch(r.rows, r.v, "cross_entropy_forward", "cross_entropy_forward_rows");
    k.dispatch(CROSS_ENTROPY, entry, &[losses, lse, logits, targets], &params(r, 0.0), grid)
}

/// dlogits (r.rows, V) += dloss[0] · inv_count · (softmax − onehot).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dlogits: &View,
    logits: &View,
    targets: &View,
    lse: &View,
    dloss: &View,
    r: Rows,
    inv_count: f32,
) -> Result<()> {
    dispatch_backward(k, [dlogits, logits, targets, lse, dloss], r, inv_count, true, r.v)
}

/// [`backward`] that writes dlogits instead of adding to them (0 in ignored rows): a fresh
/// buffer needs no clearing, and is written without being read. Its rows are `stride` ≥ V
/// elements long, 0 past V.
#[allow(clippy::too_many_arguments)]
pub fn backward_write(
    k: &Kernels,
    dlogits: &View,
    logits: &View,
    targets: &View,
    lse: &View,
    dloss: &View,
    r: Rows,
    inv_count: f32,
    stride: usize,
) -> Result<()> {
    if stride < r.v {
        return Err(Error::invalid("cross_entropy", format!("dlogits rows of {stride} cannot hold {} classes", r.v)));
    }
    dispatch_backward(k, [dlogits, logits, targets, lse, dloss], r, inv_count, false, stride)
}

fn dispatch_backward(
    k: &Kernels,
    views: [&View; 5],
    r: Rows,
    inv_count: f32,
    accumulate: bool,
    stride: usize,
) -> Result<()> {
    let p = Params { accumulate: accumulate as u32, stride: stride as u32, ..params(r, inv_count) };
    let chunks = stride.div_ceil(WG as usize * PER_THREAD as usize);
    let grid = grid_1d((r.rows * chunks) as u64 * WG as u64);
    k.dispatch(CROSS_ENTROPY, "cross_entropy_backward", &views, &p, grid)
}
