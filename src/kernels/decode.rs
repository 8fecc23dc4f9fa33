//! Launchers for `shaders/decode.wgsl`: one-token-at-a-time generation over a key/value cache.

use super::{grid_1d, Kernels, DECODE};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        /// decode_embed: the token; kv_append: rows; decode_attention: heads
        token: u32,
        /// position of the (first) new row
        pos: u32,
        /// channels C = H·D
        c: u32,
        /// rows of the cache (and of scores)
        max_t: u32,
        /// decode_attention: 1/sqrt(D)
        scale: f32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

fn params(token: usize, pos: usize, c: usize, max_t: usize, scale: f32) -> Params {
    Params { token: token as u32, pos: pos as u32, c: c as u32, max_t: max_t as u32, scale, ..Default::default() }
}

/// out (C) = wte[token] + wpe[pos].
pub fn embed(k: &Kernels, out: &View, wte: &View, wpe: &View, token: u32, pos: usize, c: usize) -> Result<()> {
    let p = params(token as usize, pos, c, 0, 0.0);
    k.dispatch(DECODE, "decode_embed", &[out, wte, wpe], &p, grid_1d(c as u64))
}

/// cache (maxT,2C) rows `pos..pos+rows` = the keys and values of qkv (rows,3C).
pub fn kv_append(k: &Kernels, cache: &View, qkv: &View, rows: usize, pos: usize, c: usize) -> Result<()> {
    let p = params(rows, pos, c, 0, 0.0);
    k.dispatch(DECODE, "kv_append", &[cache, qkv], &p, grid_1d((rows * 2 * c) as u64))
}

/// out (C) = attention of qkv's query (3C) over cache rows 0..=pos, per head; scores (H,maxT).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    k: &Kernels,
    out: &View,
    scores: &View,
    qkv: &View,
    cache: &View,
    heads: usize,
    pos: usize,
    c: usize,
    max_t: usize,
) -> Result<()> {
    if heads == 0 || !c.is_multiple_of(heads) || pos >= max_t {
        return Err(Error::invalid("decode_attention", format!("{heads} heads of C {c}, position {pos} of {max_t}")));
    }
    let p = params(heads, pos, c, max_t, 1.0 / ((c / heads) as f32).sqrt());
    k.dispatch(DECODE, "decode_attention", &[out, scores, qkv, cache], &p, [heads as u32, 1, 1])
}
