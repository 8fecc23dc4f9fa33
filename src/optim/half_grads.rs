//! Gradients that go down to the host optimizer in f16 (mixed precision, AdamW on the host):
//! once backward has added to a parameter's f32 gradient for the last time, the GPU takes its sum
//! of squares, rounds it to an f16 copy times a power of two that sum picks (no element can
//! overflow, small ones keep their bits; the power's exponent rides after the values), and drops
//! the f32 gradient without writing it back.
//! The bus then carries 2 bytes a parameter down instead of 4, and the host takes the global
//! norm from the sums instead of a pass over every gradient. The f32 gradient accumulates on the
//! GPU as before, so micro-batches and tied weights add in f32.
//!
//! "Last time" is known from the backward before (`super::last_additions`); a backward with no
//! such record casts every gradient after it ends ([`HalfGrads::finish`]).

use std::cell::RefCell;
use std::collections::HashMap;

use super::last_additions::LastAdditions;
use crate::autograd::GradientAdded;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::{elementwise, reduce};
use crate::nn::Param;
use crate::tensor::{DType, Tensor, TensorId};

/// The power of two a gradient whose squares sum to `ss` is multiplied by before it is rounded
/// to f16: `grad_half_scale` in shaders/elementwise.wgsl, bit for bit (exponent bits only).
pub fn grad_half_scale(ss: f32) -> f32 {
    f32::from_bits(((grad_half_exponent(ss) + 127) as u32) << 23)
}

/// The exponent k of [`grad_half_scale`]`(ss)` = 2^k (`grad_half_exponent` in the WGSL): -49 to
/// 77, 0 for a sum that is zero, subnormal, infinite or NaN.
fn grad_half_exponent(ss: f32) -> i32 {
    let e = ((ss.to_bits() >> 23) & 0xff) as i32;
    if e == 0 || e == 255 {
        return 0;
    }
    15 - ((e - 127 + 2) >> 1)
}

/// What an f16 gradient whose f32 gradient's squares summed to `ss` is multiplied by on the
/// host: the reciprocal of its [`grad_half_scale`] (a power of two, so exact).
pub fn unscale_of(ss: f32) -> f32 {
    1.0 / grad_half_scale(ss)
}

/// Values an f16 gradient tensor holds after its gradient's: its scale's exponent, then 0 (two
/// halves keep the tensor's bytes a multiple of 4). The gradient then lands on the host with
/// what multiplies it, in its own transfer (`super::speculative_update` reads it during backward).
pub const EXPONENT_TAIL: usize = 2;

/// The host bytes of an f16 gradient of `len` values ([`EXPONENT_TAIL`] after them) split into
/// its values' bytes and what they are multiplied by: the reciprocal of the scale whose exponent
/// the tail holds, the same bits as [`unscale_of`] its sum of squares.
pub fn split_tail(bytes: &[u8], len: usize) -> Result<(&[u8], f32)> {
    let size = std::mem::size_of::<half::f16>();
    let bad = |what: String| Error::invalid("f16 gradient", what);
    if bytes.len() < (len + EXPONENT_TAIL) * size {
        return Err(bad(format!("{} bytes hold no {len} values and their scale", bytes.len())));
    }
    let (values, tail) = bytes.split_at(len * size);
    let k = half::f16::from_le_bytes([tail[0], tail[1]]).to_f32();
    if k.fract() != 0.0 || !(-64.0..=96.0).contains(&k) {
        return Err(bad(format!("its scale's exponent is {k}, not one the GPU writes")));
    }
    Ok((values, f32::from_bits(((127 - k as i32) as u32) << 23)))
}

pub struct HalfGrads {
    /// Per parameter: its gradient in f16, times its scale, with the scale's exponent after it
    /// ([`EXPONENT_TAIL`]).
    pub halves: Vec<Tensor>,
    /// Per parameter: the sum of squares of its f32 gradient, as of its cast.
    sums: Tensor,
    /// The f32 gradients, and the slot of each by its id.
    grads: Vec<Tensor>,
    slots: HashMap<TensorId, usize>,
    /// Which gradients the backward under way has cast.
    watch: RefCell<LastAdditions>,
}

