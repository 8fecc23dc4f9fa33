//! Causal multi-head self-attention, composed of head split, two batched matmuls, a causal
//! scaled softmax and head merge. The (B,H,T,T) attention probabilities are saved for backward.
//! Each stage is its own op scope, so only its operands need to be on the GPU together.

use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::attention::{self as k, Dims};
use crate::kernels::matmul::{self as mm, Gemm};
use crate::kernels::softmax;
use crate::tensor::{DType, Tensor};

/// Per-head batched product `c = op(a) · op(b)` (+ c when accumulating), as one op scope.
fn heads_matmul(ctx: &Context, c: &Tensor, a: &Tensor, b: &Tensor, g: Gemm) -> Result<()> {
    let _op = ctx.op();
    let cv = if g.beta == 0.0 { ctx.write(c)? } else { ctx.modify(c)? };
    mm::matmul(&ctx.kernels, &cv, &ctx.read(a)?, &ctx.read(b)?, None, &ctx.dummy()?, g)
}

fn gemm(batch: usize, m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> Gemm {
    Gemm { batch, m, n, k, trans_a, trans_b, alpha: 1.0, beta: 0.0, offsets: [0; 3] }
}

/// Bytes of attention scores one chunk of batch entries may hold: the (b,H,T,T) scores are the
/// largest tensors of a step, so attention runs a few batch entries at a time, each chunk its
/// own set of tensors that the pager can place and evict on their own.
fn chunk_entries(ctx: &Context, h: usize, t: usize, b: usize) -> usize {
    let target = (64u64 << 20).min(ctx.pager.budget() / 8).max(1);
    ((target / (h * t * t * 4).max(1) as u64) as usize).clamp(1, b)
}

/// The saved tensors of one chunk of batch entries.
struct Chunk {
    dims: Dims,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    att: Tensor,
}

/// qkv (B,T,3C) → (B,T,C): `softmax(q·kᵀ/sqrt(D) + causal mask) · v` per head, C = H·D.
pub fn causal_self_attention(ctx: &Context, qkv: &Tensor, n_head: usize) -> Result<Tensor> {
    let s = qkv.shape();
    if s.len() != 3 || !s[2].is_multiple_of(3) || n_head == 0 || !(s[2] / 3).is_multiple_of(n_head) {
        return Err(Error::shape("causal_self_attention", format!("(B,T,3C) with C divisible by {n_head} heads"), s));
    }
    let (b, t, c) = (s[0], s[1], s[2] / 3);
    let d = c / n_head;
    let scale = 1.0 / (d as f32).sqrt();
    let out = ctx.empty("attention", &[b, t, c], DType::F32, ctx.wants_grad(&[qkv]))?;
    let per = chunk_entries(ctx, n_head, t, b);
    let mut chunks = Vec::new();
    for first in (0..b).step_by(per) {
        let nb = per.min(b - first);
        let dims = Dims { b: nb as u32, t: t as u32, h: n_head as u32, d: d as u32, first: first as u32, _pad: [0; 3] };
        let bh = nb * n_head;
        let heads = [nb, n_head, t, d];
        let q = ctx.empty("attn q", &heads, DType::F32, false)?;
        let kk = ctx.empty("attn k", &heads, DType::F32, false)?;
        let v = ctx.empty("attn v", &heads, DType::F32, false)?;
        {
            let _op = ctx.op();
            k::split(&ctx.kernels, &ctx.write(&q)?, &ctx.write(&kk)?, &ctx.write(&v)?, &ctx.read(qkv)?, dims)?;
        }
        // scores = q · kᵀ, probs = causal softmax(scores / sqrt(D))
        let preatt = ctx.empty("attn scores", &[nb, n_head, t, t], DType::F32, false)?;
        heads_matmul(ctx, &preatt, &q, &kk, gemm(bh, t, t, d, false, true))?;
        let att = ctx.empty("attn probs", &[nb, n_head, t, t], DType::F32, false)?;
        {
            let _op = ctx.op();
            softmax::forward(&ctx.kernels, &ctx.write(&att)?, &ctx.read(&preatt)?, bh * t, t, t, scale)?;
        }
        drop(preatt);
        // y = probs · v, merged into this chunk's rows of (B,T,C)
        let y = ctx.empty("attn y", &heads, DType::F32, false)?;
        heads_matmul(ctx, &y, &att, &v, gemm(bh, t, d, t, false, false))?;
        {
            let _op = ctx.op();
            k::merge(&ctx.kernels, &ctx.modify(&out)?, &ctx.read(&y)?, dims)?;
        }
        if out.requires_grad() {
            chunks.push(Chunk { dims, q, k: kk, v, att });
        }
    }
    if out.requires_grad() {
        ctx.record(&[&out], AttentionBackward { qkv: qkv.clone(), chunks, out: out.clone(), scale });
    }
    Ok(out)
}

struct AttentionBackward {
    qkv: Tensor,
    chunks: Vec<Chunk>,
    out: Tensor,
    scale: f32,
}

impl Backward for AttentionBackward {
    fn name(&self) -> &'static str {
        "causal_self_attention"
    }

    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else {
            return Ok(());
        };
        let Some(dqkv) = grads.of(ctx, &self.qkv)? else {
            return Ok(());
        };
        for chunk in self.chunks.iter().rev() {
            let dims = chunk.dims;
            let (b, t, h, d) = (dims.b as usize, dims.t as usize, dims.h as usize, dims.d as usize);
            let bh = b * h;
            let heads = [b, h, t, d];
            let dy = ctx.zeros("attn dy", &heads, false)?;
            {
                let _op = ctx.op();
                k::merge_backward(&ctx.kernels, &ctx.modify(&dy)?, &ctx.read(&dout)?, dims)?;
            }
            // y = att · v: datt = dy · vᵀ, dv = attᵀ · dy
            let datt = ctx.empty("attn dprobs", &[b, h, t, t], DType::F32, false)?;
            heads_matmul(ctx, &datt, &dy, &chunk.v, gemm(bh, t, t, d, false, true))?;
            let dv = ctx.empty("attn dv", &heads, DType::F32, false)?;
            heads_matmul(ctx, &dv, &chunk.att, &dy, gemm(bh, t, d, t, true, false))?;
            drop(dy);
            // scores → probs: dscores = scale · softmax'(datt)
            let dpre = ctx.zeros("attn dscores", &[b, h, t, t], false)?;
            {
                let _op = ctx.op();
                softmax::backward(
                    &ctx.kernels,
                    &ctx.modify(&dpre)?,
                    &ctx.read(&chunk.att)?,
                    &ctx.read(&datt)?,
                    bh * t,
                    t,
                    t,
                    self.scale,
                )?;
            }
            drop(datt);
            // scores = q · kᵀ: dq = dscores · k, dk = dscoresᵀ · q
            let dq = ctx.empty("attn dq", &heads, DType::F32, false)?;
            heads_matmul(ctx, &dq, &dpre, &chunk.k, gemm(bh, t, d, t, false, false))?;
            let dk = ctx.empty("attn dk", &heads, DType::F32, false)?;
            heads_matmul(ctx, &dk, &dpre, &chunk.q, gemm(bh, t, d, t, true, false))?;
            let _op = ctx.op();
            k::split_backward(
                &ctx.kernels,
                &ctx.modify(&dqkv)?,
                &ctx.read(&dq)?,
                &ctx.read(&dk)?,
                &ctx.read(&dv)?,
                dims,
            )?;
        }
        Ok(())
    }
}
