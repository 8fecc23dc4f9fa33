//! The gradients' sums of squares for the global norm, taken during backward right after an op
//! adds to a gradient, while it is still on the GPU: a paged step then need not bring every
//! gradient back for the norm after backward (on GPT-2 XL at a 2 GiB budget, 6.2 GB a step).

use std::cell::RefCell;
use std::collections::HashMap;

use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::{reduce, sumsq};
use crate::nn::Param;
use crate::tensor::{DType, Tensor, TensorId};

/// One slot per parameter. A gradient's sum of squares goes to its slot's region as partial
/// sums (zeros past them), taken again whenever an op adds to it; [`EarlyNorms::finish`] sums
/// every region in one dispatch. Short f32 gradients (biases, gains) wait and are taken
/// [`sumsq::TENSORS`] a dispatch (`sumsq_slots`); longer ones take one `reduce_partials` each.
pub struct EarlyNorms {
    /// Per slot, `region` partial sums of squares (zeros where none are written).
    regions: Tensor,
    /// Floats a slot's region holds: the most partial sums any of the gradients takes, in whole
    /// 256 bytes (a region is bound at its start).
    region: usize,
    /// Per slot, the sum of its region: what the clip factor is computed from.
    slots: Tensor,
    /// Slot of each parameter's gradient, by the gradient's tensor id.
    index: HashMap<TensorId, usize>,
    /// Per slot: holds the sum of the gradient as it is now (taken since `begin`, or pending).
    fresh: RefCell<Vec<bool>>,
    /// Short gradients whose sums are still to be taken, with their slots. Empty where the
    /// adapter has too few storage bindings for `sumsq_slots` (`batched` false).
    pending: RefCell<Vec<(usize, Tensor)>>,
    batched: bool,
}

impl EarlyNorms {
    pub(super) fn new(ctx: &Context, params: &[&Param]) -> Result<Self> {
        let n = params.len().max(1);
        let most = params.iter().map(|p| reduce::partial_groups(p.grad.len())).max().unwrap_or(1);
        let region = most.next_multiple_of(64);
        Ok(EarlyNorms {
            regions: ctx.zeros("grad sumsq regions", &[n * region], false)?,
            region,
            slots: ctx.empty("grad sumsq early", &[n], DType::F32, false)?,
            index: params.iter().enumerate().map(|(i, p)| (p.grad.id(), i)).collect(),
            fresh: RefCell::new(vec![false; params.len()]),
            pending: RefCell::new(Vec::new()),
            batched: sumsq::available(&ctx.gpu.limits),
        })
    }

    /// Forgets the sums taken so far (the gradients may have changed since): call before the
    /// backward that takes them.
    pub fn begin(&self) {
        self.fresh.borrow_mut().iter_mut().for_each(|f| *f = false);
        self.pending.borrow_mut().clear();
    }

    /// Whether the slots are these `params`' gradients, in this order.
    fn covers(&self, params: &[&Param]) -> bool {
        params.len() == self.index.len()
            && params.iter().enumerate().all(|(i, p)| self.index.get(&p.grad.id()) == Some(&i))
    }

    /// After a backward that took sums: the per-slot sums of all `params`' gradients (taking
    /// those backward did not add to), or `None` where it took none or the slots are other
    /// gradients (the caller then sums every gradient itself). Resets what `begin` resets.
    pub(super) fn finish(&self, ctx: &Context, params: &[&Param]) -> Result<Option<&Tensor>> {
        let fresh = std::mem::replace(&mut *self.fresh.borrow_mut(), vec![false; self.index.len()]);
        if !fresh.iter().any(|&f| f) || !self.covers(params) {
            self.pending.borrow_mut().clear();
            return Ok(None);
        }
        for (slot, p) in params.iter().enumerate().filter(|(i, _)| !fresh[*i]) {
            self.sum(ctx, slot, &p.grad)?;
        }
        self.flush(ctx)?;
        let _op = ctx.op();
        let (slots, regions) = (ctx.write(&self.slots)?, ctx.read(&self.regions)?);
        reduce::region_sums(&ctx.kernels, &slots, &regions, params.len(), self.region)?;
        Ok(Some(&self.slots))
    }

    /// The sum of squares of `grad` into the region of `slot`: a short f32 gradient waits for
    /// others (`flush`), a longer one is taken now. (Each slot always takes the same path, so
    /// no partial sums of another path linger in its region.)
    fn sum(&self, ctx: &Context, slot: usize, grad: &Tensor) -> Result<()> {
        if !(self.batched && grad.dtype() == DType::F32 && grad.len() <= reduce::ONE_STAGE) {
            return self.take(ctx, slot, grad);
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

    /// Partial sums of squares of `grad` into the region of `slot`, in one dispatch.
    fn take(&self, ctx: &Context, slot: usize, grad: &Tensor) -> Result<()> {
        let _op = ctx.op();
        let region = ctx.modify(&self.regions)?.elements(slot * self.region, self.region);
        reduce::partial_sums(&ctx.kernels, &region, &ctx.read(grad)?, grad.len(), true)?;
        Ok(())
    }

    /// Takes the pending sums, each into the first float of its slot's region. A gradient added
    /// to again while pending is summed once, as it is now; which gradients share a dispatch
    /// depends only on the order of additions, so a paged step computes what a resident one does.
    fn flush(&self, ctx: &Context) -> Result<()> {
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        if pending.is_empty() {
            return Ok(());
        }
        let _op = ctx.op();
        let regions = ctx.modify(&self.regions)?;
        let grads = pending.iter().map(|(_, g)| ctx.read(g)).collect::<Result<Vec<_>>>()?;
        let xs: Vec<_> = grads.iter().zip(&pending).map(|(v, (slot, g))| (v, g.len(), slot * self.region)).collect();
        sumsq::sumsq_slots(&ctx.kernels, &regions, &xs)
    }
}

impl GradientAdded for EarlyNorms {
    fn added(&self, ctx: &Context, grad: &Tensor) -> Result<()> {
        let Some(&slot) = self.index.get(&grad.id()) else { return Ok(()) };
        self.fresh.borrow_mut()[slot] = true;
        self.sum(ctx, slot, grad)
    }
}
