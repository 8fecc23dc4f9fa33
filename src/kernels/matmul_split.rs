//! Products split along K into slices that run as one batch, then summed in a fixed order:
//! for products whose output has too few tiles to fill a GPU over a deep K (weight gradients,
//! the head's dx a chunk of rows at a time), and on CPU adapters for the caches.

use super::matmul::{matmul_variant, pick, Gemm, LARGE_TILE};
use super::{Kernels, MatmulVariant};
use crate::error::{Error, Result};
use crate::pager::View;
use crate::tensor::DType;

/// Shallowest K slice a split product gives `matmul_direct` (see [`split_k`]).
const DIRECT_MIN_SLICE: usize = 512;

/// Output tiles a split product aims for (H200, GPT-2 step: 400 ran 284–289 ms, 200 290 ms).
const SPLIT_TARGET_TILES: usize = 400;

/// Into how many K slices to split an accumulating product `C += alpha·Aᵀ·B` (a weight
/// gradient: M, N small, K = all the rows of a batch) whose output has too few 128×128 tiles to
/// fill a GPU; 1 = no split. The slices run as a batch (in this layout slice s of A and B starts
/// at s·(K/S)·M and s·(K/S)·N, exactly the batch strides) into a scratch of (S, M·N), which
/// `reduce::sum_rows` then adds to C in a fixed order, so results stay deterministic.
/// On CPU adapters (`Direct`) the split is for the caches instead: a thread of `matmul_direct`
/// streams its rows and columns over the whole depth, so K is cut into slices of at least
/// [`DIRECT_MIN_SLICE`] (llvmpipe, char GPT 16 × 128, whose weight gradients have K = 2048: a step
/// of 1050–1080 ms unsplit, 865–903 at slices of 512, 984 at 256, 823–1137 at 1024).
pub fn split_k(tuned: MatmulVariant, g: &Gemm) -> usize {
    if !matches!(tuned, MatmulVariant::Large | MatmulVariant::Coop | MatmulVariant::Direct) || !gradient_splits(g) {
        return 1;
    }
    if tuned == MatmulVariant::Direct {
        let mut s = 1;
        while s < 16 && g.k.is_multiple_of(2 * s) && g.k / (2 * s) >= DIRECT_MIN_SLICE {
            s *= 2;
        }
        return s;
    }
    let tiles = g.m.div_ceil(LARGE_TILE) * g.n.div_ceil(LARGE_TILE);
    let mut s = 1;
    while tiles * s < SPLIT_TARGET_TILES && s < 16 && g.k.is_multiple_of(2 * s) && g.k / (2 * s) >= 256 {
        s *= 2;
    }
    s
}

/// `c += alpha·Aᵀ·B` as `splits` K slices run as one batch into `partials` (splits·M·N floats),
/// then summed into C in slice order (see [`split_k`]). C starts at its view (offset 0).
#[allow(clippy::too_many_arguments)]
pub fn matmul_split(
    k: &Kernels,
    variant: MatmulVariant,
    c: &View,
    a: &View,
    b: &View,
    partials: &View,
    dummy: &View,
    splits: usize,
    g: Gemm,
) -> Result<()> {
    let fits = gradient_splits(&g) && g.offsets[2] == 0 && splits > 0 && g.k.is_multiple_of(splits);
    if !fits {
        return Err(Error::invalid("matmul", format!("{g:?} cannot be split into {splits} K slices")));
    }
    let gs = Gemm { batch: splits, k: g.k / splits, beta: 0.0, offsets: [g.offsets[0], g.offsets[1], 0], ..g };
    matmul_variant(k, variant, partials, a, b, None, dummy, gs)?;
    super::reduce::sum_rows(k, c, partials, None, splits, g.m * g.n)
}

/// Whether `g` has the layout [`split_k`] and [`matmul_split`] split: `C += alpha·Aᵀ·B`, one
/// product whose M·N partial sums `reduce::sum_rows` can add. (Slices take the packed batch
/// strides: a product that names its own is not split.)
fn gradient_splits(g: &Gemm) -> bool {
    let layout = g.trans_a && !g.trans_b && g.batch == 1 && g.beta == 1.0 && g.batch_strides.is_none();
    layout && g.m * g.n <= super::MAX_GROUPS as usize * 256
}

