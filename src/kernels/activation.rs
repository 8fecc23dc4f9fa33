//! Launchers for `shaders/activation.wgsl`: GELU (tanh) and ReLU.

use super::{grid_strided, grid_strided_by, Kernels, ACTIVATION, PER_THREAD_FEW};
use crate::error::Result;
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        n: u32,
        /// backward: 1 adds to dx, 0 overwrites it
        accumulate: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Which activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Gelu,
    Relu,
}

impl Activation {
    fn entries(self) -> (&'static str, &'static str) {
        match self {
            Activation::Gelu => ("gelu_forward", "gelu_backward"),
            Activation::Relu => ("relu_forward", "relu_backward"),
        }
    }
}

/// `out = f(x)`, both (n).
pub fn forward(k: &Kernels, f: Activation, out: &View, x: &View, n: usize) -> Result<()> {
    let p = Params { n: n as u32, ..Default::default() };
    k.dispatch(ACTIVATION, f.entries().0, &[out, x], &p, grid_strided(n as u64))
}

/// `dx += dout * f'(x)`, all (n); `dx = ...` where `accumulate` is false (dx is not read: a new
/// gradient needs no zero fill).
pub fn backward(
    k: &Kernels,
    f: Activation,
    dx: &View,
    x: &View,
    dout: &View,
    n: usize,
    accumulate: bool,
) -> Result<()> {
    let p = Params { n: n as u32, accumulate: accumulate as u32, ..Default::default() };
    k.dispatch(ACTIVATION, f.entries().1, &[dx, x, dout], &p, grid_strided_by(n as u64, PER_THREAD_FEW))
}
