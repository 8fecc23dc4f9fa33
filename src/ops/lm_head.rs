//! The output head fused with its loss: mean softmax cross-entropy of `x · wteᵀ` (wte the tied
//! embedding), the (N,V) logits made a chunk of rows at a time — for GPT-2's 50257-token
//! vocabulary they are the largest tensor of a step. Backward needs each chunk's logits again:
//! they are kept where they fit easily ([`head_keeps_logits`]) and made again otherwise; or,
//! where the caller says which gradient its backward will start from
//! ([`lm_head_loss_for_backward`]), the gradients are made in forward while each chunk's
//! logits are at hand, and no logits are kept or made twice.

use std::cell::RefCell;

mod chunks;

use chunks::chunk_rows;
pub use chunks::{head_keeps_logits, logits_dtype};

use super::cross_entropy::{check_targets, mean_loss};
use super::elementwise::add_gradient;
use super::expect_float;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::cross_entropy::{self as k, Rows};
use crate::kernels::elementwise;
use crate::kernels::matmul::{self as mm, Gemm};
use crate::tensor::{DType, Tensor};

/// What the head's products read for wte: wte itself, or under mixed precision on cooperative
/// matrices a copy stored (C,V) in f16, rows padded with zeros to whole tiles
/// ([`head_padded_len`]): the logits' product runs NN on f16 operands (H200, GPT-2 small: 7.1
/// ms a step NT on the f32 wte), and with dlogits padded alike both backward products fetch
/// without bounds tests.
enum HeadWeight {
    Wte(Tensor),
    /// (C, V padded): its rows' length is the product's B stride.
    Transposed(Tensor),
}

impl HeadWeight {
    fn of(ctx: &Context, x: &Tensor, wte: &Tensor) -> Result<Self> {
        let (v, c) = (wte.shape()[0], wte.shape()[1]);
        if x.dtype() != DType::F16 || !mm::coop_pads_rows(&ctx.kernels, DType::F16, DType::F16) {
            return Ok(HeadWeight::Wte(wte.clone()));
        }
        let stride = head_padded_len(v);
        let t = ctx.empty("lm_head weight transposed", &[c, stride], DType::F16, false)?;
        let _op = ctx.op();
        crate::kernels::transpose::transpose_padded(&ctx.kernels, &ctx.write(&t)?, &ctx.read(wte)?, v, c, stride)?;
        Ok(HeadWeight::Transposed(t))
    }
}

/// Where the head pads V (with zeros) in dlogits' rows and the transposed weight's: whole
/// tiles for `matmul_coop` ([`mm::coop_padded_len`]), and a multiple of 1024 so that dx's deep
/// product splits into up to 16 K slices of whole depth steps ([`mm::split_k_deep`]; GPT-2:
/// 51200 instead of 50304 = 64·786, which splits only 2, 3 or 6 ways).
fn head_padded_len(v: usize) -> usize {
    mm::coop_padded_len(v).next_multiple_of(1024)
}

/// `logits = x · wteᵀ` for rows `r0..r0+n` of x (N,C) into `logits` (n,V).
fn head_chunk(ctx: &Context, logits: &Tensor, x: &Tensor, weight: &HeadWeight, r0: usize, n: usize) -> Result<()> {
    let c = x.last_dim();
    let v = logits.shape()[1];
    let _op = ctx.op();
    let (b, g) = match weight {
        HeadWeight::Wte(wte) => (wte, Gemm { trans_b: true, ..Gemm::new(n, v, c) }),
        HeadWeight::Transposed(t) => (t, Gemm { b_stride: t.shape()[1], ..Gemm::new(n, v, c) }),
    };
    let g = Gemm { offsets: [r0 * c, 0, 0], ..g };
    mm::matmul(&ctx.kernels, &ctx.write(logits)?, &ctx.read(x)?, &ctx.read(b)?, None, &ctx.dummy()?, g)
}