/// Most K slices [`split_k_deep`] cuts, and the shallowest slice it leaves (partials take
/// splits·M·N floats: a slice of 2048 writes one for 2048 multiply-adds).
const DEEP_MAX_SPLITS: usize = 16;
const DEEP_MIN_SLICE: usize = 2048;

/// Into how many K slices to split `C = alpha·A·op(B) + beta·C` (A stored (M,K), rows padded
/// to `a_stride`) on cooperative matrices: a product whose output has too few tiles to fill the
/// GPU over a deep K — the head's dx = dlogits·wte a chunk of rows at a time (1024 × 768 over
/// K = 50304 at a quarter of GPT-2's footprint: 48 tiles; 8 chunks took 13.9 ms a step on an
/// H100 against 3.5 for the whole 8192 rows). As many slices as keep each a whole number of
/// the kernel's depth steps (a multiple of 64 covers them: no bounds tests) and at least
/// [`DEEP_MIN_SLICE`] deep; 1 = no split.
pub fn split_k_deep(tuned: MatmulVariant, g: &Gemm) -> usize {
    let tiles = g.m.div_ceil(LARGE_TILE) * g.n.div_ceil(LARGE_TILE);
    if tuned != MatmulVariant::Coop || !deep_splits(g) || tiles >= SPLIT_TARGET_TILES {
        return 1;
    }
    let fits = |s: &usize| g.k.is_multiple_of(*s) && (g.k / s).is_multiple_of(64) && g.k / s >= DEEP_MIN_SLICE;
    (1..=DEEP_MAX_SPLITS).rev().find(fits).unwrap_or(1)
}

/// Whether `g` has the layout [`split_k_deep`] and [`matmul_split_deep`] split: one product,
/// A not transposed (its slices are column ranges of its rows), packed batch strides.
fn deep_splits(g: &Gemm) -> bool {
    !g.trans_a && g.batch == 1 && g.batch_strides.is_none()
}

/// `C = alpha·A·op(B) + beta·C` (A stored (M,K), not transposed; cooperative matrices, which
/// take A's padded row stride) as `splits` K slices run as one batch into `partials`
/// (splits·M·N f32), then summed into C in slice order by a product with `ones` (`splits` f32
/// ones): one more read of the partials, deterministic, and C may be f16 or f32.
#[allow(clippy::too_many_arguments)]
pub fn matmul_split_deep(
    k: &Kernels,
    c: &View,
    a: &View,
    b: &View,
    partials: &View,
    ones: &View,
    dummy: &View,
    splits: usize,
    g: Gemm,
) -> Result<()> {
    let fits = deep_splits(&g) && splits > 0 && g.k.is_multiple_of(splits);
    let room = partials.size >= (splits * g.m * g.n * 4) as u64 && ones.size >= splits as u64 * 4;
    if !fits || !room || partials.dtype != DType::F32 || ones.dtype != DType::F32 {
        return Err(Error::invalid(
            "matmul",
            format!("{g:?} cannot be split into {splits} deep K slices (partials {partials:?}, ones {ones:?})"),
        ));
    }
    let ks = g.k / splits;
    // rows along K keep their whole length (A's, and B's stored (N,K)); slice s starts s·ks
    // into them, or s·ks rows into B stored (K,N)
    let whole = |stride: usize| if stride == 0 { g.k } else { stride };
    let (a_stride, b_stride) = (whole(g.a_stride), if g.trans_b { whole(g.b_stride) } else { g.b_stride });
    let b_slice = if g.trans_b { ks } else { ks * if g.b_stride == 0 { g.n } else { g.b_stride } };
    let gs = Gemm {
        batch: splits,
        k: ks,
        beta: 0.0,
        offsets: [g.offsets[0], g.offsets[1], 0],
        a_stride,
        b_stride,
        batch_strides: Some([ks, b_slice, g.m * g.n]),
        ..g
    };
    matmul_variant(k, MatmulVariant::Coop, partials, a, b, None, dummy, gs)?;
    // C (one row of M·N) = ones (1 × splits) · partials (splits × M·N) + beta·C
    let sum = Gemm { beta: g.beta, offsets: [0, 0, g.offsets[2]], ..Gemm::new(1, g.m * g.n, splits) };
    let variant = pick(k.tuning.matmul, &sum);
    matmul_variant(k, variant, c, ones, partials, None, dummy, sum)
}
