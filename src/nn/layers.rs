//! Linear, LayerNorm, Mlp, CausalSelfAttention and the transformer Block.

use super::{Module, Param, Stored};
use crate::autograd::{remake_for_backward, Replay};
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

    /// How to write this layer's output for an input into a given tensor again, recording
    /// nothing (`ops::linear_into`: the same bits); `None` for a frozen int8 weight.
    pub fn remaker(&self) -> Option<impl Fn(&Context, &Tensor, &Tensor) -> Result<()> + 'static> {
        let Weight::Train(p) = &self.weight else { return None };
        let w = p.half.as_ref().unwrap_or(&p.value).clone();
        let bias = self.bias.as_ref().map(|b| b.value.clone());
        Some(move |ctx: &Context, x: &Tensor, out: &Tensor| ops::linear_into(ctx, out, x, &w, bias.as_ref()))
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
            remake_for_backward(ctx, &[&n], &out, self.remaker(&n, x))?;
        }
        Ok(out)
    }

    /// Writes this LayerNorm's output `out` of `x` again, recording nothing (the same bits).
    fn remaker(&self, out: &Tensor, x: &Tensor) -> impl Fn(&Context) -> Result<()> + 'static {
        let (out, x, w, b, eps) =
            (out.clone(), x.clone(), self.weight.value.clone(), self.bias.value.clone(), self.eps);
        move |ctx: &Context| ops::layernorm_into(ctx, &out, &x, &w, &b, eps)
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
        self.c_proj.forward(ctx, &ops::gelu(ctx, &h)?)
    }

    /// `self.forward(ln(x))`, keeping for backward none of the LayerNorm's, c_fc's and GELU's
    /// outputs (9C of the 16C values a token a block keeps): c_proj's backward first makes them
    /// again from `x`, which the LayerNorm keeps anyway (one LayerNorm, one product, one GELU).
    /// With a frozen int8 c_fc, its output is kept and only GELU's is made again.
    pub fn forward_remaking(&self, ctx: &Context, ln: &LayerNorm, x: &Tensor) -> Result<Tensor> {
        let n = ln.forward(ctx, x)?;
        let h = self.c_fc.forward(ctx, &n)?;
        let fc_again = self.c_fc.remaker();
        if fc_again.is_none() {
            // c_fc's output is kept: only its own backward needs the LayerNorm output again.
            remake_for_backward(ctx, &[&n], &h, ln.remaker(&n, x))?;
        }
        let a = ops::gelu(ctx, &h)?;
        let out = self.c_proj.forward(ctx, &a)?;
        let gelu_again = {
            let (h, a) = (h.clone(), a.clone());
            move |ctx: &Context| ops::gelu_into(ctx, &a, &h)
        };
        match fc_again {
            // Made once here, the LayerNorm output serves c_fc's backward too.
            Some(fc_again) => {
                let (ln_again, n2, h2) = (ln.remaker(&n, x), n.clone(), h.clone());
                let again = move |ctx: &Context| {
                    ln_again(ctx)?;
                    fc_again(ctx, &n2, &h2)?;
                    gelu_again(ctx)
                };
                remake_for_backward(ctx, &[&n, &h, &a], &out, again)?;
            }
            None => remake_for_backward(ctx, &[&a], &out, gelu_again)?,
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

    /// x (B,T,C) → (B,T,C). With `remake`, the LayerNorm outputs and the MLP's hidden values
    /// (10C of the 16C values a token the block keeps for backward) are made again in backward
    /// instead of kept: less to page out and in where activations outgrow the GPU budget, for
    /// two LayerNorms, a GELU and one product more (`Mlp::forward_remaking`).
    pub fn forward(&self, ctx: &Context, x: &Tensor, remake: bool) -> Result<Tensor> {
        let qkv = self.ln_1.feeding(ctx, x, remake, |n| self.attn.c_attn.forward(ctx, n))?;
        let x = ops::add(ctx, x, &self.attn.attend(ctx, &qkv)?)?;
        let m = if remake {
            self.mlp.forward_remaking(ctx, &self.ln_2, &x)?
        } else {
            self.mlp.forward(ctx, &self.ln_2.forward(ctx, &x)?)?
        };
        ops::add(ctx, &x, &m)
    }

    /// [`Block::forward`] as a checkpointed block runs it (`autograd::checkpoint`), the same bits
    /// with less work in backward's run again: where `keep_attention`, the first run keeps the
    /// attention's output and log-sum-exps for it (C + H values a token); and it leaves out the
    /// MLP's output product and the residual add after it, whose outputs no backward reads.
    pub fn forward_checkpointed(
        &self,
        ctx: &Context,
        x: &Tensor,
        replay: &Replay,
        keep_attention: bool,
    ) -> Result<Tensor> {
        let qkv = self.ln_1.forward(ctx, x).and_then(|n| self.attn.c_attn.forward(ctx, &n))?;
        let y = if keep_attention {
            let [y, _lse] =
                replay.keep(|kept| ops::causal_self_attention_keeping(ctx, &qkv, self.attn.n_head, kept))?;
            y
        } else {
            ops::causal_self_attention(ctx, &qkv, self.attn.n_head)?
        };
        let x = ops::add(ctx, x, &self.attn.c_proj.forward(ctx, &y)?)?;
        let a = ops::gelu(ctx, &self.mlp.c_fc.forward(ctx, &self.ln_2.forward(ctx, &x)?)?)?;
        replay.unread(ctx, || ops::add(ctx, &x, &self.mlp.c_proj.forward(ctx, &a)?))
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
