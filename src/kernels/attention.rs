//! Launchers for `shaders/attention.wgsl`: fused causal self-attention that never stores the
//! (T,T) scores, compiled per head size.

use super::{Kernels, ATTENTION, MAX_GROUPS};
use crate::error::{Error, Result};
use crate::pager::View;

/// Query (or key) rows per workgroup (`ROWS` in the shader).
const ROWS: usize = 64;
/// Largest head size: q, the accumulators and the streamed tiles must fit registers and 16 KiB.
pub const MAX_HEAD_DIM: usize = 256;

/// Shape of one attention call: qkv (B,T,3·H·D), out (B,T,H·D), lse and delta (B,H,T).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
    /// Multiplies the scores (1/sqrt(D) in GPT-2).
    pub scale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    b: u32,
    t: u32,
    h: u32,
    scale: f32,
}

impl Dims {
    fn params(&self) -> Result<Params> {
        if self.d == 0 || self.d > MAX_HEAD_DIM || self.t == 0 || self.b * self.h == 0 {
            return Err(Error::invalid(
                "attention",
                format!("{self:?}: needs T, B·H > 0 and head size 1..={MAX_HEAD_DIM}"),
            ));
        }
        Ok(Params { b: self.b as u32, t: self.t as u32, h: self.h as u32, scale: self.scale })
    }

    /// Row blocks in x, the B·H heads folded into y and z.
    fn grid(&self) -> [u32; 3] {
        let bh = self.b * self.h;
        let z = bh.div_ceil(MAX_GROUPS as usize);
        [self.t.div_ceil(ROWS) as u32, bh.div_ceil(z) as u32, z as u32]
    }
}

/// out (B,T,C) = causal softmax(scale·q·kᵀ)·v per head, and lse (B,H,T) for backward.
pub fn forward(k: &Kernels, out: &View, lse: &View, qkv: &View, dims: Dims) -> Result<()> {
    let p = dims.params()?;
    let sizes = (dims.d as u32, k.tuning.attention_tile_rows(dims.d));
    k.dispatch_unrolled(ATTENTION, "attention_forward", sizes, &[out, lse, qkv], &p, dims.grid())
}

/// dqkv (B,T,3C) += the gradient through attention, given the saved `out` and `lse` and the
/// output gradient `dout`; `delta` (B,H,T) is scratch the two passes share.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dqkv: &View,
    delta: &View,
    qkv: &View,
    out: &View,
    dout: &View,
    lse: &View,
    dims: Dims,
) -> Result<()> {
    let p = dims.params()?;
    let sizes = (dims.d as u32, k.tuning.attention_tile_rows(dims.d));
    k.dispatch_unrolled(
        ATTENTION,
        "attention_backward_q",
        sizes,
        &[dqkv, delta, qkv, dout, lse, out],
        &p,
        dims.grid(),
    )?;
    k.dispatch_unrolled(ATTENTION, "attention_backward_kv", sizes, &[dqkv, delta, qkv, dout, lse], &p, dims.grid())
}
