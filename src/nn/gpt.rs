//! GPT-2: token + position embedding, pre-LayerNorm blocks, final LayerNorm, output head tied
//! to the token embedding. Parameter names and layouts are Hugging Face's `GPT2LMHeadModel`.

use std::cell::Cell;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use super::layers::{Block, LayerNorm};
use super::{Module, Param, Stored};
use crate::autograd;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ops::{self, MatmulOpts};
use crate::rng::Rng;
use crate::tensor::{DType, Tensor};

/// The shape of a GPT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GptConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub block_size: usize,
    pub vocab_size: usize,
}

/// A model's dimensions apart from the vocabulary (which the data decides): a custom size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub block_size: usize,
}

impl GptConfig {
    /// The names [`GptConfig::preset`] knows.
    pub const PRESETS: [&'static str; 6] = ["tiny", "small", "gpt2-124m", "gpt2-medium", "gpt2-large", "gpt2-xl"];

    /// A custom size over `vocab_size` tokens, checked.
    pub fn from_shape(s: ModelShape, vocab_size: usize) -> Result<GptConfig> {
        let c =
            GptConfig { n_layer: s.n_layer, n_head: s.n_head, n_embd: s.n_embd, block_size: s.block_size, vocab_size };
        c.validate()?;
        Ok(c)
    }

    pub fn shape(&self) -> ModelShape {
        ModelShape { n_layer: self.n_layer, n_head: self.n_head, n_embd: self.n_embd, block_size: self.block_size }
    }

    /// Named presets: `tiny`, `small`, and GPT-2's four sizes — `gpt2-124m` (small), and by their
    /// Hugging Face names `gpt2-medium` (355M), `gpt2-large` (774M), `gpt2-xl` (1.56B): the same
    /// architecture, head size 64. `vocab_size` comes from the data for `tiny` and `small`.
    pub fn preset(name: &str, vocab_size: usize) -> Result<GptConfig> {
        let (n_layer, n_head, n_embd, block_size, vocab_size) = match name {
            "tiny" => (2, 4, 64, 64, vocab_size),
            "small" => (4, 4, 128, 128, vocab_size),
            "gpt2-124m" => (12, 12, 768, 1024, vocab_size.max(50257)),
            "gpt2-medium" => (24, 16, 1024, 1024, vocab_size.max(50257)),
            "gpt2-large" => (36, 20, 1280, 1024, vocab_size.max(50257)),
            "gpt2-xl" => (48, 25, 1600, 1024, vocab_size.max(50257)),
            other => {
                let known = Self::PRESETS.join(", ");
                return Err(Error::invalid("model", format!("unknown preset `{other}` (try {known})")));
            }
        };
        let c = GptConfig { n_layer, n_head, n_embd, block_size, vocab_size };
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid("model config", msg));
        if self.n_layer == 0 || self.n_head == 0 || self.n_embd == 0 || self.block_size == 0 || self.vocab_size == 0 {
            return bad(format!("every dimension must be positive: {self:?}"));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!("n_embd {} is not divisible by n_head {}", self.n_embd, self.n_head));
        }
        Ok(())
    }

    /// [`GptConfig::num_params`] without overflow, for sizes read from files.
    pub fn num_params_f64(&self) -> f64 {
        let (c, l) = (self.n_embd as f64, self.n_layer as f64);
        let block = 4.0 * c + (3.0 * c * c + 3.0 * c) + (c * c + c) + (4.0 * c * c + 4.0 * c) + (4.0 * c * c + c);
        self.vocab_size as f64 * c + self.block_size as f64 * c + l * block + 2.0 * c
    }

    /// Number of parameters (the head is tied, so it adds none).
    pub fn num_params(&self) -> usize {
        let c = self.n_embd;
        let block = 2 * 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c);
        self.vocab_size * c + self.block_size * c + self.n_layer * block + 2 * c
    }
}

pub struct Gpt {
    pub config: GptConfig,
    pub wte: Param,
    pub wpe: Param,
    pub blocks: Vec<Rc<Block>>,
    pub ln_f: LayerNorm,
    /// How many blocks, from the first, are checkpointed: each keeps its input and is run
    /// again in backward.
    recompute: Cell<usize>,
    /// Make LayerNorm outputs and the MLP's hidden values again in backward instead of keeping
    /// them (`Block::forward`).
    remake: Cell<bool>,
    /// Checkpointed blocks keep their attention's output for backward instead of running it
    /// again (`Block::forward_checkpointed`); on by default (a trainer turns it off once the run
    /// pages).
    keep_attention: Cell<bool>,
    /// Element type of the activations between the embedding and the head (f16 after `to_half`).
    activations: DType,
}

