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
    let cv = if g.beta == 0.0 {
        ctx.write(c)?
    } else {
        ctx.modify(c)?
    };
    mm::matmul(
        &ctx.kernels,
        &cv,
        &ctx.read(a)?,
        &ctx.read(b)?,
        None,
        &ctx.dummy()?,
        g,
    )
}

fn gemm(batch: usize, m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> Gemm {
    Gemm {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
        alpha: 1.0,
        beta: 0.0,
    }
}

/// qkv (B,T,3C) → (B,T,C): `softmax(q·kᵀ/sqrt(D) + causal mask) · v` per head, C = H·D.
pub fn causal_self_attention(ctx: &Context, qkv: &Tensor, n_head: usize) -> Result<Tensor> {
    let s = qkv.shape();
    if s.len() != 3 || s[2] % 3 != 0 || n_head == 0 || (s[2] / 3) % n_head != 0 {
        return Err(Error::shape(
            "causal_self_attention",
            format!("(B,T,3C) with C divisible by {n_head} heads"),
            s,
        ));
    }
    let (b, t, c) = (s[0], s[1], s[2] / 3);
    let d = c / n_head;
    let dims = Dims {
        b: b as u32,
        t: t as u32,
        h: n_head as u32,
        d: d as u32,
    };
    let heads = [b, n_head, t, d];
    let bh = b * n_head;
    let q = ctx.empty("attn q", &heads, DType::F32, false)?;
    let kk = ctx.empty("attn k", &heads, DType::F32, false)?;
    let v = ctx.empty("attn v", &heads, DType::F32, false)?;
    {
        let _op = ctx.op();
        k::split(
            &ctx.kernels,
            &ctx.write(&q)?,
            &ctx.write(&kk)?,
            &ctx.write(&v)?,
            &ctx.read(qkv)?,
            dims,
        )?;
    }
    // scores = q · kᵀ, probs = causal softmax(scores / sqrt(D))
    let preatt = ctx.empty("attn scores", &[b, n_head, t, t], DType::F32, false)?;
    heads_matmul(ctx, &preatt, &q, &kk, gemm(bh, t, t, d, false, true))?;
    let scale = 1.0 / (d as f32).sqrt();
    let att = ctx.empty("attn probs", &[b, n_head, t, t], DType::F32, false)?;
    {
        let _op = ctx.op();
        softmax::forward(
            &ctx.kernels,
            &ctx.write(&att)?,
            &ctx.read(&preatt)?,
            bh * t,
            t,
            t,
            scale,
        )?;
    }
    drop(preatt);
    // y = probs · v, merged back to (B,T,C)
    let y = ctx.empty("attn y", &heads, DType::F32, false)?;
    heads_matmul(ctx, &y, &att, &v, gemm(bh, t, d, t, false, false))?;
    let out = ctx.empty("attention", &[b, t, c], DType::F32, ctx.wants_grad(&[qkv]))?;
    {
        let _op = ctx.op();
        k::merge(&ctx.kernels, &ctx.write(&out)?, &ctx.read(&y)?, dims)?;
    }
    if out.requires_grad() {
        ctx.record(
            &[&out],
            AttentionBackward {
                qkv: qkv.clone(),
                q,
                k: kk,
                v,
                att,
                out: out.clone(),
                dims,
                scale,
            },
        );
    }
    Ok(out)
}

struct AttentionBackward {
    qkv: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    att: Tensor,
    out: Tensor,
    dims: Dims,
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
        let (b, t, h, d) = (
            self.dims.b as usize,
            self.dims.t as usize,
            self.dims.h as usize,
            self.dims.d as usize,
        );
        let bh = b * h;
        let heads = [b, h, t, d];
        let dy = ctx.zeros("attn dy", &heads, false)?;
        {
            let _op = ctx.op();
            k::merge_backward(
                &ctx.kernels,
                &ctx.modify(&dy)?,
                &ctx.read(&dout)?,
                self.dims,
            )?;
        }
        // y = att · v: datt = dy · vᵀ, dv = attᵀ · dy
        let datt = ctx.empty("attn dprobs", &[b, h, t, t], DType::F32, false)?;
        heads_matmul(ctx, &datt, &dy, &self.v, gemm(bh, t, t, d, false, true))?;
        let dv = ctx.empty("attn dv", &heads, DType::F32, false)?;
        heads_matmul(ctx, &dv, &self.att, &dy, gemm(bh, t, d, t, true, false))?;
        drop(dy);
        // scores → probs: dscores = scale · softmax'(datt)
        let dpre = ctx.zeros("attn dscores", &[b, h, t, t], false)?;
        {
            let _op = ctx.op();
            softmax::backward(
                &ctx.kernels,
                &ctx.modify(&dpre)?,
                &ctx.read(&self.att)?,
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
        heads_matmul(ctx, &dq, &dpre, &self.k, gemm(bh, t, d, t, false, false))?;
        let dk = ctx.empty("attn dk", &heads, DType::F32, false)?;
        heads_matmul(ctx, &dk, &dpre, &self.q, gemm(bh, t, d, t, true, false))?;
        let _op = ctx.op();
        k::split_backward(
            &ctx.kernels,
            &ctx.modify(&dqkv)?,
            &ctx.read(&dq)?,
            &ctx.read(&dk)?,
            &ctx.read(&dv)?,
            self.dims,
        )
    }
}
