//! Causal multi-head self-attention as one fused op (`shaders/attention.wgsl`): the (B,H,T,T)
//! scores and probabilities are never stored — only the output and one log-sum-exp per query row
//! are kept for backward, which recomputes the scores tile by tile.

use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::attention::{self as k, Dims};
use crate::tensor::{DType, Tensor};

/// qkv (B,T,3C) → (B,T,C): `softmax(q·kᵀ/sqrt(D) + causal mask) · v` per head, C = H·D.
/// The output has qkv's element type (f32 or f16).
pub fn causal_self_attention(ctx: &Context, qkv: &Tensor, n_head: usize) -> Result<Tensor> {
    let [out, _lse] = causal_self_attention_keeping(ctx, qkv, n_head, None)?;
    Ok(out)
}

/// [`causal_self_attention`], returning its output and the log-sum-exps (B,H,T) its backward
/// reads. Given `kept`, those two from an earlier run on the same `qkv`, it records its backward
/// over them and computes nothing: a recomputed block keeps its attention rather than run it
/// again (`autograd::Replay::keep`; C + H values a token against the most costly kernel of
/// the block's forward).
pub fn causal_self_attention_keeping(
    ctx: &Context,
    qkv: &Tensor,
    n_head: usize,
    kept: Option<[Tensor; 2]>,
) -> Result<[Tensor; 2]> {
    let s = qkv.shape();
    if s.len() != 3 || !s[2].is_multiple_of(3) || n_head == 0 || !(s[2] / 3).is_multiple_of(n_head) {
        return Err(Error::shape("causal_self_attention", format!("(B,T,3C) with C divisible by {n_head} heads"), s));
    }
    let (b, t, c) = (s[0], s[1], s[2] / 3);
    let d = c / n_head;
    let dims = Dims { b, t, h: n_head, d, scale: 1.0 / (d as f32).sqrt() };
    let [out, lse] = match kept {
        Some([out, lse]) => {
            if out.shape() != [b, t, c] || out.dtype() != qkv.dtype() || lse.shape() != [b, n_head, t] {
                let expected = format!("output [{b}, {t}, {c}] {:?}, lse [{b}, {n_head}, {t}]", qkv.dtype());
                let got = format!("output {:?} {:?}, lse {:?}", out.shape(), out.dtype(), lse.shape());
                return Err(Error::shape("causal_self_attention (kept)", expected, got));
            }
            [out, lse]
        }
        None => {
            let out = ctx.empty("attention", &[b, t, c], qkv.dtype(), ctx.wants_grad(&[qkv]))?;
            let lse = ctx.empty("attn lse", &[b, n_head, t], DType::F32, false)?;
            let _op = ctx.op();
            k::forward(&ctx.kernels, &ctx.write(&out)?, &ctx.write(&lse)?, &ctx.read(qkv)?, dims)?;
            [out, lse]
        }
    };
    if out.requires_grad() {
        ctx.record(&[&out], AttentionBackward { qkv: qkv.clone(), out: out.clone(), lse: lse.clone(), dims });
    }
    Ok([out, lse])
}

struct AttentionBackward {
    qkv: Tensor,
    out: Tensor,
    lse: Tensor,
    dims: Dims,
}

impl Backward for AttentionBackward {
    fn name(&self) -> &'static str {
        "causal_self_attention"
    }

    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        // a new dqkv is written, not cleared and added to, where the kernel can
        let gradient = if k::overwrites(&ctx.kernels, self.qkv.dtype(), self.dims.d) {
            grads.of_written(ctx, &self.qkv)?
        } else {
            grads.of(ctx, &self.qkv)?.map(|g| (g, 1.0))
        };
        let Some((dqkv, beta)) = gradient else {
            return Ok(());
        };
        let Dims { b, t, h, .. } = self.dims;
        let delta = ctx.empty("attn delta", &[b, h, t], DType::F32, false)?;
        let _op = ctx.op();
        let accumulate = beta != 0.0;
        let dqkv = ctx.write_or_modify(&dqkv, accumulate)?;
        let (delta, qkv) = (ctx.write(&delta)?, ctx.read(&self.qkv)?);
        let (out, dout, lse) = (ctx.read(&self.out)?, ctx.read(&dout)?, ctx.read(&self.lse)?);
        k::backward(&ctx.kernels, &dqkv, &delta, &qkv, &out, &dout, &lse, self.dims, accumulate)
    }
}
