//! Differentiable ops: each checks shapes, records its backward node, and calls kernels.
//! Shapes use the legend in [`crate::tensor`].

mod activation;
mod attention;
mod cross_entropy;
mod decode;
mod elementwise;
mod embedding;
mod layernorm;
mod lm_head;
mod matmul;
mod mixed;
mod quantized;
mod softmax;

pub use activation::{gelu, gelu_into, relu};
pub use attention::{causal_self_attention, causal_self_attention_keeping};
pub use cross_entropy::cross_entropy;
pub use decode::{decode_attention, decode_embed, kv_append};
pub use elementwise::{add, cast, mean, scale, sum};
pub use embedding::embedding;
pub use layernorm::{layernorm, layernorm_into};
pub use lm_head::{head_keeps_logits, lm_head_loss, lm_head_loss_for_backward, logits_dtype, LossBackward};
pub use matmul::{linear, linear_into, matmul, MatmulOpts};
pub use mixed::{linear_mixed, refresh_half};
pub use quantized::{linear_q8, QWeight};
pub use softmax::softmax;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::reduce::column_blocks;
use crate::tensor::{DType, Tensor};

/// Scratch for a two-stage column sum over (rows, cols) (see `column_blocks`), None where one
/// stage does.
fn column_partials(ctx: &Context, rows: usize, cols: usize) -> Result<Option<Tensor>> {
    let blocks = column_blocks(rows, cols);
    (blocks > 1).then(|| ctx.empty("column sum partials", &[blocks, cols], DType::F32, false)).transpose()
}

fn expect_f32(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::shape(op, "f32 tensor", t));
    }
    Ok(())
}

/// Activations may be f32 or f16 (mixed precision); kernels compute in f32 either way.
fn expect_float(op: &'static str, t: &Tensor) -> Result<()> {
    if !matches!(t.dtype(), DType::F32 | DType::F16) {
        return Err(Error::shape(op, "f32 or f16 tensor", t));
    }
    Ok(())
}

fn expect_same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shape(op, a.shape(), b.shape()));
    }
    Ok(())
}
