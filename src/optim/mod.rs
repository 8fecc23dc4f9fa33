//! Optimizers with fused WGSL updates, and global grad-norm clipping shared by both.

mod adamw;
mod clip;
mod delayed_update;
mod early_norms;
#[cfg(target_arch = "x86_64")]
mod fused_f16_update;
mod grads_down;
mod half_grads;
mod host_adamw;
mod host_kernels;
mod host_values;
mod last_additions;
mod sgd;
mod speculative_update;
mod split_adamw;
mod update_ahead;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::GradClip;
pub use early_norms::EarlyNorms;
pub use grads_down::GradsDown;
pub use half_grads::{grad_half_scale, split_tail, unscale_of, HalfGrads, EXPONENT_TAIL};
pub(crate) use host_adamw::update_slice;
pub use host_adamw::HostAdamW;
pub use host_kernels::{
    adamw_update, adamw_update_from, sum_of_squares, worker_threads, AdamWSlices, AdamWStep, GradSlice, CHUNK,
};
pub(crate) use host_values::F32sMut;
pub use sgd::{Sgd, SgdConfig};
pub use speculative_update::forced as bets_forced;
pub use split_adamw::{gpu_share, kept_bytes, kept_bytes_of, SplitAdamW};

use crate::context::Context;
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

/// AdamW's first and second moments for `params`, zero, named as PyTorch's state
/// (`<name>.exp_avg`, `<name>.exp_avg_sq`); pager tensors wherever the update runs.
fn zero_moments(ctx: &Context, params: &[&Param]) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let mut m = Vec::with_capacity(params.len());
    let mut v = Vec::with_capacity(params.len());
    for p in params {
        m.push(ctx.zeros(&format!("{}.exp_avg", p.name), p.value.shape(), false)?);
        v.push(ctx.zeros(&format!("{}.exp_avg_sq", p.name), p.value.shape(), false)?);
    }
    Ok((m, v))
}
