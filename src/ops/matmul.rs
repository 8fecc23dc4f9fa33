//! Matrix products: batched `matmul` with transposes, and `linear` (x·W + b, GPT-2's Conv1D layout).
//! Operands may be f32 or f16; the product has the first operand's element type.

use super::expect_float;
use crate::autograd::{Backward, Grads};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::matmul::{self as k, Gemm};
use crate::kernels::{reduce, MatmulVariant};
use crate::tensor::{DType, Tensor};

/// Options of [`matmul`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOpts {
    /// `a` is stored (..., K, M) and used transposed.
    pub trans_a: bool,
    /// `b` is stored (..., N, K) and used transposed.
    pub trans_b: bool,
    /// Multiplies the product.
    pub alpha: Option<f32>,
}

/// `alpha · op(a) · op(b)`: op(a) (..., M, K), op(b) (..., K, N) with equal leading (batch) dims,
/// or op(b) 2-D and shared by every batch entry when `a` is flattened to rows → (..., M, N).
pub fn matmul(ctx: &Context, a: &Tensor, b: &Tensor, opts: MatmulOpts) -> Result<Tensor> {
    product(ctx, a, b, None, opts)
}

/// `x · w + bias`: x (..., K), w (K, N), bias (N) → (..., N). The weight layout of GPT-2's Conv1D.
pub fn linear(ctx: &Context, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    product(ctx, x, w, bias, MatmulOpts::default())
}

fn dims2(t: &Tensor, trans: bool) -> (usize, usize) {
    let s = t.shape();
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    if trans {
        (c, r)
    } else {
        (r, c)
    }
}

fn product(ctx: &Context, a: &Tensor, b: &Tensor, bias: Option<&Tensor>, opts: MatmulOpts) -> Result<Tensor> {
    product_with_grad_to(ctx, a, b, bias, opts, b)
}

/// [`product`] whose gradient for `b` accumulates into the gradient of `b_grad` (same shape)
/// instead: the product reads an f16 copy, its f32 master weight learns (mixed precision).
pub(super) fn product_with_grad_to(
    ctx: &Context,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    opts: MatmulOpts,
    b_grad: &Tensor,
) -> Result<Tensor> {
    if b_grad.shape() != b.shape() {
        return Err(Error::shape("matmul gradient target", b.shape(), b_grad.shape()));
    }
    let (g, out_shape) = gemm_of(a, b, bias, opts)?;
    let inputs: Vec<&Tensor> = [Some(a), Some(b_grad), bias].into_iter().flatten().collect();
    let out = ctx.empty("matmul", &out_shape, a.dtype(), ctx.wants_grad(&inputs))?;
    run_product(ctx, &out, a, b, bias, g)?;
    if out.requires_grad() {
        let node = MatmulBackward {
            a: a.clone(),
            b: b.clone(),
            b_grad: b_grad.clone(),
            bias: bias.cloned(),
            out: out.clone(),
            g,
        };
        ctx.record(&[&out], node);
    }
    Ok(out)
}

/// The product's dimensions (checked) and the shape of its result.
fn gemm_of(a: &Tensor, b: &Tensor, bias: Option<&Tensor>, opts: MatmulOpts) -> Result<(Gemm, Vec<usize>)> {
    expect_float("matmul", a)?;
    expect_float("matmul", b)?;
    if a.shape().len() < 2 && !(a.shape().len() == 1 && b.shape().len() == 2) {
        return Err(Error::shape("matmul", "a with at least 2 dims", a.shape()));
    }
    if b.shape().len() < 2 {
        return Err(Error::shape("matmul", "b with at least 2 dims", b.shape()));
    }
    let shared_b = b.shape().len() == 2;
    // With a shared 2-D b, all of a's leading dims are rows of one big product.
    let (batch, m, ka, out_shape) = if shared_b && !opts.trans_a {
        let k = a.last_dim();
        let mut shape = a.shape()[..a.shape().len() - 1].to_vec();
        shape.push(dims2(b, opts.trans_b).1);
        (1, a.rows(), k, shape)
    } else {
        let (m, k) = dims2(a, opts.trans_a);
        let lead = &a.shape()[..a.shape().len() - 2];
        if !shared_b && lead != &b.shape()[..b.shape().len() - 2] {
            return Err(Error::shape("matmul", format!("batch dims {lead:?}"), b.shape()));
        }
        let mut shape = lead.to_vec();
        shape.extend([m, dims2(b, opts.trans_b).1]);
        (lead.iter().product::<usize>(), m, k, shape)
    };
    if shared_b && batch > 1 {
        return Err(Error::shape("matmul", "batched b for a transposed batched a", b.shape()));
    }
    let (kb, n) = dims2(b, opts.trans_b);
    if ka != kb {
        return Err(Error::shape(
            "matmul",
            format!("inner dims equal (a {:?}, b {:?})", a.shape(), b.shape()),
            (ka, kb),
        ));
    }
    if let Some(bias) = bias {
        if bias.shape() != [n] {
            return Err(Error::shape("linear bias", [n], bias.shape()));
        }
    }
    let g = Gemm {
        batch,
        trans_a: opts.trans_a,
        trans_b: opts.trans_b,
        alpha: opts.alpha.unwrap_or(1.0),
        ..Gemm::new(m, n, ka)
    };
    Ok((g, out_shape))
}

