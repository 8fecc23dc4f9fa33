//! Row softmax over the last dimension.

use super::expect_f32;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::Result;
use crate::kernels::softmax as k;
use crate::tensor::{DType, Tensor};

/// Softmax over the last dim of x (..., L).
pub fn softmax(ctx: &Context, x: &Tensor) -> Result<Tensor> {
    expect_f32("softmax", x)?;
    let out = ctx.empty("softmax", x.shape(), DType::F32, ctx.wants_grad(&[x]))?;
    let _op = ctx.op();
    k::forward(&ctx.kernels, &ctx.write(&out)?, &ctx.read(x)?, x.rows(), x.last_dim(), 0, 1.0)?;
    if out.requires_grad() {
        ctx.record(&[&out], SoftmaxBackward { x: x.clone(), out: out.clone() });
    }
    Ok(out)
}

struct SoftmaxBackward {
    x: Tensor,
    out: Tensor,
}

impl Backward for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        if let Some(dx) = grads.of(ctx, &self.x)? {
            let (rows, len) = (self.x.rows(), self.x.last_dim());
            let _op = ctx.op();
            k::backward(&ctx.kernels, &ctx.modify(&dx)?, &ctx.read(&self.out)?, &ctx.read(&dout)?, rows, len, 0, 1.0)?;
        }
        Ok(())
    }
}
