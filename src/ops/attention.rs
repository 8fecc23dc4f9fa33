//! Causal multi-head self-attention, composed of head split, two batched matmuls, a causal
//! scaled softmax and head merge. The (B,H,T,T) attention probabilities are saved for backward.

use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::attention::{self as k, Dims};
use crate::kernels::matmul::{self as mm, Gemm};
use crate::kernels::softmax;
use crate::tensor::{DType, Tensor};

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
    let q = ctx.empty("attn q", &heads, DType::F32, false)?;
    let kk = ctx.empty("attn k", &heads, DType::F32, false)?;
    let v = ctx.empty("attn v", &heads, DType::F32, false)?;
    let kern = &ctx.kernels;
    let view = |t: &Tensor| ctx.view(t);
    k::split(kern, &view(&q), &view(&kk), &view(&v), &view(qkv), dims)?;

    let bh = b * n_head;
    let preatt = ctx.empty("attn scores", &[b, n_head, t, t], DType::F32, false)?;
    let dummy = ctx.dummy()?;
    // scores = q · kᵀ (per head)
    let g = Gemm {
        batch: bh,
        m: t,
        n: t,
        k: d,
        trans_a: false,
        trans_b: true,
        alpha: 1.0,
        beta: 0.0,
    };
    mm::matmul(kern, &view(&preatt), &view(&q), &view(&kk), None, &dummy, g)?;
    let scale = 1.0 / (d as f32).sqrt();
    let att = ctx.empty("attn probs", &[b, n_head, t, t], DType::F32, false)?;
    softmax::forward(kern, &view(&att), &view(&preatt), bh * t, t, t, scale)?;
    drop(preatt);
    // y = att · v (per head)
    let y = ctx.empty("attn y", &heads, DType::F32, false)?;
    let g = Gemm {
        batch: bh,
        m: t,
        n: d,
        k: t,
        trans_a: false,
        trans_b: false,
        alpha: 1.0,
        beta: 0.0,
    };
    mm::matmul(kern, &view(&y), &view(&att), &view(&v), None, &dummy, g)?;
    let out = ctx.empty("attention", &[b, t, c], DType::F32, ctx.wants_grad(&[qkv]))?;
    k::merge(kern, &view(&out), &view(&y), dims)?;
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
        let kern = &ctx.kernels;
        let view = |t: &Tensor| ctx.view(t);
        let dummy = ctx.dummy()?;
        let heads = [b, h, t, d];
        let dy = ctx.zeros("attn dy", &heads, false)?;
        k::merge_backward(kern, &view(&dy), &view(&dout), self.dims)?;
        // y = att · v: datt = dy · vᵀ, dv = attᵀ · dy
        let datt = ctx.zeros("attn dprobs", &[b, h, t, t], false)?;
        let g = Gemm {
            batch: bh,
            m: t,
            n: t,
            k: d,
            trans_a: false,
            trans_b: true,
            alpha: 1.0,
            beta: 0.0,
        };
        mm::matmul(
            kern,
            &view(&datt),
            &view(&dy),
            &view(&self.v),
            None,
            &dummy,
            g,
        )?;
        let dv = ctx.empty("attn dv", &heads, DType::F32, false)?;
        let g = Gemm {
            batch: bh,
            m: t,
            n: d,
            k: t,
            trans_a: true,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        mm::matmul(
            kern,
            &view(&dv),
            &view(&self.att),
            &view(&dy),
            None,
            &dummy,
            g,
        )?;
        drop(dy);
        // scores → probs: dscores = scale · softmax'(datt)
        let dpre = ctx.zeros("attn dscores", &[b, h, t, t], false)?;
        softmax::backward(
            kern,
            &view(&dpre),
            &view(&self.att),
            &view(&datt),
            bh * t,
            t,
            t,
            self.scale,
        )?;
        drop(datt);
        // scores = q · kᵀ: dq = dscores · k, dk = dscoresᵀ · q
        let dq = ctx.empty("attn dq", &heads, DType::F32, false)?;
        let g = Gemm {
            batch: bh,
            m: t,
            n: d,
            k: t,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        mm::matmul(
            kern,
            &view(&dq),
            &view(&dpre),
            &view(&self.k),
            None,
            &dummy,
            g,
        )?;
        let dk = ctx.empty("attn dk", &heads, DType::F32, false)?;
        let g = Gemm {
            batch: bh,
            m: t,
            n: d,
            k: t,
            trans_a: true,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        mm::matmul(
            kern,
            &view(&dk),
            &view(&dpre),
            &view(&self.q),
            None,
            &dummy,
            g,
        )?;
        k::split_backward(
            kern,
            &view(&dqkv),
            &view(&dq),
            &view(&dk),
            &view(&dv),
            self.dims,
        )
    }
}