impl Gpt {
    /// A freshly initialised model: N(0, 0.02) weights, residual projections scaled by
    /// 1/sqrt(2·n_layer) as in GPT-2, zero biases, unit LayerNorm gains.
    pub fn new(ctx: &Context, config: GptConfig, seed: u64) -> Result<Gpt> {
        config.validate()?;
        let mut rng = Rng::new(seed);
        let c = config.n_embd;
        let proj_std = 0.02 / (2.0 * config.n_layer as f32).sqrt();
        let wte = Param::normal(ctx, &mut rng, "transformer.wte.weight", &[config.vocab_size, c], 0.02)?;
        let wpe = Param::normal(ctx, &mut rng, "transformer.wpe.weight", &[config.block_size, c], 0.01)?;
        let blocks = (0..config.n_layer)
            .map(|i| Block::new(ctx, &mut rng, &format!("transformer.h.{i}"), c, config.n_head, proj_std))
            .map(|b| b.map(Rc::new))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(ctx, "transformer.ln_f", c)?;
        Ok(Gpt {
            config,
            wte,
            wpe,
            blocks,
            ln_f,
            recompute: Cell::new(0),
            remake: Cell::new(false),
            keep_attention: Cell::new(true),
            activations: DType::F32,
        })
    }

    /// This model with every Linear layer whose parameter names contain `pattern` (e.g. `mlp`,
    /// `h.0.`) frozen as int8 weights; returns it and how many layers were frozen. Call before
    /// the model is shared (right after building or loading it).
    pub fn freeze_int8(self, ctx: &Context, pattern: &str) -> Result<(Gpt, usize)> {
        let Gpt { config, wte, wpe, blocks, ln_f, recompute, remake, keep_attention, activations } = self;
        let mut frozen = 0;
        let mut out = Vec::with_capacity(blocks.len());
        for b in blocks {
            let block = Rc::try_unwrap(b)
                .map_err(|_| Error::invalid("freeze_int8", "the model is shared; freeze it before use"))?;
            let block = block.freeze_int8(ctx, pattern)?;
            frozen += block.frozen();
            out.push(Rc::new(block));
        }
        Ok((Gpt { config, wte, wpe, blocks: out, ln_f, recompute, remake, keep_attention, activations }, frozen))
    }

    /// This model in mixed precision: activations (and their gradients) in f16 from the embedding
    /// to the head, Linear layers computing with f16 copies of their f32 master weights (AdamW
    /// writes the copies with each update; after changing the masters otherwise, call
    /// `Module::refresh_half`). Needs shader-f16.
    pub fn to_half(self, ctx: &Context) -> Result<Gpt> {
        let Gpt { config, wte, wpe, blocks, ln_f, recompute, remake, keep_attention, activations: _ } = self;
        let mut out = Vec::with_capacity(blocks.len());
        for b in blocks {
            let block = Rc::try_unwrap(b)
                .map_err(|_| Error::invalid("to_half", "the model is shared; convert it before use"))?;
            out.push(Rc::new(block.with_half(ctx)?));
        }
        Ok(Gpt { config, wte, wpe, blocks: out, ln_f, recompute, remake, keep_attention, activations: DType::F16 })
    }

    /// Element type of the activations between the embedding and the head.
    pub fn activation_dtype(&self) -> DType {
        self.activations
    }

    /// Recomputes the first `n` blocks (all where `n` is larger; see [`autograd::checkpoint`])
    /// and keeps the rest's activations: the last blocks' are read back first, often before
    /// anything evicts them.
    pub fn set_recompute_blocks(&self, n: usize) {
        self.recompute.set(n.min(self.blocks.len()));
    }

    /// Whether any block is recomputed.
    pub fn recomputes(&self) -> bool {
        self.recompute.get() > 0
    }

    /// How many blocks, from the first, are recomputed.
    pub fn recompute_blocks(&self) -> usize {
        self.recompute.get()
    }

    /// Turns selective recompute of LayerNorm outputs and the MLP's hidden values on or off (see
    /// [`Block::forward`];
    /// whole blocks recomputed keep nothing anyway).
    pub fn set_remake(&self, on: bool) {
        self.remake.set(on);
    }

    pub fn remakes(&self) -> bool {
        self.remake.get()
    }

    /// Whether recomputed blocks keep their attention's output rather than run it again in
    /// backward (the same bits either way; see `Block::forward_checkpointed`).
    pub fn set_keep_attention(&self, on: bool) {
        self.keep_attention.set(on);
    }

    pub fn keeps_attention(&self) -> bool {
        self.keep_attention.get()
    }

    /// tokens (B,T) u32 → logits (B,T,V), f32.
    pub fn forward(&self, ctx: &Context, tokens: &Tensor) -> Result<Tensor> {
        let mut x = self.hidden(ctx, tokens)?;
        if x.dtype() != DType::F32 {
            x = ops::cast(ctx, &x, DType::F32)?;
        }
        ops::matmul(ctx, &x, &self.wte.value, MatmulOpts { trans_b: true, ..Default::default() })
    }

    /// Mean cross-entropy of predicting `targets` (B·T, row-major) from tokens (B,T). The head
    /// and the loss run fused, a chunk of rows at a time (the logits are never all held).
    pub fn loss(&self, ctx: &Context, tokens: &Tensor, targets: &[u32]) -> Result<Tensor> {
        self.loss_prepared(ctx, tokens, targets, None, &mut |_| Ok(()))
    }