impl HalfGrads {
    pub fn new(ctx: &Context, params: &[&Param]) -> Result<Self> {
        let mut halves = Vec::with_capacity(params.len());
        for p in params {
            if p.grad.dtype() != DType::F32 {
                return Err(Error::invalid(
                    "f16 gradients",
                    format!("`{}` has a {:?} gradient, not f32", p.name, p.grad.dtype()),
                ));
            }
            let len = p.grad.len() + EXPONENT_TAIL;
            halves.push(ctx.empty(&format!("{}.grad (f16)", p.name), &[len], DType::F16, false)?);
        }
        let n = params.len();
        Ok(HalfGrads {
            halves,
            sums: ctx.empty("grad sumsq (f16 gradients)", &[n.max(1)], DType::F32, false)?,
            grads: params.iter().map(|p| p.grad.clone()).collect(),
            slots: params.iter().enumerate().map(|(i, p)| (p.grad.id(), i)).collect(),
            watch: RefCell::new(LastAdditions::new(n)),
        })
    }

    /// Call before the backward whose gradients go down (the last micro-batch's), with its ops
    /// on the tape.
    pub fn begin(&self, ctx: &Context) {
        self.watch.borrow_mut().begin(ctx);
    }

    /// How many gradients the last backward cast as it went, not after it ended: all of them
    /// once a backward has run the same ops before, none in the first.
    pub fn cast_in_backward(&self) -> usize {
        self.watch.borrow().early()
    }

    /// Casts whatever backward has not (all of them after a backward with no record), and keeps
    /// this backward's additions as the record for the next.
    pub fn finish(&self, ctx: &Context) -> Result<()> {
        let pending = self.watch.borrow_mut().finish();
        for slot in pending {
            self.cast(ctx, slot, false)?;
        }
        Ok(())
    }

    /// The f32 gradient in `slot`: its sum of squares, its scaled f16 copy, and it forgotten.
    fn cast(&self, ctx: &Context, slot: usize, early: bool) -> Result<()> {
        self.watch.borrow_mut().mark_done(slot, early);
        let grad = &self.grads[slot];
        if grad.len() <= reduce::ONE_STAGE {
            // (biases and gains: the sum and the copy in one dispatch)
            let _op = ctx.op();
            let (half, x, sums) = (ctx.write(&self.halves[slot])?, ctx.read(grad)?, ctx.modify(&self.sums)?);
            elementwise::convert_scaled_summed(&ctx.kernels, &half, &x, &sums, slot, grad.len(), true)?;
        } else {
            super::clip::sum_of_squares(ctx, &self.sums, slot, grad)?;
            let _op = ctx.op();
            let (half, x, sums) = (ctx.write(&self.halves[slot])?, ctx.read(grad)?, ctx.read(&self.sums)?);
            elementwise::convert_scaled(&ctx.kernels, &half, &x, &sums, slot, grad.len(), true)?;
        }
        ctx.pager.forget(grad.id())?;
        // On its way down while backward goes on (the update reads it early in the next step,
        // or during this backward), and out of the GPU budget: only the host reads it.
        ctx.pager.hand_to_host(self.halves[slot].id())
    }

    /// Whether the gradient in `slot` has been cast in the backward under way.
    pub fn is_cast(&self, slot: usize) -> bool {
        self.watch.borrow().is_done(slot)
    }

    /// The tensor of the sums of squares (one f32 a parameter).
    pub fn sums_id(&self) -> TensorId {
        self.sums.id()
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
        let last = self.watch.borrow_mut().add(slot);
        if last {
            self.cast(ctx, slot, true)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_tail(values: &[f32], k: f32) -> Vec<u8> {
        values.iter().chain(&[k, 0.0]).flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect()
    }

    #[test]
    fn the_tail_carries_the_same_unscale_as_the_sum_for_every_exponent() {
        for e in 0..=255u32 {
            let ss = f32::from_bits(e << 23 | 0x2a_5a5a);
            let bytes = with_tail(&[1.5, -2.0, 0.25], grad_half_exponent(ss) as f32);
            let (values, unscale) = split_tail(&bytes, 3).unwrap();
            assert_eq!(values, &bytes[..6], "exponent bits {e}");
            assert_eq!(unscale.to_bits(), unscale_of(ss).to_bits(), "exponent bits {e}");
        }
    }

    #[test]
    fn a_tail_the_gpu_would_not_write_is_an_error() {
        let bytes = with_tail(&[1.0, 2.0], 3.0);
        assert!(split_tail(&bytes, 3).is_err(), "too short for three values and the tail");
        for k in [0.5, 200.0, f32::NAN, f32::INFINITY] {
            let e = split_tail(&with_tail(&[1.0], k), 1).unwrap_err();
            assert!(e.to_string().contains("f16 gradient"), "{k}: {e}");
        }
    }
}
