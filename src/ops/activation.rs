//! GELU (tanh form) and ReLU.

use super::expect_float;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::Result;
use crate::kernels::activation::{self as k, Activation};
use crate::tensor::Tensor;

/// GPT-2's GELU: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, any shape.
pub fn gelu(ctx: &Context, x: &Tensor) -> Result<Tensor> {
    apply(ctx, x, Activation::Gelu)
}

/// `max(x, 0)`, any shape.
pub fn relu(ctx: &Context, x: &Tensor) -> Result<Tensor> {
    apply(ctx, x, Activation::Relu)
}

/// GELU of `x` written into `out` again, recording nothing: how a GELU output let go for
/// backward is made again (`autograd::remake_for_backward`).
pub fn gelu_into(ctx: &Context, out: &Tensor, x: &Tensor) -> Result<()> {
    let _op = ctx.op();
    k::forward(&ctx.kernels, Activation::Gelu, &ctx.write(out)?, &ctx.read(x)?, x.len())
}

fn apply(ctx: &Context, x: &Tensor, f: Activation) -> Result<Tensor> {
    expect_float("activation", x)?;
    let out = ctx.empty("activation", x.shape(), x.dtype(), ctx.wants_grad(&[x]))?;
    {
        let _op = ctx.op();
        k::forward(&ctx.kernels, f, &ctx.write(&out)?, &ctx.read(x)?, x.len())?;
    }
    if out.requires_grad() {
        ctx.record(&[&out], ActivationBackward { f, x: x.clone(), out: out.clone() });
    }
    Ok(out)
}

struct ActivationBackward {
    f: Activation,
    x: Tensor,
    out: Tensor,
}

impl Backward for ActivationBackward {
    fn name(&self) -> &'static str {
        match self.f {
            Activation::Gelu => "gelu",
            Activation::Relu => "relu",
        }
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        if let Some((dx, beta)) = grads.of_written(ctx, &self.x)? {
            let _op = ctx.op();
            let accumulate = beta != 0.0;
            let dxv = ctx.write_or_modify(&dx, accumulate)?;
            k::backward(&ctx.kernels, self.f, &dxv, &ctx.read(&self.x)?, &ctx.read(&dout)?, dx.len(), accumulate)?;
        }
        Ok(())
    }
}
