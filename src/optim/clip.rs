//! Global gradient-norm clipping, computed on the GPU so no step waits for a readback: the sums
//! of squares of every gradient land in one buffer (partial sums, seven gradients a dispatch),
//! one kernel turns them into a clip factor that the optimizer kernels read.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::{optim, reduce, sumsq};
use crate::nn::Param;
use crate::tensor::{DType, Tensor, TensorId};

pub struct GradClip {
    /// clip[0]: factor the gradients are multiplied by; clip[1]: the global norm before clipping.
    pub clip: Tensor,
    /// Partial sums of squares (grown to what the gradients' sizes need).
    sumsq: RefCell<Tensor>,
    /// Sums of squares taken during backward (see [`EarlyNorms`]).
    early: Rc<EarlyNorms>,
}

/// One slot per parameter for the sum of squares of its gradient, taken by backward right after
/// an op adds to the gradient ([`GradientAdded`]), while it is still on the GPU: a paged step
/// then need not bring every gradient back for the norm after backward (on GPT-2 XL at a 2 GiB
/// budget, 6.2 GB a step). An op that adds to a gradient again takes its sum again.
pub struct EarlyNorms {
    slots: Tensor,
    /// Slot of each parameter's gradient, by the gradient's tensor id.
    index: HashMap<TensorId, usize>,
    /// Per slot: holds the sum of the gradient as it is now (taken since `begin`, or pending).
    fresh: RefCell<Vec<bool>>,
    /// Short f32 gradients (biases, gains) whose sums are still to be taken, with their slots:
    /// taken [`sumsq::TENSORS`] at a time (`sumsq_slots`), not a dispatch each. Empty where the
    /// adapter has too few storage bindings.
    pending: RefCell<Vec<(usize, Tensor)>>,
    batched: bool,
}

impl EarlyNorms {
    /// Forgets the sums taken so far (the gradients may have changed since): call before the
    /// backward that takes them.
    pub fn begin(&self) {
        self.fresh.borrow_mut().iter_mut().for_each(|f| *f = false);
        self.pending.borrow_mut().clear();
    }

    /// Takes the pending sums. A gradient added to again while pending is summed once, as it
    /// is now; which gradients share a dispatch depends only on the order of additions, so a
    /// paged step computes what a resident one does.
    fn flush(&self, ctx: &Context) -> Result<()> {
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        if pending.is_empty() {
            return Ok(());
        }
        let _op = ctx.op();
        let out = ctx.modify(&self.slots)?;
        let grads = pending.iter().map(|(_, g)| ctx.read(g)).collect::<Result<Vec<_>>>()?;
        let xs: Vec<_> = grads.iter().zip(&pending).map(|(v, (slot, g))| (v, g.len(), *slot)).collect();
        sumsq::sumsq_slots(&ctx.kernels, &out, &xs)
    }

    /// Whether the slots are these `params`' gradients, in this order.
    fn covers(&self, params: &[&Param]) -> bool {
        params.len() == self.index.len()
            && params.iter().enumerate().all(|(i, p)| self.index.get(&p.grad.id()) == Some(&i))
    }
}

impl GradientAdded for EarlyNorms {
    fn added(&self, ctx: &Context, grad: &Tensor) -> Result<()> {
        let Some(&slot) = self.index.get(&grad.id()) else { return Ok(()) };
        self.fresh.borrow_mut()[slot] = true;
        if !(self.batched && grad.dtype() == DType::F32 && grad.len() <= reduce::ONE_STAGE) {
            return sum_of_squares(ctx, &self.slots, slot, grad);
        }
        let full = {
            let mut pending = self.pending.borrow_mut();
            if !pending.iter().any(|(s, _)| *s == slot) {
                pending.push((slot, grad.clone()));
            }
            pending.len() == sumsq::TENSORS
        };
        if full {
            self.flush(ctx)?;
        }
        Ok(())
    }
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
        let batched = ctx.gpu.limits.max_storage_buffers_per_shader_stage >= sumsq::STORAGE_BINDINGS;
        let early = EarlyNorms {
            slots: ctx.empty("grad sumsq early", &[n], DType::F32, false)?,
            index: params.iter().enumerate().map(|(i, p)| (p.grad.id(), i)).collect(),
            fresh: RefCell::new(vec![false; params.len()]),
            pending: RefCell::new(Vec::new()),
            batched,
        };
        Ok(GradClip {
            clip: ctx.empty("grad clip", &[2], DType::F32, false)?,
            sumsq: RefCell::new(ctx.empty("grad sumsq", &[n], DType::F32, false)?),
            early: Rc::new(early),
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
        let fresh = std::mem::replace(&mut *self.early.fresh.borrow_mut(), vec![false; self.early.index.len()]);
        if fresh.iter().any(|&f| f) && self.early.covers(params) {
            self.early.flush(ctx)?;
            for (i, p) in params.iter().enumerate().filter(|(i, _)| !fresh[*i]) {
                sum_of_squares(ctx, &self.early.slots, i, &p.grad)?;
            }
            return self.scale(ctx, &self.early.slots, params.len(), max_norm, grad_scale);
        }
        self.early.pending.borrow_mut().clear();
        let multi = self.early.batched && params.iter().all(|p| p.grad.dtype() == DType::F32);
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
