//! Linear, LayerNorm, Mlp, CausalSelfAttention and the transformer Block.

use super::{Module, Param};
use crate::context::Context;
use crate::error::Result;
use crate::ops;
use crate::rng::Rng;
use crate::tensor::Tensor;

/// `y = x·W + b`, W (in, out): GPT-2's Conv1D layout, so checkpoints load into transformers as is.
pub struct Linear {
    pub weight: Param,
    pub bias: Option<Param>,
}

impl Linear {
    pub fn new(
        ctx: &Context,
        rng: &mut Rng,
        name: &str,
        d_in: usize,
        d_out: usize,
        std: f32,
        bias: bool,
    ) -> Result<Self> {
        let weight = Param::normal(ctx, rng, &format!("{name}.weight"), &[d_in, d_out], std)?;
        let bias = if bias { Some(Param::constant(ctx, &format!("{name}.bias"), &[d_out], 0.0)?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// x (..., in) → (..., out).
    pub fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        ops::linear(ctx, x, &self.weight.value, self.bias.as_ref().map(|b| &b.value))
    }
}

impl Module for Linear {
    fn params(&self) -> Vec<&Param> {
        std::iter::once(&self.weight).chain(self.bias.as_ref()).collect()
    }
}

pub struct LayerNorm {
    pub weight: Param,
    pub bias: Param,
    pub eps: f32,
}

impl LayerNorm {
    pub fn new(ctx: &Context, name: &str, dim: usize) -> Result<Self> {
        Ok(LayerNorm {
            weight: Param::constant(ctx, &format!("{name}.weight"), &[dim], 1.0)?,
            bias: Param::constant(ctx, &format!("{name}.bias"), &[dim], 0.0)?,
            eps: 1e-5,
        })
    }

    /// x (..., C) → (..., C).
    pub fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        ops::layernorm(ctx, x, &self.weight.value, &self.bias.value, self.eps)
    }
}

impl Module for LayerNorm {
    fn params(&self) -> Vec<&Param> {
        vec![&self.weight, &self.bias]
    }
}

/// GPT-2's feed-forward: c_fc (C→4C), GELU, c_proj (4C→C).
pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
}

impl Mlp {
    pub fn new(ctx: &Context, rng: &mut Rng, name: &str, c: usize, proj_std: f32) -> Result<Self> {
        Ok(Mlp {
            c_fc: Linear::new(ctx, rng, &format!("{name}.c_fc"), c, 4 * c, 0.02, true)?,
            c_proj: Linear::new(ctx, rng, &format!("{name}.c_proj"), 4 * c, c, proj_std, true)?,
        })
    }

    /// x (B,T,C) → (B,T,C).
    pub fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        let h = self.c_fc.forward(ctx, x)?;
        let h = ops::gelu(ctx, &h)?;
        self.c_proj.forward(ctx, &h)
    }
}

impl Module for Mlp {
    fn params(&self) -> Vec<&Param> {
        self.c_fc.params().into_iter().chain(self.c_proj.params()).collect()
    }
}

/// Multi-head causal self-attention: c_attn (C→3C), attention, c_proj (C→C).
pub struct CausalSelfAttention {
    pub c_attn: Linear,
    pub c_proj: Linear,
    pub n_head: usize,
}

impl CausalSelfAttention {
    pub fn new(ctx: &Context, rng: &mut Rng, name: &str, c: usize, n_head: usize, proj_std: f32) -> Result<Self> {
        Ok(CausalSelfAttention {
            c_attn: Linear::new(ctx, rng, &format!("{name}.c_attn"), c, 3 * c, 0.02, true)?,
            c_proj: Linear::new(ctx, rng, &format!("{name}.c_proj"), c, c, proj_std, true)?,
            n_head,
        })
    }

    /// x (B,T,C) → (B,T,C).
    pub fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        let qkv = self.c_attn.forward(ctx, x)?;
        let y = ops::causal_self_attention(ctx, &qkv, self.n_head)?;
        self.c_proj.forward(ctx, &y)
    }
}

impl Module for CausalSelfAttention {
    fn params(&self) -> Vec<&Param> {
        self.c_attn.params().into_iter().chain(self.c_proj.params()).collect()
    }
}

/// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(·)).
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Block {
    pub fn new(ctx: &Context, rng: &mut Rng, name: &str, c: usize, n_head: usize, proj_std: f32) -> Result<Self> {
        Ok(Block {
            ln_1: LayerNorm::new(ctx, &format!("{name}.ln_1"), c)?,
            attn: CausalSelfAttention::new(ctx, rng, &format!("{name}.attn"), c, n_head, proj_std)?,
            ln_2: LayerNorm::new(ctx, &format!("{name}.ln_2"), c)?,
            mlp: Mlp::new(ctx, rng, &format!("{name}.mlp"), c, proj_std)?,
        })
    }

    /// x (B,T,C) → (B,T,C).
    pub fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        let a = self.attn.forward(ctx, &self.ln_1.forward(ctx, x)?)?;
        let x = ops::add(ctx, x, &a)?;
        let m = self.mlp.forward(ctx, &self.ln_2.forward(ctx, &x)?)?;
        ops::add(ctx, &x, &m)
    }
}

impl Module for Block {
    fn params(&self) -> Vec<&Param> {
        let mut v = self.ln_1.params();
        v.extend(self.attn.params());
        v.extend(self.ln_2.params());
        v.extend(self.mlp.params());
        v
    }
}
