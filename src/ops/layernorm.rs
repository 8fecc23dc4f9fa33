//! LayerNorm over the last dimension.

use super::expect_float;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::layernorm as k;
use crate::tensor::{DType, Tensor};

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last dim: x (..., C), weight (C), bias (C).
pub fn layernorm(ctx: &Context, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
    expect_float("layernorm", x)?;
    let c = x.last_dim();
    if weight.shape() != [c] || bias.shape() != [c] {
        return Err(Error::shape(
            "layernorm",
            format!("weight and bias [{c}] for x {:?}", x.shape()),
            (weight.shape(), bias.shape()),
        ));
    }
    let rows = x.rows();
    let out = ctx.empty("layernorm", x.shape(), x.dtype(), ctx.wants_grad(&[x, weight, bias]))?;
    let mean = ctx.empty("layernorm mean", &[rows], DType::F32, false)?;
    let rstd = ctx.empty("layernorm rstd", &[rows], DType::F32, false)?;
    run_forward(ctx, &out, &mean, &rstd, x, weight, bias, eps)?;
    if out.requires_grad() {
        let node = LayerNormBackward {
            x: x.clone(),
            weight: weight.clone(),
            bias: bias.clone(),
            mean,
            rstd,
            out: out.clone(),
        };
        ctx.record(&[&out], node);
    }
    Ok(out)
}

/// LayerNorm of `x` written into `out` again, recording nothing: how a LayerNorm output let go
/// for backward is made again (`autograd::remake_for_backward`). The same kernel on the same
/// inputs: the same bits.
pub fn layernorm_into(ctx: &Context, out: &Tensor, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<()> {
    let rows = x.rows();
    let mean = ctx.empty("layernorm mean (remade)", &[rows], DType::F32, false)?;
    let rstd = ctx.empty("layernorm rstd (remade)", &[rows], DType::F32, false)?;
    run_forward(ctx, out, &mean, &rstd, x, weight, bias, eps)
}

#[allow(clippy::too_many_arguments)]
fn run_forward(
    ctx: &Context,
    out: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> Result<()> {
    let _op = ctx.op();
    let r = |t: &Tensor| ctx.read(t);
    k::forward(
        &ctx.kernels,
        &ctx.write(out)?,
        &ctx.write(mean)?,
        &ctx.write(rstd)?,
        &r(x)?,
        &r(weight)?,
        &r(bias)?,
        x.rows(),
        x.last_dim(),
        eps,
    )
}

struct LayerNormBackward {
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    mean: Tensor,
    rstd: Tensor,
    out: Tensor,
}

impl Backward for LayerNormBackward {
    fn name(&self) -> &'static str {
        "layernorm"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        let dx = grads.of(ctx, &self.x)?;
        // The params kernel writes both; a side that needs no gradient gets a throwaway buffer.
        let c = self.x.last_dim();
        let dw = match grads.of(ctx, &self.weight)? {
            Some(g) => g,
            None => ctx.zeros("unused dweight", &[c], false)?,
        };
        let db = match grads.of(ctx, &self.bias)? {
            Some(g) => g,
            None => ctx.zeros("unused dbias", &[c], false)?,
        };
        let parts = [super::column_partials(ctx, self.x.rows(), c)?, super::column_partials(ctx, self.x.rows(), c)?];
        let _op = ctx.op();
        let r = |t: &Tensor| ctx.read(t);
        let dxv = dx.as_ref().map(|t| ctx.modify(t)).transpose()?;
        let pv = match &parts {
            [Some(pw), Some(pb)] => Some((ctx.write(pw)?, ctx.write(pb)?)),
            _ => None,
        };
        k::backward(
            &ctx.kernels,
            dxv.as_ref(),
            &ctx.modify(&dw)?,
            &ctx.modify(&db)?,
            &r(&dout)?,
            &r(&self.x)?,
            &r(&self.weight)?,
            &r(&self.mean)?,
            &r(&self.rstd)?,
            pv.as_ref().map(|(a, b)| (a, b)),
            self.x.rows(),
            c,
        )
    }
}