/// The output head and its loss in one: mean cross-entropy of `x · wteᵀ` against `targets`,
/// x (..., C) f32 or f16, wte (V,C) (the tied embedding). The logits are made a chunk of rows at a time,
/// and kept for backward or made again there ([`head_keeps_logits`]).
pub fn lm_head_loss(
    ctx: &Context,
    x: &Tensor,
    wte: &Tensor,
    targets: &[u32],
    ignore_index: Option<u32>,
) -> Result<Tensor> {
    head_loss(ctx, x, wte, targets, ignore_index, None)
}

/// What the caller of [`lm_head_loss_for_backward`] says of its backward.
#[derive(Clone, Copy)]
pub struct LossBackward<'a> {
    /// d loss: the backward starts from the loss with `ctx.backward(&loss, grads, seed)`.
    pub seed: f32,
    /// wte's gradient in that backward, where forward may add to it at once: nothing reads or
    /// clears it before that backward (a trainer's step without a delayed update). The
    /// backward must then be the one the seed says. Otherwise forward makes wte's gradient
    /// aside, and backward adds it (a (V,C) pass more, and one more such tensor held between).
    pub wte_grad: Option<&'a Tensor>,
}

/// [`lm_head_loss`] for a caller whose backward starts from the loss this returns (`backward`),
/// as a trainer's step does: the gradients of x and wte are made during forward, from each
/// chunk's logits as they are made, and handed to that backward. The logits' product runs once
/// instead of twice where a budget would make them again, and nothing of them is kept where it
/// would keep them. A backward that starts elsewhere, or with another seed, gets the same
/// gradients as from `lm_head_loss`, made again — or, where forward added to `wte_grad`, an
/// error.
pub fn lm_head_loss_for_backward(
    ctx: &Context,
    x: &Tensor,
    wte: &Tensor,
    targets: &[u32],
    ignore_index: Option<u32>,
    backward: LossBackward,
) -> Result<Tensor> {
    if let Some(g) = backward.wte_grad {
        if g.shape() != wte.shape() || g.dtype() != wte.dtype() {
            return Err(Error::shape("lm_head_loss wte_grad", wte.shape(), g.shape()));
        }
    }
    head_loss(ctx, x, wte, targets, ignore_index, Some(backward))
}

fn head_loss(
    ctx: &Context,
    x: &Tensor,
    wte: &Tensor,
    targets: &[u32],
    ignore_index: Option<u32>,
    backward: Option<LossBackward>,
) -> Result<Tensor> {
    expect_float("lm_head_loss", x)?;
    let (rows, c) = (x.rows(), x.last_dim());
    if wte.shape().len() != 2 || wte.shape()[1] != c {
        return Err(Error::shape("lm_head_loss", format!("wte (V,{c})"), wte.shape()));
    }
    let v = wte.shape()[0];
    let (ignore, inv_count) = check_targets(targets, rows, v, ignore_index)?;
    let targets = ctx.from_u32("targets", &[rows], targets)?;
    let loss = LossRows { targets, lse: ctx.empty("ce lse", &[rows], DType::F32, false)?, ignore, inv_count };
    let losses = ctx.empty("ce losses", &[rows], DType::F32, false)?;
    let wants_grad = ctx.wants_grad(&[x, wte]);
    let made = match backward.filter(|_| wants_grad) {
        Some(backward) => Some(MadeGrads::new(ctx, x, wte, backward)?),
        None => None,
    };
    let keep = wants_grad && made.is_none() && head_keeps_logits(ctx, rows, v, x.dtype());
    let per = chunk_rows(ctx, rows, v, keep || made.is_some(), logits_dtype(x.dtype()));
    let mut kept = Vec::new();
    let weight = HeadWeight::of(ctx, x, wte)?;
    for r0 in (0..rows).step_by(per) {
        let n = per.min(rows - r0);
        let logits = ctx.empty("logits chunk", &[n, v], logits_dtype(x.dtype()), false)?;
        head_chunk(ctx, &logits, x, &weight, r0, n)?;
        {
            let _op = ctx.op();
            let r = Rows { rows: n, v, ignore, row0: r0 };
            let (l, lse) = (ctx.modify(&losses)?, ctx.modify(&loss.lse)?);
            k::forward(&ctx.kernels, &l, &lse, &ctx.read(&logits)?, &ctx.read(&loss.targets)?, r)?;
        }
        if let Some(made) = &made {
            // the first chunk writes dwte, the others add to it
            let dx = made.dx.as_ref().map(|dx| (dx, 0.0, r0 != 0));
            let dwte = match &made.dwte {
                Some(Dwte::Aside(dwte)) => Some((dwte, if r0 == 0 { 0.0 } else { 1.0 })),
                Some(Dwte::Added(grad)) => Some((grad, 1.0)),
                None => None,
            };
            let head = Head { x, wte, weight: &weight };
            chunk_gradients(ctx, &head, &loss, &made.dloss, logits, r0, dx, dwte)?;
        } else if keep {
            kept.push(logits);
        }
    }
    let out = mean_loss(ctx, &losses, inv_count, wants_grad)?;
    if out.requires_grad() {
        // (gradients made here need no weight in backward; one made again there makes it again)
        let weight = RefCell::new(made.is_none().then_some(weight));
        let (x, wte, kept, made) = (x.clone(), wte.clone(), RefCell::new(kept), RefCell::new(made));
        ctx.record(&[&out], HeadLossBackward { x, wte, loss, out: out.clone(), per, kept, weight, made });
    }
    Ok(out)
}

