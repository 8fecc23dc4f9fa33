//! Layers with parameters, and the GPT-2 model built from them.

mod gpt;
mod kv_cache;
mod layers;

pub use gpt::{Gpt, GptConfig, ModelShape, Prepare, StepBackward};
pub use kv_cache::KvCache;
pub use layers::{Block, CausalSelfAttention, LayerNorm, Linear, Mlp, Weight};

use crate::autograd::Grads;
use crate::context::Context;
use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::Tensor;

/// A trainable tensor, its accumulated gradient, and its name in checkpoints (Hugging Face GPT-2
/// names, e.g. `transformer.h.0.attn.c_attn.weight`).
pub struct Param {
    pub name: String,
    pub value: Tensor,
    pub grad: Tensor,
    /// Mixed precision: an f16 copy of `value` that the products read; the optimizer writes it
    /// with every update.
    pub half: Option<Tensor>,
}

impl Param {
    /// A parameter initialised from `init` (host data, row-major `shape`), gradient zeroed.
    pub fn new(ctx: &Context, name: &str, shape: &[usize], init: &[f32]) -> Result<Param> {
        Self::of_value(ctx, name, ctx.from_f32(name, shape, init, true)?)
    }

    /// A parameter holding `value`, gradient zeroed.
    fn of_value(ctx: &Context, name: &str, value: Tensor) -> Result<Param> {
        let grad = ctx.zeros(&format!("{name}.grad"), value.shape(), false)?;
        Ok(Param { name: name.to_string(), value, grad, half: None })
    }

    /// This parameter with an f16 copy of its value (see [`Param::half`]).
    pub fn with_half(self, ctx: &Context) -> Result<Param> {
        let half = ctx.empty(&format!("{} (f16)", self.name), self.value.shape(), crate::tensor::DType::F16, false)?;
        crate::ops::refresh_half(ctx, &half, &self.value)?;
        Ok(Param { half: Some(half), ..self })
    }

    /// Copies the value into its f16 copy, if it has one.
    pub fn refresh_half(&self, ctx: &Context) -> Result<()> {
        match &self.half {
            Some(half) => crate::ops::refresh_half(ctx, half, &self.value),
            None => Ok(()),
        }
    }

    /// N(0, std²) draws made on the GPU (`fill_normal`), seeded by one draw of `rng`.
    pub fn normal(ctx: &Context, rng: &mut Rng, name: &str, shape: &[usize], std: f32) -> Result<Param> {
        let value = ctx.empty(name, shape, crate::tensor::DType::F32, true)?;
        {
            let _op = ctx.op();
            crate::kernels::elementwise::fill_normal(
                &ctx.kernels,
                &ctx.write(&value)?,
                std,
                rng.next_u64(),
                value.len(),
            )?;
        }
        Self::of_value(ctx, name, value)
    }

    pub fn constant(ctx: &Context, name: &str, shape: &[usize], value: f32) -> Result<Param> {
        let n: usize = shape.iter().product();
        Self::new(ctx, name, shape, &vec![value; n])
    }
}

/// How a tensor of a module is kept (what a checkpoint reads).
pub enum Stored<'a> {
    F32(&'a Tensor),
    /// Frozen int8 weights; checkpoints hold their dequantized values.
    Int8(&'a crate::ops::QWeight),
}

/// Something that owns parameters.
pub trait Module {
    /// The trainable parameters.
    fn params(&self) -> Vec<&Param>;

    /// Every named weight, trainable or frozen, in checkpoint order.
    fn stored(&self) -> Vec<(String, Stored<'_>)> {
        self.params().into_iter().map(|p| (p.name.clone(), Stored::F32(&p.value))).collect()
    }

    /// A gradient map in which every parameter's gradient accumulates.
    fn grads(&self) -> Grads {
        let mut g = Grads::new();
        for p in self.params() {
            g.insert_persistent(&p.value, p.grad.clone());
        }
        g
    }

    /// Sets every parameter gradient to zero.
    fn zero_grad(&self, ctx: &Context) -> Result<()> {
        for p in self.params() {
            ctx.pager.zero(p.grad.id())?;
        }
        Ok(())
    }

    /// Copies every parameter that has an f16 copy into it (mixed precision).
    fn refresh_half(&self, ctx: &Context) -> Result<()> {
        for p in self.params() {
            p.refresh_half(ctx)?;
        }
        Ok(())
    }

    fn num_params(&self) -> usize {
        self.params().iter().map(|p| p.value.len()).sum()
    }
}
