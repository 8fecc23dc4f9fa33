//! Gradients that go down to the host optimizer in f16 (mixed precision, AdamW on the host):
//! once backward has added to a parameter's f32 gradient for the last time, the GPU takes its sum
//! of squares, rounds it to an f16 copy times a power of two that sum picks (no element can
//! overflow, small ones keep their bits), and drops the f32 gradient without writing it back.
//! The bus then carries 2 bytes a parameter down instead of 4, and the host takes the global
//! norm from the sums instead of a pass over every gradient. The f32 gradient accumulates on the
//! GPU as before, so micro-batches and tied weights add in f32.
//!
//! "Last time" is known from the backward before: the same ops in the same order add to each
//! gradient as often. A backward with no such record (the first, or one whose ops changed)
//! casts every gradient after it ends ([`HalfGrads::finish`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::{elementwise, reduce};
use crate::nn::Param;
use crate::tensor::{DType, Tensor, TensorId};

/// The power of two a gradient whose squares sum to `ss` is multiplied by before it is rounded
/// to f16: `grad_half_scale` in shaders/elementwise.wgsl, bit for bit (exponent bits only).
pub fn grad_half_scale(ss: f32) -> f32 {
    let e = ((ss.to_bits() >> 23) & 0xff) as i32;
    if e == 0 || e == 255 {
        return 1.0;
    }
    let k = 15 - ((e - 127 + 2) >> 1);
    f32::from_bits(((k + 127) as u32) << 23)
}

/// What an f16 gradient whose f32 gradient's squares summed to `ss` is multiplied by on the
/// host: the reciprocal of its [`grad_half_scale`] (a power of two, so exact).
pub fn unscale_of(ss: f32) -> f32 {
    1.0 / grad_half_scale(ss)
}

pub struct HalfGrads {
    /// Per parameter: its gradient in f16, times its scale.
    pub halves: Vec<Tensor>,
    /// Per parameter: the sum of squares of its f32 gradient, as of its cast.
    sums: Tensor,
    /// The same, one f32 a tensor, while [`HalfGrads::send_each_sum`] asks: each then comes down
    /// beside its f16 gradient (`super::speculative_update` reads them during backward).
    own_sums: Vec<Tensor>,
    each_sum_down: std::cell::Cell<bool>,
    /// The f32 gradients, and the slot of each by its id.
    grads: Vec<Tensor>,
    slots: HashMap<TensorId, usize>,
    watch: RefCell<Watch>,
}

/// What the backward under way has done, and what the one before did.
#[derive(Default)]
struct Watch {
    /// The ops of the backward under way (a hash of their names, in order).
    ops: u64,
    /// Per slot: additions so far, and whether the gradient has been cast.
    added: Vec<u32>,
    cast: Vec<bool>,
    /// Gradients cast before backward ended (the rest waited for `finish`).
    cast_early: usize,
    /// The last whole backward's ops and additions per slot.
    before: Option<(u64, Vec<u32>)>,
}

impl HalfGrads {
    pub fn new(ctx: &Context, params: &[&Param]) -> Result<Self> {
        let mut halves = Vec::with_capacity(params.len());
        let mut own_sums = Vec::with_capacity(params.len());
        for p in params {
            if p.grad.dtype() != DType::F32 {
                return Err(Error::invalid(
                    "f16 gradients",
                    format!("`{}` has a {:?} gradient, not f32", p.name, p.grad.dtype()),
                ));
            }
            halves.push(ctx.empty(&format!("{}.grad (f16)", p.name), p.grad.shape(), DType::F16, false)?);
            own_sums.push(ctx.empty(&format!("{}.grad sumsq", p.name), &[1], DType::F32, false)?);
        }
        let n = params.len();
        Ok(HalfGrads {
            halves,
            sums: ctx.empty("grad sumsq (f16 gradients)", &[n.max(1)], DType::F32, false)?,
            own_sums,
            each_sum_down: std::cell::Cell::new(false),
            grads: params.iter().map(|p| p.grad.clone()).collect(),
            slots: params.iter().enumerate().map(|(i, p)| (p.grad.id(), i)).collect(),
            watch: RefCell::new(Watch { added: vec![0; n], cast: vec![false; n], ..Default::default() }),
        })
    }

    /// Call before the backward whose gradients go down (the last micro-batch's), with its ops
    /// on the tape.
    pub fn begin(&self, ctx: &Context) {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        ctx.tape().op_names().hash(&mut hasher);
        let mut w = self.watch.borrow_mut();
        w.ops = hasher.finish();
        w.added.iter_mut().for_each(|a| *a = 0);
        w.cast.iter_mut().for_each(|c| *c = false);
        w.cast_early = 0;
    }

