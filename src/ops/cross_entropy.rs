//! Softmax cross-entropy, mean over the rows whose target is not ignored.

use super::expect_f32;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::{cross_entropy as k, reduce};
use crate::tensor::{DType, Tensor};

/// logits (..., V), targets (rows) → scalar mean loss over rows whose target ≠ `ignore_index`.
/// Targets must be < V (or the ignore index).
pub fn cross_entropy(
    ctx: &Context,
    logits: &Tensor,
    targets: &[u32],
    ignore_index: Option<u32>,
) -> Result<Tensor> {
    expect_f32("cross_entropy", logits)?;
    let (rows, v) = (logits.rows(), logits.last_dim());
    if targets.len() != rows {
        return Err(Error::shape(
            "cross_entropy",
            format!("{rows} targets"),
            targets.len(),
        ));
    }
    let ignore = ignore_index.unwrap_or(u32::MAX);
    if let Some((i, &t)) = targets
        .iter()
        .enumerate()
        .find(|(_, &t)| t != ignore && t as usize >= v)
    {
        return Err(Error::invalid(
            "cross_entropy target",
            format!("target {t} at row {i} is not below the {v} classes"),
        ));
    }
    let count = targets.iter().filter(|&&t| t != ignore).count();
    let inv_count = if count == 0 { 0.0 } else { 1.0 / count as f32 };
    let targets = ctx.from_u32("targets", &[rows], targets)?;
    let losses = ctx.empty("ce losses", &[rows], DType::F32, false)?;
    let lse = ctx.empty("ce lse", &[rows], DType::F32, false)?;
    let kern = &ctx.kernels;
    let _op = ctx.op();
    k::forward(
        kern,
        &ctx.write(&losses)?,
        &ctx.write(&lse)?,
        &ctx.read(logits)?,
        &ctx.read(&targets)?,
        rows,
        v,
        ignore,
    )?;
    let out = ctx.empty("loss", &[1], DType::F32, ctx.wants_grad(&[logits]))?;
    let spec = reduce::SumSpec {
        squares: false,
        scale: inv_count,
        slot: 0,
        accumulate: false,
    };
    reduce::sum(
        kern,
        &ctx.write(&out)?,
        &ctx.read(&losses)?,
        &ctx.partials()?,
        rows,
        spec,
    )?;
    if out.requires_grad() {
        ctx.record(
            &[&out],
            CrossEntropyBackward {
                logits: logits.clone(),
                targets,
                lse,
                out: out.clone(),
                ignore,
                inv_count,
            },
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
        k::backward(
            &ctx.kernels,
            &ctx.modify(&dlogits)?,
            &ctx.read(&self.logits)?,
            &ctx.read(&self.targets)?,
            &ctx.read(&self.lse)?,
            &ctx.read(&dloss)?,
            self.logits.rows(),
            self.logits.last_dim(),
            self.ignore,
            self.inv_count,
        )
    }
}
