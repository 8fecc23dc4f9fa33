//! The causal attention forward on cooperative matrices (`shaders/attention_coop.wgsl`): f16
//! q, k, v of head size 64, both products on tensor cores, where the adapter runs the f16
//! matmul on them ([`super::Tuning::coop_f16`]). Other shapes and adapters take
//! [`super::attention`]'s kernels; the backward always does.

use super::attention::Dims;
use super::{Kernels, ATTENTION_COOP, MAX_GROUPS};
use crate::error::{Error, Result};
use crate::pager::View;
use crate::tensor::DType;

/// The head size the kernel is written for.
pub const HEAD_DIM: usize = 64;
/// Query rows per workgroup.
const ROWS: usize = 64;

/// Workgroup memory the kernel declares: K (Q at the start), V and P tiles of 64 rows of 72
/// halves, and four 16 x 64 f32 scratches. Mirrors the constants in the shader.
pub const WORKGROUP_BYTES: u64 = 3 * 64 * 72 * 2 + 4 * 16 * 64 * 4;

/// Whether [`forward`] takes this call.
pub fn applies(k: &Kernels, qkv: &View, dims: &Dims) -> bool {
    k.tuning.coop_f16
        && k.tuning.attention_coop
        && qkv.dtype == DType::F16
        && dims.d == HEAD_DIM
        && k.gpu().limits.max_compute_workgroup_storage_size as u64 >= WORKGROUP_BYTES
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    b: u32,
    t: u32,
    h: u32,
    scale: f32,
}

/// out (B,T,C) = causal softmax(scale·q·kᵀ)·v per head, and lse (B,H,T), as
/// [`super::attention::forward`] computes them.
pub fn forward(k: &Kernels, out: &View, lse: &View, qkv: &View, dims: Dims) -> Result<()> {
    if !applies(k, qkv, &dims) || dims.t == 0 || dims.b * dims.h == 0 {
        return Err(Error::invalid(
            "attention",
            format!(
                "{dims:?} on cooperative matrices: needs them on the adapter, f16 qkv (got {:?}), head size {HEAD_DIM} and T, B·H > 0",
                qkv.dtype
            ),
        ));
    }
    let bh = dims.b * dims.h;
    let z = bh.div_ceil(MAX_GROUPS as usize);
    let grid = [dims.t.div_ceil(ROWS) as u32, bh.div_ceil(z) as u32, z as u32];
    let p = Params { b: dims.b as u32, t: dims.t as u32, h: dims.h as u32, scale: dims.scale };
    k.dispatch(ATTENTION_COOP, "coop_forward", &[out, lse, qkv], &p, grid)
}
