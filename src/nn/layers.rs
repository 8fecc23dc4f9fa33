//! Linear, LayerNorm, Mlp, CausalSelfAttention and the transformer Block.

use super::{Module, Param, Stored};
use crate::autograd::remake_for_backward;
use crate::context::Context;
use crate::error::Result;
use crate::ops;
use crate::ops::QWeight;
use crate::rng::Rng;
use crate::tensor::Tensor;

/// `y = x·W + b`, W (in, out): GPT-2's Conv1D layout, so checkpoints load into transformers as is.
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Param>,
}

/// A Linear's weight: trained in f32, or frozen in int8 (bias frozen with it).
pub enum Weight {
    Train(Param),
    Int8 { name: String, q: QWeight },
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
        Ok(Linear { weight: Weight::Train(weight), bias })
    }

    /// x (..., in) → (..., out).
    pub fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        let bias = self.bias.as_ref().map(|b| &b.value);
        match &self.weight {
            Weight::Train(Param { value, half: Some(half), .. }) => ops::linear_mixed(ctx, x, value, half, bias),
            Weight::Train(w) => ops::linear(ctx, x, &w.value, bias),
            Weight::Int8 { q, .. } => ops::linear_q8(ctx, x, q, bias),
        }
    }

    /// This layer computing with an f16 copy of its trained weight (mixed precision).
    pub fn with_half(self, ctx: &Context) -> Result<Linear> {
        match self.weight {
            Weight::Train(w) => Ok(Linear { weight: Weight::Train(w.with_half(ctx)?), bias: self.bias }),
            frozen => Ok(Linear { weight: frozen, bias: self.bias }),
        }
    }

    /// This layer with its weight frozen in int8 when its name contains `pattern`.
    pub fn freeze_int8(self, ctx: &Context, pattern: &str) -> Result<Linear> {
        let Weight::Train(w) = &self.weight else { return Ok(self) };
        if !w.name.contains(pattern) {
            return Ok(self);
        }
        // initial weights are drawn on the GPU: bring them home first
        ctx.pager.sync_to_host(&[w.value.id()])?;
        let values = ctx.pager.read_now(w.value.id())?;
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&values);
        let (rows, cols) = (w.value.shape()[0], w.value.shape()[1]);
        let q = QWeight::quantize(ctx, &w.name, &values, rows, cols)?;
        Ok(Linear { weight: Weight::Int8 { name: w.name.clone(), q }, bias: self.bias })
    }

    pub fn is_frozen(&self) -> bool {
        matches!(self.weight, Weight::Int8 { .. })
    }
}

impl Module for Linear {
    fn params(&self) -> Vec<&Param> {
        match &self.weight {
            Weight::Train(w) => std::iter::once(w).chain(self.bias.as_ref()).collect(),
            Weight::Int8 { .. } => Vec::new(),
        }
    }

    fn stored(&self) -> Vec<(String, Stored<'_>)> {
        match &self.weight {
            Weight::Train(_) => self.params().into_iter().map(|p| (p.name.clone(), Stored::F32(&p.value))).collect(),
            Weight::Int8 { name, q } => std::iter::once((name.clone(), Stored::Int8(q)))
                .chain(self.bias.as_ref().map(|b| (b.name.clone(), Stored::F32(&b.value))))
                .collect(),
        }
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

    /// `reader(self.forward(x))`, where `reader` is one op (a Linear) and the only reader of the
    /// normalized tensor. With `remake`, backward makes that tensor again from `x` (which the
    /// LayerNorm keeps anyway) instead of keeping it from forward.
    pub fn feeding(
        &self,
        ctx: &Context,
        x: &Tensor,
        remake: bool,
        reader: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let n = self.forward(ctx, x)?;
        let out = reader(&n)?;
        if remake {
            let (x, w, b, eps, n2) = (x.clone(), self.weight.value.clone(), self.bias.value.clone(), self.eps, n.clone());
            remake_for_backward(ctx, &n, &out, move |ctx| ops::layernorm_into(ctx, &n2, &x, &w, &b, eps))?;
        }
        Ok(out)
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
        self.project(ctx, &self.c_fc.forward(ctx, x)?, false)
    }

    /// c_proj(GELU(h)) for h = c_fc(x). With `remake`, backward makes the GELU output again from
    /// `h` (which GELU keeps anyway) instead of keeping it from forward: 4C values a token.
    pub fn project(&self, ctx: &Context, h: &Tensor, remake: bool) -> Result<Tensor> {
        let a = ops::gelu(ctx, h)?;
        let out = self.c_proj.forward(ctx, &a)?;
        if remake {
            let (h, a2) = (h.clone(), a.clone());
            remake_for_backward(ctx, &a, &out, move |ctx| ops::gelu_into(ctx, &a2, &h))?;
        }
        Ok(out)
    }
}

impl Module for Mlp {
    fn params(&self) -> Vec<&Param> {
        self.c_fc.params().into_iter().chain(self.c_proj.params()).collect()
    }

