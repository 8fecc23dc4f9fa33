//! Softmax cross-entropy, mean over the rows whose target is not ignored: on given logits, or
//! fused with the output head (`lm_head_loss`), which makes the (N,V) logits a chunk at a time —
//! for GPT-2's 50257-token vocabulary they are the largest tensor of a step — and keeps them for
//! backward only where they fit easily ([`head_keeps_logits`]).

use std::cell::RefCell;

use super::{expect_f32, expect_float};
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::cross_entropy::{self as k, Rows};
use crate::kernels::matmul::{self as mm, Gemm};
use crate::kernels::reduce;
use crate::tensor::{DType, Tensor};

/// Checks targets against `v` classes; returns (ignore id, 1 / number of counted rows).
fn check_targets(targets: &[u32], rows: usize, v: usize, ignore_index: Option<u32>) -> Result<(u32, f32)> {
    if targets.len() != rows {
        return Err(Error::shape("cross_entropy", format!("{rows} targets"), targets.len()));
    }
    let ignore = ignore_index.unwrap_or(u32::MAX);
    if let Some((i, &t)) = targets.iter().enumerate().find(|(_, &t)| t != ignore && t as usize >= v) {
        return Err(Error::invalid(
            "cross_entropy target",
            format!("target {t} at row {i} is not below the {v} classes"),
        ));
    }
    let count = targets.iter().filter(|&&t| t != ignore).count();
    Ok((ignore, if count == 0 { 0.0 } else { 1.0 / count as f32 }))
}

/// loss[0] = inv_count · Σ losses.
fn mean_loss(ctx: &Context, losses: &Tensor, inv_count: f32, requires_grad: bool) -> Result<Tensor> {
    let out = ctx.empty("loss", &[1], DType::F32, requires_grad)?;
    let _op = ctx.op();
    let spec = reduce::SumSpec { squares: false, scale: inv_count, slot: 0, accumulate: false };
    reduce::sum(&ctx.kernels, &ctx.write(&out)?, &ctx.read(losses)?, &ctx.partials()?, losses.len(), spec)?;
    Ok(out)
}

/// logits (..., V), targets (rows) → scalar mean loss over rows whose target ≠ `ignore_index`.
pub fn cross_entropy(ctx: &Context, logits: &Tensor, targets: &[u32], ignore_index: Option<u32>) -> Result<Tensor> {
    expect_f32("cross_entropy", logits)?;
    let (rows, v) = (logits.rows(), logits.last_dim());
    let (ignore, inv_count) = check_targets(targets, rows, v, ignore_index)?;
    let targets = ctx.from_u32("targets", &[rows], targets)?;
    let losses = ctx.empty("ce losses", &[rows], DType::F32, false)?;
    let lse = ctx.empty("ce lse", &[rows], DType::F32, false)?;
    {
        let _op = ctx.op();
        let r = Rows { rows, v, ignore, row0: 0 };
        k::forward(&ctx.kernels, &ctx.write(&losses)?, &ctx.write(&lse)?, &ctx.read(logits)?, &ctx.read(&targets)?, r)?;
    }
    let out = mean_loss(ctx, &losses, inv_count, ctx.wants_grad(&[logits]))?;
    if out.requires_grad() {
        ctx.record(
            &[&out],
            CrossEntropyBackward { logits: logits.clone(), targets, lse, out: out.clone(), ignore, inv_count },
        );
    }
    Ok(out)
}

struct CrossEntropyBackward {
    logits: Tensor,
    targets: Tensor,
    lse: Tensor,
    out: Tensor,
    ignore: u32,
    inv_count: f32,
}

impl Backward for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dloss) = grads.get(&self.out) else {
            return Ok(());
        };
        let Some(dlogits) = grads.of(ctx, &self.logits)? else {
            return Ok(());
        };
        let _op = ctx.op();
        let r = Rows { rows: self.logits.rows(), v: self.logits.last_dim(), ignore: self.ignore, row0: 0 };
        let (d, l, t, lse, dl) = (
            ctx.modify(&dlogits)?,
            ctx.read(&self.logits)?,
            ctx.read(&self.targets)?,
            ctx.read(&self.lse)?,
            ctx.read(&dloss)?,
        );
        k::backward(&ctx.kernels, &d, &l, &t, &lse, &dl, r, self.inv_count)
    }
}

