//! Frozen int8 weights: a Linear's (in, out) weight stored as int8 with one f32 scale per input
//! row — a quarter of the bytes to keep, page and upload — and dequantized inside the matmul
//! kernel as it reads them. Frozen means no gradient for the weight; inputs still get theirs.

use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::matmul::{self as mm, dequantize_rows, quantize_rows, Gemm, QuantB};
use crate::kernels::reduce;
use crate::tensor::{DType, Tensor};

/// An int8 weight matrix of `rows` × `cols` (GPT-2's Conv1D layout: in × out).
#[derive(Clone)]
pub struct QWeight {
    /// Values, four to a u32 word.
    pub q: Tensor,
    /// One scale per row.
    pub scales: Tensor,
    pub rows: usize,
    pub cols: usize,
}

impl QWeight {
    /// Quantizes `w` (rows × cols, f32) with one scale per row.
    pub fn quantize(ctx: &Context, name: &str, w: &[f32], rows: usize, cols: usize) -> Result<QWeight> {
        if w.len() != rows * cols {
            return Err(Error::shape("quantize", rows * cols, w.len()));
        }
        let (words, scales) = quantize_rows(w, rows, cols);
        Ok(QWeight {
            q: ctx.from_u32(&format!("{name} (int8)"), &[words.len()], &words)?,
            scales: ctx.from_f32(&format!("{name} (scales)"), &[rows], &scales, false)?,
            rows,
            cols,
        })
    }

    /// The f32 values the kernels compute with (for checkpoints).
    pub async fn dequantize(&self, ctx: &Context) -> Result<Vec<f32>> {
        let words = ctx.to_u32(&self.q).await?;
        let scales = ctx.to_f32(&self.scales).await?;
        Ok(dequantize_rows(&words, &scales, self.rows, self.cols))
    }

    /// Bytes stored: values and scales.
    pub fn bytes(&self) -> u64 {
        self.q.bytes() + self.scales.bytes()
    }
}

fn product(ctx: &Context, out: &Tensor, x: &Tensor, w: &QWeight, bias: Option<&Tensor>, g: Gemm) -> Result<()> {
    let _op = ctx.op();
    let (q, scales) = (ctx.read(&w.q)?, ctx.read(&w.scales)?);
    let qb = QuantB { q: &q, scales: &scales, row_len: w.cols };
    let bias = bias.map(|b| ctx.read(b)).transpose()?;
    let cv = ctx.write_or_modify(out, g.beta != 0.0)?;
    let variant = mm::pick(ctx.kernels.tuning.matmul, &g);
    mm::matmul_q8(&ctx.kernels, variant, &cv, &ctx.read(x)?, qb, bias.as_ref(), &ctx.dummy()?, g)
}

/// `x · W + bias` with W frozen in int8: x (..., in), W (in, out), bias (out) → (..., out).
pub fn linear_q8(ctx: &Context, x: &Tensor, w: &QWeight, bias: Option<&Tensor>) -> Result<Tensor> {
    if !matches!(x.dtype(), DType::F32 | DType::F16) || x.last_dim() != w.rows {
        return Err(Error::shape("linear_q8", format!("f32 or f16 x (..., {})", w.rows), x));
    }
    if let Some(b) = bias {
        if b.shape() != [w.cols] {
            return Err(Error::shape("linear_q8 bias", [w.cols], b.shape()));
        }
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("non-empty") = w.cols;
    let inputs: Vec<&Tensor> = [Some(x), bias].into_iter().flatten().collect();
    let out = ctx.empty("linear_q8", &shape, x.dtype(), ctx.wants_grad(&inputs))?;
    product(ctx, &out, x, w, bias, Gemm::new(x.rows(), w.cols, w.rows))?;
    if out.requires_grad() {
        ctx.record(&[&out], LinearQ8Backward { x: x.clone(), w: w.clone(), bias: bias.cloned(), out: out.clone() });
    }
    Ok(out)
}

struct LinearQ8Backward {
    x: Tensor,
    w: QWeight,
    bias: Option<Tensor>,
    out: Tensor,
}

impl Backward for LinearQ8Backward {
    fn name(&self) -> &'static str {
        "linear_q8"
    }

    // dx += dy · Wᵀ (W read in int8, transposed by strides); W itself is frozen.
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dy) = grads.get(&self.out) else { return Ok(()) };
        if let Some(dx) = grads.of(ctx, &self.x)? {
            let g = Gemm { trans_b: true, beta: 1.0, ..Gemm::new(self.x.rows(), self.w.rows, self.w.cols) };
            product(ctx, &dx, &dy, &self.w, None, g)?;
        }
        if let Some(bias) = &self.bias {
            if let Some(db) = grads.of(ctx, bias)? {
                let parts = super::column_partials(ctx, self.out.rows(), self.w.cols)?;
                let _op = ctx.op();
                let pv = parts.as_ref().map(|t| ctx.write(t)).transpose()?;
                reduce::sum_rows(
                    &ctx.kernels,
                    &ctx.modify(&db)?,
                    &ctx.read(&dy)?,
                    pv.as_ref(),
                    self.out.rows(),
                    self.w.cols,
                )?;
            }
        }
        Ok(())
    }
}
