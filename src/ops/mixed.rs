//! Mixed precision: a Linear whose products read an f16 copy of its f32 master weight, so the
//! weight costs half the bytes on the GPU and the bus, while the optimizer updates the master.

use super::expect_float;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::elementwise;
use crate::tensor::{DType, Tensor};

/// `x · W + bias` reading `w16`, the f16 copy of the f32 master weight `w` (K,N): x (..., K) →
/// (..., N) in x's element type. Backward gives dx from the f16 copy, and dW, dbias in f32
/// (accumulated into the master weight's gradient): the plain product's backward, with the
/// copy's gradient routed to its master.
pub fn linear_mixed(ctx: &Context, x: &Tensor, w: &Tensor, w16: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    expect_float("linear_mixed", x)?;
    let (k, n) = (w.shape()[0], w.shape()[1]);
    if x.last_dim() != k || w16.dtype() != DType::F16 || w16.shape() != w.shape() {
        return Err(Error::shape(
            "linear_mixed",
            format!("x (..., {k}) and an f16 copy of the ({k},{n}) weight"),
            (x.shape(), w16),
        ));
    }
    super::matmul::product_with_grad_to(ctx, x, w16, bias, Default::default(), w)
}

/// Copies the f32 master weight `w` into its f16 copy `w16` (after each optimizer step).
pub fn refresh_half(ctx: &Context, w16: &Tensor, w: &Tensor) -> Result<()> {
    if w16.dtype() != DType::F16 || w16.shape() != w.shape() {
        return Err(Error::shape("refresh_half", format!("an f16 tensor {:?}", w.shape()), w16));
    }
    let _op = ctx.op();
    elementwise::cast(&ctx.kernels, &ctx.write(w16)?, &ctx.read(w)?, w.len())
}