/// Rows of logits computed at once: at most an eighth of the GPU budget and one storage binding,
/// and 1 GiB where backward makes them again, split evenly. Chunks must be tall: backward's
/// dx[chunk] = dlogits · wte has only rows/128 × C/128 output tiles over a K of V, so short chunks
/// leave most of a GPU idle (GPT-2, 8 × 1024 rows: 64 MiB chunks of 333 rows gave 18 tiles, 1 GiB
/// gives two of 4096; on cooperative matrices dx now splits along K instead, [`head_dx`], but
/// dwte still rewrites all of itself once a chunk). Kept logits are all held anyway, so they
/// come in the tallest chunks (H200, f16 dx: 8192×768×50264 NN 113.6 TFLOP/s against 85.2 at
/// 4096 rows).
fn chunk_rows(ctx: &Context, rows: usize, v: usize, keep: bool) -> usize {
    let cap = if keep { u64::MAX } else { 1 << 30 };
    let target = cap.min(ctx.pager.budget() / 8).min(ctx.gpu.max_binding_bytes());
    let most = ((target / (v as u64 * 4)) as usize).clamp(1, rows.max(1));
    rows.max(1).div_ceil(rows.max(1).div_ceil(most))
}

/// Whether `lm_head_loss` keeps the forward's logits (`rows` × `v` f32) for backward instead of
/// making them again there: where all of them fit in an eighth of the GPU budget. GPT-2 small at
/// 8 × 1024 rows keeps 1.6 GB on a large GPU and saves backward two products of 316 GFLOP (H200,
/// f32 at 41 TFLOP/s: 15 ms a step); a paged run makes them again rather than page them.
pub fn head_keeps_logits(ctx: &Context, rows: usize, v: usize) -> bool {
    rows as u64 * v as u64 * 4 <= ctx.pager.budget() / 8
}

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
    expect_float("lm_head_loss", x)?;
    let (rows, c) = (x.rows(), x.last_dim());
    if wte.shape().len() != 2 || wte.shape()[1] != c {
        return Err(Error::shape("lm_head_loss", format!("wte (V,{c})"), wte.shape()));
    }
    let v = wte.shape()[0];
    let (ignore, inv_count) = check_targets(targets, rows, v, ignore_index)?;
    let targets = ctx.from_u32("targets", &[rows], targets)?;
    let losses = ctx.empty("ce losses", &[rows], DType::F32, false)?;
    let lse = ctx.empty("ce lse", &[rows], DType::F32, false)?;
    let wants_grad = ctx.wants_grad(&[x, wte]);
    let keep = wants_grad && head_keeps_logits(ctx, rows, v);
    let per = chunk_rows(ctx, rows, v, keep);
    let mut kept = Vec::new();
    let weight = HeadWeight::of(ctx, x, wte)?;
    for r0 in (0..rows).step_by(per) {
        let n = per.min(rows - r0);
        let logits = ctx.empty("logits chunk", &[n, v], DType::F32, false)?;
        head_chunk(ctx, &logits, x, &weight, r0, n)?;
        let _op = ctx.op();
        let r = Rows { rows: n, v, ignore, row0: r0 };
        k::forward(
            &ctx.kernels,
            &ctx.modify(&losses)?,
            &ctx.modify(&lse)?,
            &ctx.read(&logits)?,
            &ctx.read(&targets)?,
            r,
        )?;
        if keep {
            kept.push(logits);
        }
    }
    let out = mean_loss(ctx, &losses, inv_count, wants_grad)?;
    if out.requires_grad() {
        let (x, wte, kept) = (x.clone(), wte.clone(), RefCell::new(kept));
        let weight = RefCell::new(Some(weight));
        let node = HeadLossBackward { x, wte, targets, lse, out: out.clone(), ignore, inv_count, per, kept, weight };
        ctx.record(&[&out], node);
    }
    Ok(out)
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

