//! Mixed precision: a Linear whose products read an f16 copy of its f32 master weight, so the
//! weight costs half the bytes on the GPU and the bus, while the optimizer updates the master.

use super::expect_float;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::matmul::{self as mm, Gemm};
use crate::kernels::{elementwise, reduce};
use crate::tensor::{DType, Tensor};

/// `x · W + bias` reading `w16`, the f16 copy of the f32 master weight `w` (K,N): x (..., K) →
/// (..., N) in x's element type. Backward gives dx from the f16 copy, and dW, dbias in f32
/// (accumulated into the master weight's gradient).
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
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("non-empty") = n;
    let inputs: Vec<&Tensor> = [Some(x), Some(w), bias].into_iter().flatten().collect();
    let out = ctx.empty("linear_mixed", &shape, x.dtype(), ctx.wants_grad(&inputs))?;
    {
        let _op = ctx.op();
        let bias_view = bias.map(|b| ctx.read(b)).transpose()?;
        let g = Gemm::new(x.rows(), n, k);
        mm::matmul(
            &ctx.kernels,
            &ctx.write(&out)?,
            &ctx.read(x)?,
            &ctx.read(w16)?,
            bias_view.as_ref(),
            &ctx.dummy()?,
            g,
        )?;
    }
    if out.requires_grad() {
        ctx.record(
            &[&out],
            LinearMixedBackward { x: x.clone(), w: w.clone(), w16: w16.clone(), bias: bias.cloned(), out: out.clone() },
        );
    }
    Ok(out)
}

/// Copies the f32 master weight `w` into its f16 copy `w16` (after each optimizer step).
pub fn refresh_half(ctx: &Context, w16: &Tensor, w: &Tensor) -> Result<()> {
    if w16.dtype() != DType::F16 || w16.shape() != w.shape() {
        return Err(Error::shape("refresh_half", format!("an f16 tensor {:?}", w.shape()), w16));
    }
    let _op = ctx.op();
    elementwise::cast(&ctx.kernels, &ctx.write(w16)?, &ctx.read(w)?, w.len())
}

struct LinearMixedBackward {
    x: Tensor,
    w: Tensor,
    w16: Tensor,
    bias: Option<Tensor>,
    out: Tensor,
}

impl Backward for LinearMixedBackward {
    fn name(&self) -> &'static str {
        "linear_mixed"
    }

    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dy) = grads.get(&self.out) else { return Ok(()) };
        let (k, n, rows) = (self.w.shape()[0], self.w.shape()[1], self.x.rows());
        if let Some(dx) = grads.of(ctx, &self.x)? {
            // dx += dy · Wᵀ, W read from its f16 copy
            let _op = ctx.op();
            let g = Gemm { trans_b: true, beta: 1.0, ..Gemm::new(rows, k, n) };
            mm::matmul(
                &ctx.kernels,
                &ctx.modify(&dx)?,
                &ctx.read(&dy)?,
                &ctx.read(&self.w16)?,
                None,
                &ctx.dummy()?,
                g,
            )?;
        }
        if let Some(dw) = grads.of(ctx, &self.w)? {
            // dW += xᵀ · dy, accumulated in f32
            let _op = ctx.op();
            let g = Gemm { trans_a: true, beta: 1.0, ..Gemm::new(k, n, rows) };
            mm::matmul(&ctx.kernels, &ctx.modify(&dw)?, &ctx.read(&self.x)?, &ctx.read(&dy)?, None, &ctx.dummy()?, g)?;
        }
        if let Some(bias) = &self.bias {
            if let Some(db) = grads.of(ctx, bias)? {
                let _op = ctx.op();
                reduce::sum_rows(&ctx.kernels, &ctx.modify(&db)?, &ctx.read(&dy)?, rows, n)?;
            }
        }
        Ok(())
    }
}
