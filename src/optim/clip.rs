//! Global gradient-norm clipping, computed on the GPU so no step waits for a readback: the sums
//! of squares of every gradient land in one buffer (partial sums, seven gradients a dispatch),
//! one kernel turns them into a clip factor that the optimizer kernels read.

use std::cell::RefCell;
use std::rc::Rc;

use super::early_norms::EarlyNorms;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::{optim, reduce, sumsq};
use crate::nn::Param;
use crate::tensor::{DType, Tensor};

pub struct GradClip {
    /// clip[0]: factor the gradients are multiplied by; clip[1]: the global norm before clipping.
    pub clip: Tensor,
    /// Partial sums of squares (grown to what the gradients' sizes need).
    sumsq: RefCell<Tensor>,
    /// Sums of squares taken during backward (see [`EarlyNorms`]).
    early: Rc<EarlyNorms>,
}

/// The sum of squares of `x` into `out[slot]`, one gradient at a time.
pub(super) fn sum_of_squares(ctx: &Context, out: &Tensor, slot: usize, x: &Tensor) -> Result<()> {
    let _op = ctx.op();
    let spec = reduce::SumSpec { squares: true, scale: 1.0, slot, accumulate: false };
    let out = ctx.modify(out)?;
    let (x_view, partials) = (ctx.read(x)?, ctx.partials()?);
    reduce::sum(&ctx.kernels, &out, &x_view, &partials, x.len(), spec)
}

impl GradClip {
    pub fn new(ctx: &Context, params: &[&Param]) -> Result<Self> {
        let n = params.len().max(1);
        Ok(GradClip {
            clip: ctx.empty("grad clip", &[2], DType::F32, false)?,
            sumsq: RefCell::new(ctx.empty("grad sumsq", &[n], DType::F32, false)?),
            early: Rc::new(EarlyNorms::new(ctx, params)?),
        })
    }

    /// What takes the gradients' sums of squares during a backward (pass it to
    /// [`crate::autograd::Grads::watch`] after [`EarlyNorms::begin`]); `compute` then reads only
    /// the gradients that backward did not add to.
    pub fn early_norms(&self) -> Rc<EarlyNorms> {
        self.early.clone()
    }

    /// Records the norm of all `params`' gradients and the clip factor for `max_norm` (≤ 0: none).
    /// `grad_scale` multiplies the gradients before the norm is taken (1 / loss scale).
    pub fn compute(&self, ctx: &Context, params: &[&Param], max_norm: f32, grad_scale: f32) -> Result<()> {
        if let Some(sums) = self.early.finish(ctx, params)? {
            return self.scale(ctx, sums, params.len(), max_norm, grad_scale);
        }
        let multi = sumsq::available(&ctx.gpu.limits) && params.iter().all(|p| p.grad.dtype() == DType::F32);
        let count = if multi {
            let lens: Vec<usize> = params.iter().map(|p| p.grad.len()).collect();
            // A quarter of the budget at most, so the gradients of a group fit beside the rest.
            let groups = sumsq::groups(&lens, ctx.pager.budget() / 4);
            let needed = sumsq::partials_for(&lens, &groups);
            if self.sumsq.borrow().len() < needed {
                *self.sumsq.borrow_mut() = ctx.empty("grad sumsq", &[needed], DType::F32, false)?;
            }
            let mut base = 0;
            for range in groups {
                let group = &params[range];
                let _op = ctx.op();
                let grads = group.iter().map(|p| ctx.read(&p.grad)).collect::<Result<Vec<_>>>()?;
                let xs: Vec<_> = grads.iter().zip(group).map(|(g, p)| (g, p.grad.len())).collect();
                base += sumsq::sumsq_multi(&ctx.kernels, &ctx.modify(&self.sumsq.borrow())?, &xs, base)?;
            }
            base
        } else {
            // Adapters with fewer storage bindings: one or two dispatches per gradient.
            for (i, p) in params.iter().enumerate() {
                sum_of_squares(ctx, &self.sumsq.borrow(), i, &p.grad)?;
            }
            params.len()
        };
        self.scale(ctx, &self.sumsq.borrow(), count, max_norm, grad_scale)
    }

    /// The norm and the clip factor from the first `count` sums of squares in `sums`.
    fn scale(&self, ctx: &Context, sums: &Tensor, count: usize, max_norm: f32, grad_scale: f32) -> Result<()> {
        let _op = ctx.op();
        optim::clip_scale(&ctx.kernels, &ctx.write(&self.clip)?, &ctx.read(sums)?, count, max_norm, grad_scale)
    }

    /// The global gradient norm of the last `compute` (waits for the GPU).
    pub async fn norm(&self, ctx: &Context) -> Result<f32> {
        Ok(ctx.to_f32(&self.clip).await?[1])
    }
}