/// The loss's per-row terms backward reads: targets, each row's log-sum-exp, and the mean's
/// ignored target and factor.
struct LossRows {
    targets: Tensor,
    lse: Tensor,
    ignore: u32,
    inv_count: f32,
}

/// The head's operands: x (N,C), wte (V,C), and what its products read for wte.
struct Head<'a> {
    x: &'a Tensor,
    wte: &'a Tensor,
    weight: &'a HeadWeight,
}

/// Gradients made in forward ([`lm_head_loss_for_backward`]) for a backward from the loss with
/// d loss = `seed`.
struct MadeGrads {
    seed: f32,
    /// (1) holding `seed`, which the cross-entropy's backward kernel reads as d loss.
    dloss: Tensor,
    /// x's gradient, and wte's, where they need one.
    dx: Option<Tensor>,
    dwte: Option<Dwte>,
}

/// Where forward puts wte's gradient.
enum Dwte {
    /// A tensor of its own, which backward adds to wte's gradient.
    Aside(Tensor),
    /// Added to wte's gradient already (`LossBackward::wte_grad`).
    Added(Tensor),
}

impl MadeGrads {
    fn new(ctx: &Context, x: &Tensor, wte: &Tensor, backward: LossBackward) -> Result<Self> {
        let dloss = ctx.empty("lm_head dloss", &[1], DType::F32, false)?;
        {
            let _op = ctx.op();
            elementwise::fill(&ctx.kernels, &ctx.write(&dloss)?, backward.seed, 1)?;
        }
        let dx = match x.requires_grad() {
            true => Some(ctx.empty("lm_head dx", x.shape(), x.dtype(), false)?),
            false => None,
        };
        let dwte = match (wte.requires_grad(), backward.wte_grad) {
            (false, _) => None,
            (true, Some(grad)) => Some(Dwte::Added(grad.clone())),
            (true, None) => Some(Dwte::Aside(ctx.empty("lm_head dwte", wte.shape(), wte.dtype(), false)?)),
        };
        Ok(MadeGrads { seed: backward.seed, dloss, dx, dwte })
    }

    /// Makes each gradient the gradient of its tensor in `grads`, or adds it there where that
    /// tensor has one already (a parameter's, accumulating); wte's added already must be the
    /// one `grads` holds.
    fn hand_over(self, ctx: &Context, grads: &mut Grads, x: &Tensor, wte: &Tensor) -> Result<()> {
        let dwte = match self.dwte {
            Some(Dwte::Added(added)) => {
                // (asked for all the same: the op that added to it is this one)
                if grads.of(ctx, wte)?.is_none_or(|g| g.id() != added.id()) {
                    return Err(Error::invalid(
                        "lm_head_loss backward",
                        "the gradient of wte in this backward is not the one forward added to (LossBackward::wte_grad)",
                    ));
                }
                None
            }
            Some(Dwte::Aside(dwte)) => Some(dwte),
            None => None,
        };
        for (t, made) in [(x, self.dx), (wte, dwte)] {
            if let Some(made) = made {
                add_gradient(ctx, grads, t, &made, 1.0)?;
            }
        }
        Ok(())
    }
}

