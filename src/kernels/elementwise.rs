//! Launchers for `shaders/elementwise.wgsl`: add, axpy, scale, fill, normal draws, cast; f32 or
//! f16 views.

use super::{grid_1d, grid_strided, Kernels, ELEMENTWISE};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        n: u32,
        alpha: f32,
        /// fill_normal's 64-bit seed (low, high words); unused elsewhere
        seed0: u32,
        seed1: u32,
        /// convert_scaled's element of b
        slot: u32,
        /// convert_scaled: 1 to write the scale's exponent after the values
        tail: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

fn params(n: usize, alpha: f32) -> Params {
    Params { n: n as u32, alpha, ..Default::default() }
}

/// `out = a + b`, all (n).
pub fn add_forward(k: &Kernels, out: &View, a: &View, b: &View, n: usize) -> Result<()> {
    k.dispatch(ELEMENTWISE, "add_forward", &[out, a, b], &params(n, 0.0), grid_strided(n as u64))
}

/// `y += alpha * x`, both (n).
pub fn axpy(k: &Kernels, y: &View, x: &View, alpha: f32, n: usize) -> Result<()> {
    k.dispatch(ELEMENTWISE, "axpy", &[y, x], &params(n, alpha), grid_strided(n as u64))
}

/// `y += alpha * s[0]`: y (n), s (1).
pub fn axpy_scalar(k: &Kernels, y: &View, s: &View, alpha: f32, n: usize) -> Result<()> {
    k.dispatch(ELEMENTWISE, "axpy_scalar", &[y, s], &params(n, alpha), grid_1d(n as u64))
}

/// `out = alpha * x`, both (n).
pub fn scale_forward(k: &Kernels, out: &View, x: &View, alpha: f32, n: usize) -> Result<()> {
    k.dispatch(ELEMENTWISE, "scale_forward", &[out, x], &params(n, alpha), grid_strided(n as u64))
}

/// `out = value`, (n).
pub fn fill(k: &Kernels, out: &View, value: f32, n: usize) -> Result<()> {
    k.dispatch(ELEMENTWISE, "fill", &[out], &params(n, value), grid_1d(n as u64))
}

/// `out = std * N(0, 1)`, (n): element i is `crate::rng::counter_normal(seed, i) * std`, to the
/// adapter's `log`/`cos` precision. Drawing initial weights on the GPU takes a GPT-2's 124 M
/// draws off the host (about a second on 16 cores) and their upload off the bus.
pub fn fill_normal(k: &Kernels, out: &View, std: f32, seed: u64, n: usize) -> Result<()> {
    let p = Params { n: n as u32, alpha: std, seed0: seed as u32, seed1: (seed >> 32) as u32, ..Default::default() };
    k.dispatch(ELEMENTWISE, "fill_normal", &[out], &p, grid_1d(n as u64))
}

/// `out = a` converted to `out`'s element type (f32 ↔ f16), both (n).
pub fn cast(k: &Kernels, out: &View, a: &View, n: usize) -> Result<()> {
    k.dispatch(ELEMENTWISE, "convert", &[out, a], &params(n, 0.0), grid_1d(n as u64))
}

/// `out = a · s` rounded to `out`'s element type, with `s` the power of two that
/// [`crate::optim::grad_half_scale`] picks for `sums[slot]`, the sum of squares of `a`: a
/// gradient going down to the host optimizer in f16 (`optim::half_grads`). out, a (n); with
/// `exponent_after`, out (n + 2) carries `s`'s exponent after the values (`optim::split_tail`).
pub fn convert_scaled(
    k: &Kernels,
    out: &View,
    a: &View,
    sums: &View,
    slot: usize,
    n: usize,
    exponent_after: bool,
) -> Result<()> {
    k.dispatch(ELEMENTWISE, "convert_scaled", &[out, a, sums], &scaled(n, slot, exponent_after), grid_1d(n as u64))
}

/// The parameters of `convert_scaled` and `convert_scaled_summed`.
fn scaled(n: usize, slot: usize, exponent_after: bool) -> Params {
    Params { n: n as u32, slot: slot as u32, tail: exponent_after as u32, ..Default::default() }
}

/// [`convert_scaled`] of a small `a` (n ≤ [`super::reduce::ONE_STAGE`]) in one dispatch that
/// first writes its sum of squares to `sums[slot]`: what `reduce::sum` of its squares and then
/// `convert_scaled` do in two.
pub fn convert_scaled_summed(
    k: &Kernels,
    out: &View,
    a: &View,
    sums: &View,
    slot: usize,
    n: usize,
    exponent_after: bool,
) -> Result<()> {
    if n > super::reduce::ONE_STAGE {
        return Err(Error::invalid(
            "convert_scaled_summed",
            format!("takes at most {} elements, got {n}", super::reduce::ONE_STAGE),
        ));
    }
    k.dispatch(ELEMENTWISE, "convert_scaled_summed", &[out, a, sums], &scaled(n, slot, exponent_after), [1, 1, 1])
}
