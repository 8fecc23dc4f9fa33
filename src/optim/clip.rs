//! Global gradient-norm clipping, computed on the GPU so no step waits for a readback: the sums
//! of squares of every gradient land in one buffer, one kernel turns them into a clip factor that
//! the optimizer kernels read.

use crate::context::Context;
use crate::error::Result;
use crate::kernels::{optim, reduce};
use crate::nn::Param;
use crate::tensor::{DType, Tensor};

pub struct GradClip {
    /// clip[0]: factor the gradients are multiplied by; clip[1]: the global norm before clipping.
    pub clip: Tensor,
    sumsq: Tensor,
}

impl GradClip {
    pub fn new(ctx: &Context, n_params: usize) -> Result<Self> {
        Ok(GradClip {
            clip: ctx.empty("grad clip", &[2], DType::F32, false)?,
            sumsq: ctx.empty("grad sumsq", &[n_params.max(1)], DType::F32, false)?,
        })
    }

    /// Records the norm of all `params`' gradients and the clip factor for `max_norm` (≤ 0: none).
    /// `grad_scale` multiplies the gradients before the norm is taken (1 / loss scale).
    pub fn compute(&self, ctx: &Context, params: &[&Param], max_norm: f32, grad_scale: f32) -> Result<()> {
        for (i, p) in params.iter().enumerate() {
            let _op = ctx.op();
            let spec = reduce::SumSpec { squares: true, scale: 1.0, slot: i, accumulate: false };
            let (sumsq, grad, partials) = (ctx.modify(&self.sumsq)?, ctx.read(&p.grad)?, ctx.partials()?);
            reduce::sum(&ctx.kernels, &sumsq, &grad, &partials, p.grad.len(), spec)?;
        }
        let _op = ctx.op();
        optim::clip_scale(
            &ctx.kernels,
            &ctx.write(&self.clip)?,
            &ctx.read(&self.sumsq)?,
            params.len(),
            max_norm,
            grad_scale,
        )
    }

    /// The global gradient norm of the last `compute` (waits for the GPU).
    pub async fn norm(&self, ctx: &Context) -> Result<f32> {
        Ok(ctx.to_f32(&self.clip).await?[1])
    }
}
