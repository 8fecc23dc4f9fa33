//! Launchers for `shaders/optim.wgsl`: fused AdamW, SGD with momentum, grad-norm clip factor.

use super::{grid_1d, grid_strided_by, Kernels, OPTIM, PER_THREAD_FEW};
use crate::error::Result;
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        n: u32,
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        bc1: f32,
        bc2: f32,
        grad_scale: f32,
        momentum: f32,
        max_norm: f32,
        _pad: u32,
    }
}

/// AdamW hyperparameters for one update at step `t` (1-based, for bias correction).
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub t: u64,
    /// Multiplies the gradient (e.g. 1/loss_scale).
    pub grad_scale: f32,
}

/// param, m, v (n) updated in place from grad (n) and clip (2); `half` (n, f16), when given,
/// receives the new param values (mixed precision's weight copy, no separate pass).
#[allow(clippy::too_many_arguments)]
pub fn adamw(
    k: &Kernels,
    param: &View,
    m: &View,
    v: &View,
    grad: &View,
    clip: &View,
    half: Option<&View>,
    n: usize,
    s: AdamWStep,
) -> Result<()> {
    let p = Params {
        n: n as u32,
        lr: s.lr,
        beta1: s.beta1,
        beta2: s.beta2,
        eps: s.eps,
        weight_decay: s.weight_decay,
        bc1: 1.0 - s.beta1.powi(s.t as i32),
        bc2: 1.0 - s.beta2.powi(s.t as i32),
        grad_scale: s.grad_scale,
        ..Default::default()
    };
    let grid = grid_strided_by(n as u64, PER_THREAD_FEW);
    match half {
        Some(h) => k.dispatch(OPTIM, "adamw_update_half", &[param, m, v, grad, clip, h], &p, grid),
        None => k.dispatch(OPTIM, "adamw_update", &[param, m, v, grad, clip], &p, grid),
    }
}

/// param, buf (n) updated in place: SGD with momentum and L2 weight decay.
#[allow(clippy::too_many_arguments)]
pub fn sgd(
    k: &Kernels,
    param: &View,
    buf: &View,
    grad: &View,
    clip: &View,
    n: usize,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    grad_scale: f32,
) -> Result<()> {
    let p = Params { n: n as u32, lr, momentum, weight_decay, grad_scale, ..Default::default() };
    k.dispatch(OPTIM, "sgd_update", &[param, buf, grad, clip], &p, grid_1d(n as u64))
}

/// clip[1] = grad_scale·‖g‖ from `count` partial sums of squares; clip[0] = min(1, max_norm/clip[1])
/// (1 if max_norm ≤ 0).
pub fn clip_scale(k: &Kernels, clip: &View, sumsq: &View, count: usize, max_norm: f32, grad_scale: f32) -> Result<()> {
    let p = Params { n: count as u32, max_norm, grad_scale, ..Default::default() };
    k.dispatch(OPTIM, "clip_scale", &[clip, sumsq], &p, [1, 1, 1])
}
