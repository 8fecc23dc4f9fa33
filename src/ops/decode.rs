//! Inference-only ops for generating one token at a time over a key/value cache
//! (`shaders/decode.wgsl`). Nothing here records a backward: generation runs without gradients.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::decode as k;
use crate::tensor::{DType, Tensor};

fn no_grad(op: &'static str, ctx: &Context) -> Result<()> {
    if ctx.grad_enabled() {
        return Err(Error::invalid(op, "decoding has no backward: run it inside `ctx.no_grad`"));
    }
    Ok(())
}

/// (1,1,C) in `dtype` = wte[token] + wpe[pos]: the input of position `pos`.
pub fn decode_embed(ctx: &Context, wte: &Tensor, wpe: &Tensor, token: u32, pos: usize, dtype: DType) -> Result<Tensor> {
    no_grad("decode_embed", ctx)?;
    let (ws, ps) = (wte.shape(), wpe.shape());
    if ws.len() != 2 || ps.len() != 2 || ws[1] != ps[1] {
        return Err(Error::shape("decode_embed", "wte (V,C) and wpe (maxT,C)", (ws, ps)));
    }
    if token as usize >= ws[0] || pos >= ps[0] {
        return Err(Error::invalid(
            "decode_embed",
            format!("token {token} of a {}-token vocabulary at position {pos} of {}", ws[0], ps[0]),
        ));
    }
    let c = ws[1];
    let out = ctx.empty("decode embedding", &[1, 1, c], dtype, false)?;
    {
        let _op = ctx.op();
        k::embed(&ctx.kernels, &ctx.write(&out)?, &ctx.read(wte)?, &ctx.read(wpe)?, token, pos, c)?;
    }
    Ok(out)
}

/// Writes the keys and values of qkv (1,T,3C) into cache (maxT,2C) rows `pos..pos+T`.
pub fn kv_append(ctx: &Context, cache: &Tensor, qkv: &Tensor, pos: usize) -> Result<()> {
    no_grad("kv_append", ctx)?;
    let (cs, qs) = (cache.shape(), qkv.shape());
    if cs.len() != 2 || qs.len() != 3 || qs[0] != 1 || qs[2] != cs[1] / 2 * 3 || cs[1] % 2 != 0 {
        return Err(Error::shape("kv_append", "cache (maxT,2C) and qkv (1,T,3C)", (cs, qs)));
    }
    if pos + qs[1] > cs[0] {
        return Err(Error::invalid("kv_append", format!("rows {pos}..{} past the cache's {}", pos + qs[1], cs[0])));
    }
    let _op = ctx.op();
    k::kv_append(&ctx.kernels, &ctx.modify(cache)?, &ctx.read(qkv)?, qs[1], pos, cs[1] / 2)
}

/// (1,1,C) = causal attention of the query in qkv (1,1,3C) at position `pos` over cache rows
/// 0..=pos (which must already hold this position's key and value), `n_head` heads.
pub fn decode_attention(ctx: &Context, qkv: &Tensor, cache: &Tensor, pos: usize, n_head: usize) -> Result<Tensor> {
    no_grad("decode_attention", ctx)?;
    let (cs, qs) = (cache.shape(), qkv.shape());
    if cs.len() != 2 || qs != [1, 1, cs[1] / 2 * 3] || cs[1] % 2 != 0 {
        return Err(Error::shape("decode_attention", "cache (maxT,2C) and qkv (1,1,3C)", (cs, qs)));
    }
    let (max_t, c) = (cs[0], cs[1] / 2);
    let out = ctx.empty("decode attention", &[1, 1, c], qkv.dtype(), false)?;
    let scores = ctx.empty("decode scores", &[n_head.max(1), max_t], DType::F32, false)?;
    {
        let _op = ctx.op();
        let (o, s) = (ctx.write(&out)?, ctx.write(&scores)?);
        k::attention(&ctx.kernels, &o, &s, &ctx.read(qkv)?, &ctx.read(cache)?, n_head, pos, c, max_t)?;
    }
    Ok(out)
}
