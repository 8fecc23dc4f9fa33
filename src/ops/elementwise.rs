//! add, scale, cast, sum, mean (f32 or f16 operands).

use super::{expect_float, expect_same_shape};
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::Result;
use crate::kernels::{elementwise as k, reduce};
use crate::tensor::{DType, Tensor};

/// `a + b`, same shapes (the residual connection).
pub fn add(ctx: &Context, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    expect_float("add", a)?;
    expect_float("add", b)?;
    expect_same_shape("add", a, b)?;
    let out = ctx.empty("add", a.shape(), a.dtype(), ctx.wants_grad(&[a, b]))?;
    {
        let _op = ctx.op();
        k::add_forward(&ctx.kernels, &ctx.write(&out)?, &ctx.read(a)?, &ctx.read(b)?, a.len())?;
    }
    if out.requires_grad() {
        ctx.record(&[&out], AddBackward { a: a.clone(), b: b.clone(), out: out.clone() });
    }
    Ok(out)
}

struct AddBackward {
    a: Tensor,
    b: Tensor,
    out: Tensor,
}

impl Backward for AddBackward {
    fn name(&self) -> &'static str {
        "add"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        for input in [&self.a, &self.b] {
            add_gradient(ctx, grads, input, &dout, 1.0)?;
        }
        Ok(())
    }
}

/// The gradient of `x` += `alpha·dout`: a new one is `dout` itself where alpha is 1 and the types
/// match ([`Grads::pass_on`]), else written, not cleared and added to.
pub(super) fn add_gradient(ctx: &Context, grads: &mut Grads, x: &Tensor, dout: &Tensor, alpha: f32) -> Result<()> {
    if alpha == 1.0 && grads.pass_on(x, dout) {
        return Ok(());
    }
    let Some((g, beta)) = grads.of_written(ctx, x)? else {
        return Ok(());
    };
    let _op = ctx.op();
    if beta == 0.0 {
        k::scale_forward(&ctx.kernels, &ctx.write(&g)?, &ctx.read(dout)?, alpha, g.len())
    } else {
        k::axpy(&ctx.kernels, &ctx.modify(&g)?, &ctx.read(dout)?, alpha, g.len())
    }
}

/// `alpha * x`.
pub fn scale(ctx: &Context, x: &Tensor, alpha: f32) -> Result<Tensor> {
    expect_float("scale", x)?;
    let out = ctx.empty("scale", x.shape(), x.dtype(), ctx.wants_grad(&[x]))?;
    {
        let _op = ctx.op();
        k::scale_forward(&ctx.kernels, &ctx.write(&out)?, &ctx.read(x)?, alpha, x.len())?;
    }
    if out.requires_grad() {
        ctx.record(&[&out], ScaleBackward { x: x.clone(), out: out.clone(), alpha });
    }
    Ok(out)
}

struct ScaleBackward {
    x: Tensor,
    out: Tensor,
    alpha: f32,
}

impl Backward for ScaleBackward {
    fn name(&self) -> &'static str {
        "scale"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        add_gradient(ctx, grads, &self.x, &dout, self.alpha)?;
        Ok(())
    }
}

/// `x` in another element type (f32 ↔ f16); the gradient is cast back.
pub fn cast(ctx: &Context, x: &Tensor, dtype: DType) -> Result<Tensor> {
    expect_float("cast", x)?;
    if !matches!(dtype, DType::F32 | DType::F16) {
        return Err(crate::error::Error::invalid("cast", format!("to {dtype:?}: f32 and f16 are supported")));
    }
    let out = ctx.empty("cast", x.shape(), dtype, ctx.wants_grad(&[x]))?;
    {
        let _op = ctx.op();
        k::cast(&ctx.kernels, &ctx.write(&out)?, &ctx.read(x)?, x.len())?;
    }
    if out.requires_grad() {
        ctx.record(&[&out], ScaleBackward { x: x.clone(), out: out.clone(), alpha: 1.0 });
    }
    Ok(out)
}

/// Sum of all elements, a scalar (shape `[1]`).
pub fn sum(ctx: &Context, x: &Tensor) -> Result<Tensor> {
    reduce_all(ctx, x, 1.0, "sum")
}

/// Mean of all elements, a scalar (shape `[1]`).
pub fn mean(ctx: &Context, x: &Tensor) -> Result<Tensor> {
    reduce_all(ctx, x, 1.0 / x.len().max(1) as f32, "mean")
}

fn reduce_all(ctx: &Context, x: &Tensor, scale: f32, name: &'static str) -> Result<Tensor> {
    expect_float(name, x)?;
    let out = ctx.empty(name, &[1], DType::F32, ctx.wants_grad(&[x]))?;
    let spec = reduce::SumSpec { squares: false, scale, slot: 0, accumulate: false };
    {
        let _op = ctx.op();
        reduce::sum(&ctx.kernels, &ctx.write(&out)?, &ctx.read(x)?, &ctx.partials()?, x.len(), spec)?;
    }
    if out.requires_grad() {
        ctx.record(&[&out], ReduceBackward { x: x.clone(), out: out.clone(), scale, name });
    }
    Ok(out)
}

struct ReduceBackward {
    x: Tensor,
    out: Tensor,
    scale: f32,
    name: &'static str,
}

impl Backward for ReduceBackward {
    fn name(&self) -> &'static str {
        self.name
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        if let Some(g) = grads.of(ctx, &self.x)? {
            let _op = ctx.op();
            k::axpy_scalar(&ctx.kernels, &ctx.modify(&g)?, &ctx.read(&dout)?, self.scale, g.len())?;
        }
        Ok(())
    }
}