    fn stored(&self) -> Vec<(String, Stored<'_>)> {
        self.c_fc.stored().into_iter().chain(self.c_proj.stored()).collect()
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
        self.attend(ctx, &self.c_attn.forward(ctx, x)?)
    }

    /// Attention over `qkv` = c_attn(x) (B,T,3C), then c_proj: (B,T,C).
    pub fn attend(&self, ctx: &Context, qkv: &Tensor) -> Result<Tensor> {
        let y = ops::causal_self_attention(ctx, qkv, self.n_head)?;
        self.c_proj.forward(ctx, &y)
    }
}

impl Module for CausalSelfAttention {
    fn params(&self) -> Vec<&Param> {
        self.c_attn.params().into_iter().chain(self.c_proj.params()).collect()
    }

    fn stored(&self) -> Vec<(String, Stored<'_>)> {
        self.c_attn.stored().into_iter().chain(self.c_proj.stored()).collect()
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

    /// x (B,T,C) → (B,T,C). With `remake`, the LayerNorm and GELU outputs (6C values a token
    /// of the 16C a block keeps for backward) are made again in backward instead of kept: less
    /// to page out and in where activations outgrow the GPU budget, for two cheap kernels more.
    pub fn forward(&self, ctx: &Context, x: &Tensor, remake: bool) -> Result<Tensor> {
        let qkv = self.ln_1.feeding(ctx, x, remake, |n| self.attn.c_attn.forward(ctx, n))?;
        let x = ops::add(ctx, x, &self.attn.attend(ctx, &qkv)?)?;
        let h = self.ln_2.feeding(ctx, &x, remake, |n| self.mlp.c_fc.forward(ctx, n))?;
        ops::add(ctx, &x, &self.mlp.project(ctx, &h, remake)?)
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

    fn stored(&self) -> Vec<(String, Stored<'_>)> {
        let mut v = self.ln_1.stored();
        v.extend(self.attn.stored());
        v.extend(self.ln_2.stored());
        v.extend(self.mlp.stored());
        v
    }
}

impl Block {
    /// This block with the Linear layers whose names contain `pattern` frozen in int8.
    pub fn freeze_int8(self, ctx: &Context, pattern: &str) -> Result<Block> {
        let Block { ln_1, attn, ln_2, mlp } = self;
        let attn = CausalSelfAttention {
            c_attn: attn.c_attn.freeze_int8(ctx, pattern)?,
            c_proj: attn.c_proj.freeze_int8(ctx, pattern)?,
            n_head: attn.n_head,
        };
        let mlp = Mlp { c_fc: mlp.c_fc.freeze_int8(ctx, pattern)?, c_proj: mlp.c_proj.freeze_int8(ctx, pattern)? };
        Ok(Block { ln_1, attn, ln_2, mlp })
    }

    /// This block computing its Linear layers with f16 weight copies.
    pub fn with_half(self, ctx: &Context) -> Result<Block> {
        let Block { ln_1, attn, ln_2, mlp } = self;
        let attn = CausalSelfAttention {
            c_attn: attn.c_attn.with_half(ctx)?,
            c_proj: attn.c_proj.with_half(ctx)?,
            n_head: attn.n_head,
        };
        let mlp = Mlp { c_fc: mlp.c_fc.with_half(ctx)?, c_proj: mlp.c_proj.with_half(ctx)? };
        Ok(Block { ln_1, attn, ln_2, mlp })
    }

    /// Linear layers frozen in int8.
    pub fn frozen(&self) -> usize {
        [&self.attn.c_attn, &self.attn.c_proj, &self.mlp.c_fc, &self.mlp.c_proj]
            .iter()
            .filter(|l| l.is_frozen())
            .count()
    }
}