/// The product `g` of `a` and `b` (+ bias) written into `out`.
fn run_product(ctx: &Context, out: &Tensor, a: &Tensor, b: &Tensor, bias: Option<&Tensor>, g: Gemm) -> Result<()> {
    let _op = ctx.op();
    let bias_view = bias.map(|t| ctx.read(t)).transpose()?;
    k::matmul(&ctx.kernels, &ctx.write(out)?, &ctx.read(a)?, &ctx.read(b)?, bias_view.as_ref(), &ctx.dummy()?, g)
}

/// `linear(x, w, bias)` written into `out` again, recording nothing: how a Linear's output let
/// go for backward is made again (`autograd::remake_for_backward`). The same kernel on the same
/// inputs as the forward: the same bits.
pub fn linear_into(ctx: &Context, out: &Tensor, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    let (g, shape) = gemm_of(x, w, bias, MatmulOpts::default())?;
    if out.shape() != shape.as_slice() || out.dtype() != x.dtype() {
        return Err(Error::shape("linear_into", format!("{shape:?} {:?}", x.dtype()), (out.shape(), out.dtype())));
    }
    run_product(ctx, out, x, w, bias, g)
}

struct MatmulBackward {
    a: Tensor,
    b: Tensor,
    /// Receives d op(B): `b` itself, or the master weight of an f16 copy.
    b_grad: Tensor,
    bias: Option<Tensor>,
    out: Tensor,
    g: Gemm,
}

impl Backward for MatmulBackward {
    fn name(&self) -> &'static str {
        "matmul"
    }

    // With C = α·op(A)·op(B): d op(A) = α·dC·op(B)ᵀ and d op(B) = α·op(A)ᵀ·dC, each written in the
    // storage layout of A and B by choosing which operand is read transposed.
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dc) = grads.get(&self.out) else {
            return Ok(());
        };
        let g = self.g;
        let (ta, tb) = (g.trans_a, g.trans_b);
        let base = Gemm { batch: g.batch, alpha: g.alpha, beta: 1.0, ..g };
        // (dA is written whole: a new gradient is overwritten, not cleared and added to)
        if let Some((da, beta)) = grads.of_written(ctx, &self.a)? {
            let _op = ctx.op();
            let dav = ctx.write_or_modify(&da, beta != 0.0)?;
            let (dcv, bv, dummy) = (ctx.read(&dc)?, ctx.read(&self.b)?, ctx.dummy()?);
            let base = Gemm { beta, ..base };
            if !ta {
                // dA (M,K) = dC (M,N) · op(B)ᵀ
                let gg = Gemm { m: g.m, n: g.k, k: g.n, trans_a: false, trans_b: !tb, ..base };
                match transposed_for_coop(ctx, &self.b, &dcv, &bv, gg)? {
                    Some(bt) => {
                        let gg = Gemm { trans_b: false, ..gg };
                        k::matmul(&ctx.kernels, &dav, &dcv, &ctx.read(&bt)?, None, &dummy, gg)?;
                    }
                    None => k::matmul(&ctx.kernels, &dav, &dcv, &bv, None, &dummy, gg)?,
                }
            } else {
                // dA (K,M) = op(B) (K,N) · dCᵀ
                let gg = Gemm { m: g.k, n: g.m, k: g.n, trans_a: tb, trans_b: true, ..base };
                k::matmul(&ctx.kernels, &dav, &bv, &dcv, None, &dummy, gg)?;
            }
        }
        if let Some(db) = grads.of(ctx, &self.b_grad)? {
            let _op = ctx.op();
            let (dbv, dcv, av, dummy) = (ctx.modify(&db)?, ctx.read(&dc)?, ctx.read(&self.a)?, ctx.dummy()?);
            if !tb {
                // dB (K,N) = op(A)ᵀ · dC (M,N)
                let gg = Gemm { m: g.k, n: g.n, k: g.m, trans_a: !ta, trans_b: false, ..base };
                let splits = k::split_k(ctx.kernels.tuning.matmul, &gg);
                if splits > 1 {
                    let parts = ctx.empty("matmul split-k partials", &[splits, gg.m * gg.n], DType::F32, false)?;
                    let variant = k::pick(ctx.kernels.tuning.matmul, &Gemm { batch: splits, ..gg });
                    let variant = k::for_operands(&ctx.kernels, variant, &av, &dcv);
                    k::matmul_split(&ctx.kernels, variant, &dbv, &av, &dcv, &ctx.write(&parts)?, &dummy, splits, gg)?;
                } else {
                    k::matmul(&ctx.kernels, &dbv, &av, &dcv, None, &dummy, gg)?;
                }
            } else {
                // dB (N,K) = dCᵀ · op(A) (M,K)
                let gg = Gemm { m: g.n, n: g.k, k: g.m, trans_a: true, trans_b: ta, ..base };
                k::matmul(&ctx.kernels, &dbv, &dcv, &av, None, &dummy, gg)?;
            }
        }
        if let Some(bias) = &self.bias {
            if let Some(dbias) = grads.of(ctx, bias)? {
                let parts = super::column_partials(ctx, g.batch * g.m, g.n)?;
                let _op = ctx.op();
                let pv = parts.as_ref().map(|t| ctx.write(t)).transpose()?;
                reduce::sum_rows(&ctx.kernels, &ctx.modify(&dbias)?, &ctx.read(&dc)?, pv.as_ref(), g.batch * g.m, g.n)?;
            }
        }
        Ok(())
    }
}

