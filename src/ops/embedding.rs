//! Token + position embedding (GPT-2's input layer).

use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::embedding as k;
use crate::tensor::{DType, Tensor};

/// tokens (B,T) u32, wte (V,C), wpe (maxT,C) → (B,T,C) = wte[tokens] + wpe[t]. Token ids must be
/// < V (checked where they are read from data, before upload).
pub fn embedding(ctx: &Context, tokens: &Tensor, wte: &Tensor, wpe: &Tensor) -> Result<Tensor> {
    let ts = tokens.shape();
    if tokens.dtype() != DType::U32 || ts.len() != 2 {
        return Err(Error::shape("embedding", "u32 tokens (B,T)", tokens));
    }
    if wte.shape().len() != 2 || wpe.shape().len() != 2 || wte.shape()[1] != wpe.shape()[1] {
        return Err(Error::shape("embedding", "wte (V,C) and wpe (maxT,C)", (wte.shape(), wpe.shape())));
    }
    let (b, t, c) = (ts[0], ts[1], wte.shape()[1]);
    if t > wpe.shape()[0] {
        return Err(Error::shape("embedding", format!("T <= {} positions", wpe.shape()[0]), t));
    }
    let out = ctx.empty("embedding", &[b, t, c], DType::F32, ctx.wants_grad(&[wte, wpe]))?;
    {
        let _op = ctx.op();
        k::forward(&ctx.kernels, &ctx.write(&out)?, &ctx.read(tokens)?, &ctx.read(wte)?, &ctx.read(wpe)?, b * t, t, c)?;
    }
    if out.requires_grad() {
        ctx.record(
            &[&out],
            EmbeddingBackward { tokens: tokens.clone(), wte: wte.clone(), wpe: wpe.clone(), out: out.clone() },
        );
    }
    Ok(out)
}

struct EmbeddingBackward {
    tokens: Tensor,
    wte: Tensor,
    wpe: Tensor,
    out: Tensor,
}

impl Backward for EmbeddingBackward {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        let _op = ctx.op();
        let dwte = grads.of(ctx, &self.wte)?.map(|g| ctx.modify(&g)).transpose()?;
        let dwpe = grads.of(ctx, &self.wpe)?.map(|g| ctx.modify(&g)).transpose()?;
        let s = self.out.shape();
        let (n, t, c) = (s[0] * s[1], s[1], s[2]);
        let links = ctx.empty("embedding links", &[n], DType::U32, false)?;
        let links = ctx.write(&links)?;
        let (tokens, dout) = (ctx.read(&self.tokens)?, ctx.read(&dout)?);
        k::backward(&ctx.kernels, dwte.as_ref(), dwpe.as_ref(), &links, &tokens, &dout, n, t, c)
    }
}
