//! Generation with a key/value cache: each block keeps the keys and values of the positions seen
//! so far, so a new token runs the model over one position and only its logits come back.

use super::layers::Block;
use super::Gpt;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ops::{self, MatmulOpts};
use crate::tensor::{DType, Tensor};

/// Each block's keys and values (maxT, 2C) of positions `0..len`.
pub struct KvCache {
    layers: Vec<Tensor>,
    len: usize,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions it can hold (the model's block size).
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, |t| t.shape()[0])
    }
}

impl Gpt {
    /// An empty cache for this model (one (block_size, 2C) tensor per block, in the
    /// activations' element type).
    pub fn kv_cache(&self, ctx: &Context) -> Result<KvCache> {
        let (t, c) = (self.config.block_size, self.config.n_embd);
        let layers = (0..self.config.n_layer)
            .map(|i| ctx.empty(&format!("transformer.h.{i}/kv_cache"), &[t, 2 * c], self.activation_dtype(), false))
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len: 0 })
    }

    /// Feeds `tokens` at the cache's next positions and returns the logits (1,1,V), f32, that
    /// follow the last of them. An empty cache takes all but the last token in one causal pass;
    /// every other token costs one position. Errors past the cache's capacity (the caller starts
    /// a new cache over a shorter window) and when gradients are on.
    pub fn decode(&self, ctx: &Context, cache: &mut KvCache, tokens: &[u32]) -> Result<Tensor> {
        let Some((&last, earlier)) = tokens.split_last() else {
            return Err(Error::invalid("decode", "no tokens to feed"));
        };
        if cache.len + tokens.len() > cache.capacity() {
            return Err(Error::invalid(
                "decode",
                format!("{} + {} positions exceed the cache's {}", cache.len, tokens.len(), cache.capacity()),
            ));
        }
        if cache.is_empty() && !earlier.is_empty() {
            self.prefill(ctx, cache, earlier)?;
        } else {
            for &t in earlier {
                self.step(ctx, cache, t)?;
            }
        }
        let x = self.step(ctx, cache, last)?;
        let x = if x.dtype() == DType::F32 { x } else { ops::cast(ctx, &x, DType::F32)? };
        ops::matmul(ctx, &x, &self.wte.value, MatmulOpts { trans_b: true, ..Default::default() })
    }

    /// Runs `tokens` at positions 0.. through the blocks with the training path's causal
    /// attention, keeping their keys and values.
    fn prefill(&self, ctx: &Context, cache: &mut KvCache, tokens: &[u32]) -> Result<()> {
        let ids = ctx.from_u32("prompt", &[1, tokens.len()], tokens)?;
        let mut x = ops::embedding(ctx, &ids, &self.wte.value, &self.wpe.value)?;
        if self.activation_dtype() != DType::F32 {
            x = ops::cast(ctx, &x, self.activation_dtype())?;
        }
        for (block, kv) in self.blocks.iter().zip(&cache.layers) {
            x = block.forward_cached(ctx, &x, kv, 0)?;
        }
        cache.len = tokens.len();
        Ok(())
    }

    /// One token at the next position: the final LayerNorm's output (1,1,C).
    fn step(&self, ctx: &Context, cache: &mut KvCache, token: u32) -> Result<Tensor> {
        let pos = cache.len;
        let mut x = ops::decode_embed(ctx, &self.wte.value, &self.wpe.value, token, pos, self.activation_dtype())?;
        for (block, kv) in self.blocks.iter().zip(&cache.layers) {
            x = block.forward_cached(ctx, &x, kv, pos)?;
        }
        cache.len += 1;
        self.ln_f.forward(ctx, &x)
    }
}

impl Block {
    /// x (1,T,C) at positions `pos..pos+T` → (1,T,C), appending the positions' keys and values to
    /// `kv`. T = 1 attends over the cache; T > 1 only from position 0 (a causal pass).
    fn forward_cached(&self, ctx: &Context, x: &Tensor, kv: &Tensor, pos: usize) -> Result<Tensor> {
        let qkv = self.attn.c_attn.forward(ctx, &self.ln_1.forward(ctx, x)?)?;
        ops::kv_append(ctx, kv, &qkv, pos)?;
        let y = match (qkv.shape()[1], pos) {
            (1, _) => ops::decode_attention(ctx, &qkv, kv, pos, self.attn.n_head)?,
            (_, 0) => ops::causal_self_attention(ctx, &qkv, self.attn.n_head)?,
            (t, _) => return Err(Error::invalid("decode", format!("{t} new positions after {pos} cached ones"))),
        };
        let x = ops::add(ctx, x, &self.attn.c_proj.forward(ctx, &y)?)?;
        let m = self.mlp.forward(ctx, &self.ln_2.forward(ctx, &x)?)?;
        ops::add(ctx, &x, &m)
    }
}