/// Largest B copied transposed by [`transposed_for_coop`]: GPT-2 XL's largest weight (1600 ×
/// 6400 f16, 20 MB) fits; the head's embedding (50257 rows) does not.
const TRANSPOSED_COPY_MAX_BYTES: usize = 32 << 20;

/// Where `matmul_coop` would read B transposed (`g` NT, one batch, B stored (N, K)), a copy of B
/// stored (K, N), so the product runs NN: on the H200 `matmul_coop` multiplies 4096³ NN at 148
/// TFLOP/s and NT at 106 where it tests bounds. Where its tiles cover the product exactly it
/// tests none, and NT runs about as fast as NN (4096³ 153 against 156; GPT-2's dA 8192×768×K
/// for K = 768, 2304, 3072: 104 / 137 / 138 against 93 / 134 / 128; with 16-byte fetches
/// 8192×3072×768 129–133 against 130–133, where it was 106 against 125). The copy moves 4 bytes an
/// element of B once; the product reads each element M / 128 times. `None` elsewhere, for
/// products too short to pay for it, or with `PAGETRAIN_NT_COPY=0` (for measuring). f32
/// products on `matmul_large` are not copied: there NT is within 7 % of NN and the f32 GPT-2
/// step got 0.4 % slower with the copy.
fn transposed_for_coop(
    ctx: &Context,
    b: &Tensor,
    av: &crate::pager::View,
    bv: &crate::pager::View,
    g: Gemm,
) -> Result<Option<Tensor>> {
    let variant = k::for_operands(&ctx.kernels, k::pick(ctx.kernels.tuning.matmul, &g), av, bv);
    let wanted = variant == MatmulVariant::Coop && std::env::var("PAGETRAIN_NT_COPY").as_deref() != Ok("0");
    let bytes = g.n * g.k * b.dtype().size();
    let nt_as_fast = k::coop_tiles_whole(&g);
    if !wanted
        || nt_as_fast
        || g.trans_a
        || !g.trans_b
        || g.batch != 1
        || g.m < 1024
        || bytes > TRANSPOSED_COPY_MAX_BYTES
    {
        return Ok(None);
    }
    let bt = ctx.empty("matmul operand transposed", &[g.k, g.n], b.dtype(), false)?;
    crate::kernels::transpose::transpose(&ctx.kernels, &ctx.write(&bt)?, bv, g.n, g.k)?;
    Ok(Some(bt))
}