/// dx[chunk] = dlogits · wte (`g`; `padded_k`: the length of dlogits' and the weight's zero-padded
/// rows, over which the product may run as deep as it likes). A chunk of rows has few output
/// tiles over a K of V, so where the product runs on cooperative matrices it is split into K
/// slices that fill the GPU ([`mm::split_k_deep`]).
fn head_dx(
    ctx: &Context,
    dx: &Tensor,
    dx_written: bool,
    dlogits: &Tensor,
    b: &Tensor,
    g: Gemm,
    padded_k: Option<usize>,
) -> Result<()> {
    let _op = ctx.op();
    let (dxv, av, bv, dummy) = (ctx.write_or_modify(dx, dx_written)?, ctx.read(dlogits)?, ctx.read(b)?, ctx.dummy()?);
    let deep = Gemm { k: padded_k.unwrap_or(g.k), ..g };
    let variant = mm::for_operands(&ctx.kernels, mm::pick(ctx.kernels.tuning.matmul, &deep), &av, &bv);
    let splits = if padded_k.is_some() { mm::split_k_deep(variant, &deep) } else { 1 };
    if splits == 1 {
        return mm::matmul(&ctx.kernels, &dxv, &av, &bv, None, &dummy, g);
    }
    let parts = ctx.empty("head dx partials", &[splits, g.m * g.n], DType::F32, false)?;
    let ones = ctx.from_f32("head dx ones", &[splits], &vec![1.0; splits], false)?;
    let (pv, ov) = (ctx.write(&parts)?, ctx.read(&ones)?);
    mm::matmul_split_deep(&ctx.kernels, &dxv, &av, &bv, &pv, &ov, &dummy, splits, deep)
}

/// The gradients from rows `r0..r0+n` of the loss, given their logits (dropped once read):
/// dlogits = dloss · (softmax − onehot) · inv_count, then dx[rows] (`dx`: the tensor, its beta,
/// and whether it was written before) and dwte (`dwte`: the tensor and its beta; 0 writes it).
#[allow(clippy::too_many_arguments)]
fn chunk_gradients(
    ctx: &Context,
    head: &Head,
    loss: &LossRows,
    dloss: &Tensor,
    logits: Tensor,
    r0: usize,
    dx: Option<(&Tensor, f32, bool)>,
    dwte: Option<(&Tensor, f32)>,
) -> Result<()> {
    let (n, v, c) = (logits.shape()[0], logits.shape()[1], head.x.last_dim());
    // dlogits rows padded with zeros to whole tiles where both products run on cooperative
    // matrices, which then read them 8 halves at a time and without bounds tests
    let (xt, wt) = (head.x.dtype(), head.wte.dtype());
    let pad = mm::coop_pads_rows(&ctx.kernels, xt, wt) && mm::coop_pads_rows(&ctx.kernels, xt, xt);
    let stride = if pad { head_padded_len(v) } else { v };
    let a_stride = if stride == v { 0 } else { stride };
    // Under mixed precision (f16 x) dlogits are f16 too, so both products below run on tensor
    // cores; the loss scale keeps their small values in f16's range. Written whole by the
    // kernel: no clearing.
    let dlogits = ctx.empty("dlogits chunk", &[n, stride], head.x.dtype(), false)?;
    {
        let _op = ctx.op();
        let r = Rows { rows: n, v, ignore: loss.ignore, row0: r0 };
        let (d, l, t, lse, dl) = (
            ctx.write(&dlogits)?,
            ctx.read(&logits)?,
            ctx.read(&loss.targets)?,
            ctx.read(&loss.lse)?,
            ctx.read(dloss)?,
        );
        k::backward_write(&ctx.kernels, &d, &l, &t, &lse, &dl, r, loss.inv_count, stride)?;
    }
    drop(logits);
    if let Some((dx, beta, written)) = dx {
        let g = Gemm { beta, offsets: [0, 0, r0 * c], a_stride, ..Gemm::new(n, c, v) };
        // wte itself, or its padded copy read transposed (its K padding is zeros, as dlogits':
        // the product may run over all of it)
        let (b, g, padded_k) = match head.weight {
            HeadWeight::Transposed(t) if pad => (t, Gemm { trans_b: true, b_stride: t.shape()[1], ..g }, Some(stride)),
            _ => (head.wte, g, None),
        };
        head_dx(ctx, dx, written, &dlogits, b, g, padded_k)?;
    }
    if let Some((dwte, beta)) = dwte {
        let _op = ctx.op();
        let g = Gemm { beta, trans_a: true, offsets: [0, r0 * c, 0], a_stride, ..Gemm::new(v, c, n) };
        let (a, b, dummy) = (ctx.read(&dlogits)?, ctx.read(head.x)?, ctx.dummy()?);
        mm::matmul(&ctx.kernels, &ctx.write_or_modify(dwte, beta != 0.0)?, &a, &b, None, &dummy, g)?;
    }
    Ok(())
}