struct HeadLossBackward {
    x: Tensor,
    wte: Tensor,
    targets: Tensor,
    lse: Tensor,
    out: Tensor,
    ignore: u32,
    inv_count: f32,
    per: usize,
    /// The forward's logits, a tensor per chunk, where it kept them (taken by backward, which
    /// frees each after use); empty where backward makes them again.
    kept: RefCell<Vec<Tensor>>,
    /// The forward's [`HeadWeight`] (taken by backward).
    weight: RefCell<Option<HeadWeight>>,
}

impl Backward for HeadLossBackward {
    fn name(&self) -> &'static str {
        "lm_head_loss"
    }

    // Per chunk: logits again, dlogits = dloss · (softmax − onehot) / count, then
    // dx[chunk] += dlogits · wte and dwte += dlogitsᵀ · x[chunk].
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dloss) = grads.get(&self.out) else {
            return Ok(());
        };
        // the chunks' products write disjoint rows of dx: a new dx is written, not cleared
        let dx = grads.of_written(ctx, &self.x)?;
        let dwte = grads.of(ctx, &self.wte)?;
        let (rows, c, v) = (self.x.rows(), self.x.last_dim(), self.wte.shape()[0]);
        // dlogits rows padded with zeros to whole tiles where both products run on cooperative
        // matrices, which then read them 8 halves at a time and without bounds tests
        let (xt, wt) = (self.x.dtype(), self.wte.dtype());
        let pad = mm::coop_pads_rows(&ctx.kernels, xt, wt) && mm::coop_pads_rows(&ctx.kernels, xt, xt);
        let stride = if pad { head_padded_len(v) } else { v };
        let a_stride = if stride == v { 0 } else { stride };
        let kept = std::mem::take(&mut *self.kept.borrow_mut());
        let weight = match self.weight.borrow_mut().take() {
            Some(weight) => weight,
            None => HeadWeight::of(ctx, &self.x, &self.wte)?,
        };
        let mut kept = kept.into_iter();
        for r0 in (0..rows).step_by(self.per) {
            let n = self.per.min(rows - r0);
            let logits = match kept.next() {
                Some(logits) => logits,
                None => {
                    let logits = ctx.empty("logits chunk", &[n, v], DType::F32, false)?;
                    head_chunk(ctx, &logits, &self.x, &weight, r0, n)?;
                    logits
                }
            };
            // Under mixed precision (f16 x) dlogits are f16 too, so both products below run
            // on tensor cores; the loss scale keeps their small values in f16's range.
            // written whole by the kernel: no clearing
            let dlogits = ctx.empty("dlogits chunk", &[n, stride], self.x.dtype(), false)?;
            {
                let _op = ctx.op();
                let r = Rows { rows: n, v, ignore: self.ignore, row0: r0 };
                let (d, l, t, lse, dl) = (
                    ctx.write(&dlogits)?,
                    ctx.read(&logits)?,
                    ctx.read(&self.targets)?,
                    ctx.read(&self.lse)?,
                    ctx.read(&dloss)?,
                );
                k::backward_write(&ctx.kernels, &d, &l, &t, &lse, &dl, r, self.inv_count, stride)?;
            }
            drop(logits);
            if let Some((dx, beta)) = &dx {
                let g = Gemm { beta: *beta, offsets: [0, 0, r0 * c], a_stride, ..Gemm::new(n, c, v) };
                // wte itself, or its padded copy read transposed (its K padding is zeros, as
                // dlogits': the product may run over all of it)
                let (b, g, padded_k) = match &weight {
                    HeadWeight::Transposed(t) if pad => {
                        (t, Gemm { trans_b: true, b_stride: t.shape()[1], ..g }, Some(stride))
                    }
                    _ => (&self.wte, g, None),
                };
                // (only the first chunk of a new dx may take it as unwritten)
                head_dx(ctx, dx, *beta != 0.0 || r0 != 0, &dlogits, b, g, padded_k)?;
            }
            if let Some(dwte) = &dwte {
                let _op = ctx.op();
                let g = Gemm { beta: 1.0, trans_a: true, offsets: [0, r0 * c, 0], a_stride, ..Gemm::new(v, c, n) };
                mm::matmul(
                    &ctx.kernels,
                    &ctx.modify(dwte)?,
                    &ctx.read(&dlogits)?,
                    &ctx.read(&self.x)?,
                    None,
                    &ctx.dummy()?,
                    g,
                )?;
            }
        }
        Ok(())
    }
}