    /// [`Gpt::loss`] calling `prepare` on each group of parameters just before the forward first
    /// reads it — the embeddings, each block in turn, the final LayerNorm — so that work for them
    /// (a deferred optimizer update) overlaps the layers computed before. Given the backward
    /// the caller will run from this loss, the head makes its gradients in forward
    /// ([`ops::lm_head_loss_for_backward`]).
    pub fn loss_prepared(
        &self,
        ctx: &Context,
        tokens: &Tensor,
        targets: &[u32],
        backward: Option<StepBackward>,
        prepare: Prepare,
    ) -> Result<Tensor> {
        let x = self.hidden_prepared(ctx, tokens, prepare)?;
        let _scope = ctx.name_scope("lm_head");
        match backward {
            Some(b) => {
                let wte_grad = b.grads_free.then_some(&self.wte.grad);
                let backward = ops::LossBackward { seed: b.seed, wte_grad };
                ops::lm_head_loss_for_backward(ctx, &x, &self.wte.value, targets, None, backward)
            }
            None => ops::lm_head_loss(ctx, &x, &self.wte.value, targets, None),
        }
    }

    /// tokens (B,T) u32 → the final LayerNorm's output (B,T,C), in the activations' element type.
    pub fn hidden(&self, ctx: &Context, tokens: &Tensor) -> Result<Tensor> {
        self.hidden_prepared(ctx, tokens, &mut |_| Ok(()))
    }

    fn hidden_prepared(&self, ctx: &Context, tokens: &Tensor, prepare: Prepare) -> Result<Tensor> {
        let t = tokens.shape().get(1).copied().unwrap_or(0);
        if t > self.config.block_size {
            return Err(Error::shape("gpt forward", format!("T <= block_size {}", self.config.block_size), t));
        }
        prepare(&[&self.wte, &self.wpe])?;
        let scope = ctx.name_scope("transformer.wte");
        let mut x = ops::embedding(ctx, tokens, &self.wte.value, &self.wpe.value)?;
        if self.activations != DType::F32 {
            x = ops::cast(ctx, &x, self.activations)?;
        }
        drop(scope);
        for (i, block) in self.blocks.iter().enumerate() {
            prepare(&block.params())?;
            let name = format!("transformer.h.{i}");
            x = if i < self.recompute.get() {
                let (block, keep) = (block.clone(), self.keep_attention.get());
                // The scope is taken inside too: backward runs the block again, outside this one.
                let _scope = ctx.name_scope(&name);
                autograd::checkpoint(ctx, &x, move |ctx, x, replay| {
                    let _scope = ctx.name_scope(&name);
                    block.forward_checkpointed(ctx, x, replay, keep)
                })?
            } else {
                let _scope = ctx.name_scope(&name);
                block.forward(ctx, &x, self.remake.get())?
            };
        }
        prepare(&self.ln_f.params())?;
        let _scope = ctx.name_scope("transformer.ln_f");
        self.ln_f.forward(ctx, &x)
    }
}

/// The backward a caller of [`Gpt::loss_prepared`] runs from its loss, with this model's
/// gradients ([`Module::grads`]).
#[derive(Clone, Copy, Debug)]
pub struct StepBackward {
    /// d loss it starts from: `ctx.backward(&loss, grads, seed)`.
    pub seed: f32,
    /// Whether nothing reads or clears the parameters' gradients between this forward and that
    /// backward (no delayed update waits for them): the head then adds to wte's at once instead
    /// of holding its own aside.
    pub grads_free: bool,
}

/// Called with a group of parameters before the forward reads them (see [`Gpt::loss_prepared`]).
pub type Prepare<'a> = &'a mut dyn FnMut(&[&Param]) -> Result<()>;

impl Module for Gpt {
    fn stored(&self) -> Vec<(String, Stored<'_>)> {
        let mut v: Vec<(String, Stored<'_>)> =
            [&self.wte, &self.wpe].iter().map(|p| (p.name.clone(), Stored::F32(&p.value))).collect();
        for b in &self.blocks {
            v.extend(b.stored());
        }
        v.extend(self.ln_f.stored());
        v
    }

    fn params(&self) -> Vec<&Param> {
        let mut v = vec![&self.wte, &self.wpe];
        for b in &self.blocks {
            v.extend(b.params());
        }
        v.extend(self.ln_f.params());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::GptConfig;

    #[test]
    fn gpt2_presets_have_the_parameter_counts_hugging_face_publishes() {
        // `num_parameters()` of transformers' GPT2LMHeadModel for each checkpoint (tied head).
        for (name, hf) in [
            ("gpt2-124m", 124_439_808usize),
            ("gpt2-medium", 354_823_168),
            ("gpt2-large", 774_030_080),
            ("gpt2-xl", 1_557_611_200),
        ] {
            let c = GptConfig::preset(name, 0).unwrap();
            assert_eq!(c.num_params(), hf, "{name}");
            assert_eq!(c.num_params_f64(), hf as f64, "{name}");
            assert_eq!(c.n_embd / c.n_head, 64, "{name}: GPT-2's head size");
        }
        let err = GptConfig::preset("gpt2-xxl", 0).unwrap_err().to_string();
        assert!(err.contains("gpt2-xxl") && err.contains("gpt2-xl"), "{err}");
    }
}
