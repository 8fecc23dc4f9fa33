//! Softmax cross-entropy on given logits, mean over the rows whose target is not ignored. The
//! output head fused with its loss is `lm_head.rs`.

use super::expect_f32;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::cross_entropy::{self as k, Rows};
use crate::kernels::reduce;
use crate::tensor::{DType, Tensor};

/// Checks targets against `v` classes; returns (ignore id, 1 / number of counted rows).
pub(super) fn check_targets(targets: &[u32], rows: usize, v: usize, ignore_index: Option<u32>) -> Result<(u32, f32)> {
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
pub(super) fn mean_loss(ctx: &Context, losses: &Tensor, inv_count: f32, requires_grad: bool) -> Result<Tensor> {
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