    /// How many gradients the last backward cast as it went, not after it ended: all of them
    /// once a backward has run the same ops before, none in the first.
    pub fn cast_in_backward(&self) -> usize {
        self.watch.borrow().cast_early
    }

    /// Casts whatever backward has not (all of them after a backward with no record), and keeps
    /// this backward's additions as the record for the next.
    pub fn finish(&self, ctx: &Context) -> Result<()> {
        let pending: Vec<usize> = {
            let mut w = self.watch.borrow_mut();
            w.before = Some((w.ops, w.added.clone()));
            (0..self.grads.len()).filter(|&i| !w.cast[i]).collect()
        };
        for slot in pending {
            self.cast(ctx, slot)?;
        }
        Ok(())
    }

    /// The f32 gradient in `slot`: its sum of squares, its scaled f16 copy, and it forgotten.
    fn cast(&self, ctx: &Context, slot: usize) -> Result<()> {
        self.watch.borrow_mut().cast[slot] = true;
        let grad = &self.grads[slot];
        let own = self.each_sum_down.get().then(|| &self.own_sums[slot]);
        // (the sum goes to its own tensor first where it comes down alone, then to its slot)
        let (sums, at) = own.map_or((&self.sums, slot), |own| (own, 0));
        super::clip::sum_of_squares(ctx, sums, at, grad)?;
        {
            let _op = ctx.op();
            let (half, x, sums) = (ctx.write(&self.halves[slot])?, ctx.read(grad)?, ctx.read(sums)?);
            elementwise::convert_scaled(&ctx.kernels, &half, &x, &sums, at, grad.len())?;
        }
        if let Some(own) = own {
            let _op = ctx.op();
            let spec = reduce::SumSpec { squares: false, scale: 1.0, slot, accumulate: false };
            let (out, x, partials) = (ctx.modify(&self.sums)?, ctx.read(own)?, ctx.partials()?);
            reduce::sum(&ctx.kernels, &out, &x, &partials, 1, spec)?;
        }
        ctx.pager.forget(grad.id())?;
        // On its way down while backward goes on (the update reads it early in the next step,
        // or during this backward), and out of the GPU budget: only the host reads it.
        ctx.pager.hand_to_host(self.halves[slot].id())?;
        match own {
            Some(own) => ctx.pager.hand_to_host(own.id()),
            None => Ok(()),
        }
    }

    /// From the next cast on, whether each gradient's sum of squares also comes down on its own,
    /// beside the gradient, instead of only with the others when the norm is read.
    pub fn send_each_sum(&self, on: bool) {
        self.each_sum_down.set(on);
    }

    /// Whether the gradient in `slot` has been cast in the backward under way.
    pub fn is_cast(&self, slot: usize) -> bool {
        self.watch.borrow().cast.get(slot).copied().unwrap_or(false)
    }

    /// The tensor of the sums of squares (one f32 a parameter).
    pub fn sums_id(&self) -> TensorId {
        self.sums.id()
    }

    /// Parameter `slot`'s own sum of squares tensor (one f32; see [`HalfGrads::send_each_sum`]).
    pub fn own_sum_id(&self, slot: usize) -> TensorId {
        self.own_sums[slot].id()
    }

    /// Per parameter, what its f16 gradient is multiplied by (waits for the GPU): [`unscale_of`]
    /// its sum of squares.
    pub fn unscales(&self, ctx: &Context) -> Result<Vec<f32>> {
        Ok(self.sums(ctx)?.into_iter().map(unscale_of).collect())
    }

    /// Per parameter, the sum of squares of its gradient (waits for the GPU): the gradients are
    /// their f16 copies times [`unscale_of`] it.
    pub fn sums(&self, ctx: &Context) -> Result<Vec<f32>> {
        ctx.pager.sync_to_host(&[self.sums.id()])?;
        let n = self.grads.len();
        ctx.pager.update_host(&[self.sums.id()], &[], |s| bytemuck::pod_collect_to_vec::<u8, f32>(&s[0][..4 * n]))
    }
}

impl GradientAdded for HalfGrads {
    fn added(&self, ctx: &Context, grad: &Tensor) -> Result<()> {
        let Some(&slot) = self.slots.get(&grad.id()) else { return Ok(()) };
        let last = {
            let mut w = self.watch.borrow_mut();
            w.added[slot] += 1;
            match &w.before {
                Some((ops, added)) => *ops == w.ops && added[slot] == w.added[slot],
                None => false,
            }
        };
        if last {
            self.watch.borrow_mut().cast_early += 1;
            self.cast(ctx, slot)?;
        }
        Ok(())
    }
}
