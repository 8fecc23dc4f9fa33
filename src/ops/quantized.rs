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
    let qb = QuantB { q: &q, scales: &scales, row_len: w.cols, f16: false };
    let bias = bias.map(|b| ctx.read(b)).transpose()?;
    let cv = if g.beta == 0.0 { ctx.write(out)? } else { ctx.modify(out)? };
    mm::matmul_q8(&ctx.kernels, ctx.kernels.tuning.matmul, &cv, &ctx.read(x)?, qb, bias.as_ref(), &ctx.dummy()?, g)
}

/// `x · W + bias` with W frozen in int8: x (..., in), W (in, out), bias (out) → (..., out).
pub fn linear_q8(ctx: &Context, x: &Tensor, w: &QWeight, bias: Option<&Tensor>) -> Result<Tensor> {
    if x.dtype() != DType::F32 || x.last_dim() != w.rows {
        return Err(Error::shape("linear_q8", format!("f32 x (..., {})", w.rows), x));
    }
    if let Some(b) = bias {
        if b.shape() != [w.cols] {
            return Err(Error::shape("linear_q8 bias", [w.cols], b.shape()));
        }
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("non-empty") = w.cols;
    let inputs: Vec<&Tensor> = [Some(x), bias].into_iter().flatten().collect();
    let out = ctx.empty("linear_q8", &shape, DType::F32, ctx.wants_grad(&inputs))?;
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
                let _op = ctx.op();
                reduce::sum_rows(&ctx.kernels, &ctx.modify(&db)?, &ctx.read(&dy)?, self.out.rows(), self.w.cols)?;
            }
        }
        Ok(())
    }
}

/// `x · W + bias` in mixed precision: the product reads `w16`, the f16 copy of the f32 master
/// weight `w` (K,N) packed two to a u32 word; backward gives dx from the f16 copy and dW, dbias in
/// f32 (accumulated into the master weight's gradient). x (..., K) → (..., N).
pub fn linear_mixed(ctx: &Context, x: &Tensor, w: &Tensor, w16: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (k, n) = (w.shape()[0], w.shape()[1]);
    if x.dtype() != DType::F32 || x.last_dim() != k || w16.len() != (k * n).div_ceil(2) {
        return Err(Error::shape(
            "linear_mixed",
            format!("x (..., {k}) and an f16 copy of a ({k},{n}) weight"),
            (x.shape(), w16.shape()),
        ));
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("non-empty") = n;
    let inputs: Vec<&Tensor> = [Some(x), Some(w), bias].into_iter().flatten().collect();
    let out = ctx.empty("linear_mixed", &shape, DType::F32, ctx.wants_grad(&inputs))?;
    half_product(ctx, &out, x, w16, (k, n), bias, Gemm::new(x.rows(), n, k))?;
    if out.requires_grad() {
        ctx.record(
            &[&out],
            LinearMixedBackward { x: x.clone(), w: w.clone(), w16: w16.clone(), bias: bias.cloned(), out: out.clone() },
        );
    }
    Ok(out)
}

fn half_product(
    ctx: &Context,
    out: &Tensor,
    x: &Tensor,
    w16: &Tensor,
    (_k, n): (usize, usize),
    bias: Option<&Tensor>,
    g: Gemm,
) -> Result<()> {
    let _op = ctx.op();
    let (q, dummy) = (ctx.read(w16)?, ctx.dummy()?);
    let qb = QuantB { q: &q, scales: &dummy, row_len: n, f16: true };
    let bias = bias.map(|b| ctx.read(b)).transpose()?;
    let cv = if g.beta == 0.0 { ctx.write(out)? } else { ctx.modify(out)? };
    mm::matmul_q8(&ctx.kernels, ctx.kernels.tuning.matmul, &cv, &ctx.read(x)?, qb, bias.as_ref(), &dummy, g)
}

struct LinearMixedBackward {
    x: Tensor,
    w: Tensor,
    w16: Tensor,
    bias: Option<Tensor>,
    out: Tensor,
}

impl Backward for LinearMixedBackward {
    fn name(&self) -> &'static str {
        "linear_mixed"
    }

    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dy) = grads.get(&self.out) else { return Ok(()) };
        let (k, n, rows) = (self.w.shape()[0], self.w.shape()[1], self.x.rows());
        if let Some(dx) = grads.of(ctx, &self.x)? {
            // dx += dy · Wᵀ, W read from its f16 copy (stored (K,N) = (n', k') for this product)
            let g = Gemm { trans_b: true, beta: 1.0, ..Gemm::new(rows, k, n) };
            half_product(ctx, &dx, &dy, &self.w16, (k, n), None, g)?;
        }
        if let Some(dw) = grads.of(ctx, &self.w)? {
            // dW += xᵀ · dy in f32
            let _op = ctx.op();
            let g = Gemm { trans_a: true, beta: 1.0, ..Gemm::new(k, n, rows) };
            mm::matmul(&ctx.kernels, &ctx.modify(&dw)?, &ctx.read(&self.x)?, &ctx.read(&dy)?, None, &ctx.dummy()?, g)?;
        }
        if let Some(bias) = &self.bias {
            if let Some(db) = grads.of(ctx, bias)? {
                let _op = ctx.op();
                reduce::sum_rows(&ctx.kernels, &ctx.modify(&db)?, &ctx.read(&dy)?, rows, n)?;
            }
        }
        Ok(())
    }
}

/// Refreshes `w16` (packed f16 pairs) from the f32 master weight `w`.
pub fn pack_half(ctx: &Context, w16: &Tensor, w: &Tensor) -> Result<()> {
    let _op = ctx.op();
    crate::kernels::elementwise::pack_f16(&ctx.kernels, &ctx.write(w16)?, &ctx.read(w)?, w.len())
}