struct HeadLossBackward {
    x: Tensor,
    wte: Tensor,
    loss: LossRows,
    out: Tensor,
    per: usize,
    /// The forward's logits, a tensor per chunk, where it kept them (taken by backward, which
    /// frees each after use); empty where backward makes them again.
    kept: RefCell<Vec<Tensor>>,
    /// The forward's [`HeadWeight`] (taken by backward; None where forward made the gradients).
    weight: RefCell<Option<HeadWeight>>,
    /// The gradients forward made, for a backward from `out` with their seed (taken by backward).
    made: RefCell<Option<MadeGrads>>,
}

impl Backward for HeadLossBackward {
    fn name(&self) -> &'static str {
        "lm_head_loss"
    }

    // The forward's gradients where this backward started from `out` with their seed; else per
    // chunk: logits again, dlogits = dloss · (softmax − onehot) / count, then
    // dx[chunk] += dlogits · wte and dwte += dlogitsᵀ · x[chunk].
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dloss) = grads.get(&self.out) else {
            return Ok(());
        };
        if let Some(made) = self.made.borrow_mut().take() {
            if ctx.backward_root() == Some((self.out.id(), made.seed)) {
                return made.hand_over(ctx, grads, &self.x, &self.wte);
            }
            if let Some(Dwte::Added(_)) = made.dwte {
                // making them again would add wte's twice
                return Err(Error::invalid(
                    "lm_head_loss backward",
                    format!("forward added to wte's gradient for a backward from the loss with d loss {}", made.seed),
                ));
            }
        }
        // the chunks' products write disjoint rows of dx: a new dx is written, not cleared
        let dx = grads.of_written(ctx, &self.x)?;
        let dwte = grads.of(ctx, &self.wte)?;
        let rows = self.x.rows();
        let kept = std::mem::take(&mut *self.kept.borrow_mut());
        let weight = match self.weight.borrow_mut().take() {
            Some(weight) => weight,
            None => HeadWeight::of(ctx, &self.x, &self.wte)?,
        };
        let head = Head { x: &self.x, wte: &self.wte, weight: &weight };
        let mut kept = kept.into_iter();
        for r0 in (0..rows).step_by(self.per) {
            let n = self.per.min(rows - r0);
            let logits = match kept.next() {
                Some(logits) => logits,
                None => {
                    let v = self.wte.shape()[0];
                    let logits = ctx.empty("logits chunk", &[n, v], logits_dtype(self.x.dtype()), false)?;
                    head_chunk(ctx, &logits, &self.x, &weight, r0, n)?;
                    logits
                }
            };
            // (only the first chunk of a new dx may take it as unwritten)
            let dx = dx.as_ref().map(|(dx, beta)| (dx, *beta, *beta != 0.0 || r0 != 0));
            let dwte = dwte.as_ref().map(|dwte| (dwte, 1.0));
            chunk_gradients(ctx, &head, &self.loss, &dloss, logits, r0, dx, dwte)?;
        }
        Ok(())
    }
}
