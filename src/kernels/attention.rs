//! Launchers for `shaders/attention.wgsl`: head split/merge between (B,T,C) and (B,H,T,D).

use super::{grid_1d, Kernels, ATTENTION};
use crate::error::Result;
use crate::pager::View;

/// Attention dimensions: batch entries in this launch, time, heads, head size, and the index of
/// the first batch entry in the (B,T,·) tensors.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Dims {
    pub b: u32,
    pub t: u32,
    pub h: u32,
    pub d: u32,
    pub first: u32,
    pub _pad: [u32; 3],
}

impl Dims {
    fn elems(&self) -> u64 {
        (self.b * self.t * self.h * self.d) as u64
    }
}

/// q, k, v (B,H,T,D) from qkv (B,T,3C).
pub fn split(k: &Kernels, q: &View, kk: &View, v: &View, qkv: &View, d: Dims) -> Result<()> {
    k.dispatch(ATTENTION, "attention_split", &[q, kk, v, qkv], &d, grid_1d(d.elems()))
}

/// dqkv (B,T,3C) += from dq, dk, dv (B,H,T,D).
pub fn split_backward(k: &Kernels, dqkv: &View, dq: &View, dk: &View, dv: &View, d: Dims) -> Result<()> {
    k.dispatch(ATTENTION, "attention_split_backward", &[dqkv, dq, dk, dv], &d, grid_1d(d.elems()))
}

/// out (B,T,C) from y (B,H,T,D).
pub fn merge(k: &Kernels, out: &View, y: &View, d: Dims) -> Result<()> {
    k.dispatch(ATTENTION, "attention_merge", &[out, y], &d, grid_1d(d.elems()))
}

/// dy (B,H,T,D) += from dout (B,T,C).
pub fn merge_backward(k: &Kernels, dy: &View, dout: &View, d: Dims) -> Result<()> {
    k.dispatch(ATTENTION, "attention_merge_backward", &[dy, dout], &d, grid_1d(d.elems()))
}
