//! Launcher for `shaders/matmul.wgsl` and `shaders/matmul_large.wgsl`: tiled, register-blocked,
//! batched; transposes by strides (64×64 and direct kernels) or compiled into the pipeline
//! (128×128 or 128×96 `matmul_large`, vec4 reads where the layout allows). Products split along
//! K: `matmul_split.rs`; the cooperative-matrix launcher and its rules: `matmul_coop.rs`.

use super::matmul_coop::{coop_operands, launch_coop};
use super::{
    Kernels, LargeVec4, MatmulVariant, Variant, MATMUL, MATMUL_DIRECT, MATMUL_DIRECT_SUBGROUPS, MATMUL_LARGE,
    MAX_GROUPS,
};
use crate::error::{Error, Result};
use crate::pager::View;
use crate::tensor::DType;

pub use super::matmul_coop::{coop_loads_inside, coop_padded_len, coop_pads_rows, coop_tiles_whole, COOP_TILE};
pub use super::matmul_split::{matmul_split, matmul_split_deep, split_k, split_k_deep};

gpu_params! {
    /// The uniform of every matmul family (matmul, matmul_large, matmul_direct, matmul_coop).
    pub(super) struct Params {
        m: u32,
        n: u32,
        k: u32,
        batch: u32,
        stride_a: u32,
        stride_b: u32,
        stride_c: u32,
        has_bias: u32,
        a_rs: u32,
        a_cs: u32,
        b_rs: u32,
        b_cs: u32,
        alpha: f32,
        beta: f32,
        /// element offsets of the first batch entry of a, b and c (chunks of larger tensors)
        a_off: u32,
        b_off: u32,
        c_off: u32,
        /// quant_b = 1: B is int8, four to a word in `bq`, element e scaled by bscale[e / q_row_len]
        quant_b: u32,
        q_row_len: u32,
        _pad: u32,
    }
}

/// An int8 B operand: `q` holds four values to a u32 word, `scales` one f32 per stored row of
/// `row_len` elements (see `quantize_rows`). (f16 operands need no packing: f16 views bind as is.)
#[derive(Clone, Copy)]
pub struct QuantB<'a> {
    pub q: &'a View,
    pub scales: &'a View,
    pub row_len: usize,
}

/// Shape and layout of one (batched) product `C = alpha·op(A)·op(B) + beta·C (+ bias)`.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A is stored (K,M) and used transposed.
    pub trans_a: bool,
    /// B is stored (N,K) and used transposed.
    pub trans_b: bool,
    pub alpha: f32,
    /// 0 overwrites C, 1 accumulates into it.
    pub beta: f32,
    /// Element offsets where A, B and C start in their buffers (row chunks of larger tensors).
    pub offsets: [usize; 3],
    /// Elements from one stored row of A to the next, past its length (0: packed rows). The
    /// padding must hold zeros: `matmul_coop` reads rows padded to a multiple of 8 a chunk at a
    /// time, and past K without bounds tests where they are padded to [`coop_padded_len`].
    /// Cooperative-matrix products only (see [`coop_pads_rows`]).
    pub a_stride: usize,
    /// The same for B. Where B is stored (K,N), its padding only meets columns of C past N, which
    /// are never written; stored (N,K), it must be zeros as A's.
    pub b_stride: usize,
    /// Elements from one batch entry's A, B and C to the next's; `None`: each entry's matrices
    /// follow the last one's (packed as their row strides say). Deep split-K products set them:
    /// their entries are slices of one K ([`matmul_split_deep`]).
    pub batch_strides: Option<[usize; 3]>,
}

impl Gemm {
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            offsets: [0; 3],
            a_stride: 0,
            b_stride: 0,
            batch_strides: None,
        }
    }
}

const TILE: usize = 64;
pub(super) const LARGE_TILE: usize = 128;
/// Columns of a narrow `matmul_large` tile (rows stay [`LARGE_TILE`]).
const NARROW_TILE: usize = 96;
/// Workgroups of `matmul_large` one wave of a GPU holds: the H200's 132 SMs × 2 (wgpu reports
/// no SM count; 264 128×128 tiles ran 40.8 TFLOP/s, 270 27.7).
const WAVE_TILES: usize = 264;
/// Fewest 128×128 tiles for which the large kernel beats 64×64 tiles (H200, GPT-2 shapes).
const LARGE_MIN_TILES: usize = 64;

/// Records `c = alpha·op(a)·op(b) + beta·c (+ bias)`. `bias` (N) is added when given; `dummy`
/// is any small buffer that stands in for it otherwise. The variant follows the adapter's tuning
/// and the shape (see [`pick`]).
pub fn matmul(k: &Kernels, c: &View, a: &View, b: &View, bias: Option<&View>, dummy: &View, g: Gemm) -> Result<()> {
    matmul_variant(k, for_operands(k, pick(k.tuning.matmul, &g), a, b), c, a, b, bias, dummy, g)
}

/// `variant`, or [`MatmulVariant::Coop`] where an operand is f16 (the other f16 or f32, which
/// the product then rounds to f16: the caller asked for f16 products) and the adapter runs
/// cooperative matrices. CPU adapters keep `Direct`; f32 × f32 products stay f32.
pub fn for_operands(k: &Kernels, variant: MatmulVariant, a: &View, b: &View) -> MatmulVariant {
    if k.tuning.coop_f16 && coop_operands(a, b) && variant != MatmulVariant::Direct {
        MatmulVariant::Coop
    } else {
        variant
    }
}

/// The variant for `g` under the adapter's choice `tuned`: `Large` (or `Narrow`) keeps products
/// too small to fill a GPU with 128×128 tiles on 64×64 ones, and turns to narrow tiles where
/// they fill whole waves better ([`narrow_fills_better`]).
pub fn pick(tuned: MatmulVariant, g: &Gemm) -> MatmulVariant {
    let tiles = g.m.div_ceil(LARGE_TILE) * g.n.div_ceil(LARGE_TILE) * g.batch;
    match tuned {
        MatmulVariant::Large | MatmulVariant::Narrow if tiles < LARGE_MIN_TILES => MatmulVariant::Tiled,
        MatmulVariant::Large if narrow_fills_better(g) => MatmulVariant::Narrow,
        v => v,
    }
}

/// Whether 128×96 tiles finish an unbatched product in clearly fewer tile-times than 128×128
/// ones, counting whole waves of [`WAVE_TILES`] and a narrow tile as 3/4 of a wide one: e.g.
/// N = 768, M = 8192: 384 wide tiles take 2 waves (the second half empty), 512 narrow ones 2
/// waves of 3/4 the time, NN and NT alike (H200, one binary: 8192×768×768 NN 31.0 narrow against
/// 28.7 wide, 8192×768×2304 NT 35.6 against 30.6 TFLOP/s; wide tiles for NN over a wave made
/// the GPT-2 step 239.2 ms against 238.2). (Batched products, split-K's among them, keep wide
/// tiles: not measured.)
pub fn narrow_fills_better(g: &Gemm) -> bool {
    let waves = |cols: usize| (g.m.div_ceil(LARGE_TILE) * g.n.div_ceil(cols)).div_ceil(WAVE_TILES);
    // in quarter tile-times; a narrow tile has more loads per product, so it must win by a fifth
    let (wide, narrow) = (4 * waves(LARGE_TILE), 3 * waves(NARROW_TILE));
    g.batch == 1 && 5 * narrow < 4 * wide
}

/// [`matmul`] with an explicit variant (tests check every variant on every adapter).
#[allow(clippy::too_many_arguments)]
pub fn matmul_variant(
    k: &Kernels,
    variant: MatmulVariant,
    c: &View,
    a: &View,
    b: &View,
    bias: Option<&View>,
    dummy: &View,
    g: Gemm,
) -> Result<()> {
    launch(k, variant, c, a, b, None, bias, dummy, g)
}

/// [`matmul`] with B in int8 (frozen weights), widened to f32 as the kernel reads it.
#[allow(clippy::too_many_arguments)]
pub fn matmul_q8(
    k: &Kernels,
    variant: MatmulVariant,
    c: &View,
    a: &View,
    qb: QuantB,
    bias: Option<&View>,
    dummy: &View,
    g: Gemm,
) -> Result<()> {
    launch(k, variant, c, a, dummy, Some(qb), bias, dummy, g)
}

#[allow(clippy::too_many_arguments)]
fn launch(
    k: &Kernels,
    variant: MatmulVariant,
    c: &View,
    a: &View,
    b: &View,
    qb: Option<QuantB>,
    bias: Option<&View>,
    dummy: &View,
    g: Gemm,
) -> Result<()> {
    // (matmul_direct: 16x16 threads of 8x8 outputs, as matmul_large)
    let (rows, cols) = match variant {
        MatmulVariant::Tiled => (TILE, TILE),
        MatmulVariant::Narrow => (LARGE_TILE, NARROW_TILE),
        _ => (LARGE_TILE, LARGE_TILE),
    };
    let tiles_n = g.n.div_ceil(cols);
    let tiles_m = g.m.div_ceil(rows);
    if tiles_n > MAX_GROUPS as usize || tiles_m > MAX_GROUPS as usize || g.batch > MAX_GROUPS as usize {
        return Err(Error::invalid(
            "matmul",
            format!("{g:?} needs more than {MAX_GROUPS} workgroups in one dimension"),
        ));
    }
    // stored rows: A (K,M) used transposed, or (M,K); B (N,K) or (K,N); padded where a_stride
    // and b_stride say
    let padded = |row: usize, stride: usize, which: &str| {
        if stride == 0 {
            return Ok(row);
        }
        if variant != MatmulVariant::Coop || stride < row {
            return Err(Error::invalid(
                "matmul",
                format!(
                    "{g:?}: padded {which} rows take cooperative matrices (not {variant:?}) and at least the row length"
                ),
            ));
        }
        Ok(stride)
    };
    let a_stride = padded(if g.trans_a { g.m } else { g.k }, g.a_stride, "A")?;
    let b_stride = padded(if g.trans_b { g.k } else { g.n }, g.b_stride, "B")?;
    let (a_rs, a_cs) = if g.trans_a { (1, a_stride) } else { (a_stride, 1) };
    let (b_rs, b_cs) = if g.trans_b { (1, b_stride) } else { (b_stride, 1) };
    let p = Params {
        m: g.m as u32,
        n: g.n as u32,
        k: g.k as u32,
        batch: g.batch as u32,
        stride_a: g.batch_strides.map_or(if g.trans_a { g.k } else { g.m } * a_stride, |s| s[0]) as u32,
        stride_b: g.batch_strides.map_or(if g.trans_b { g.n } else { g.k } * b_stride, |s| s[1]) as u32,
        stride_c: g.batch_strides.map_or(g.m * g.n, |s| s[2]) as u32,
        has_bias: bias.is_some() as u32,
        a_rs: a_rs as u32,
        a_cs: a_cs as u32,
        b_rs: b_rs as u32,
        b_cs: b_cs as u32,
        alpha: g.alpha,
        beta: g.beta,
        a_off: g.offsets[0] as u32,
        b_off: g.offsets[1] as u32,
        c_off: g.offsets[2] as u32,
        quant_b: qb.is_some() as u32,
        q_row_len: qb.map_or(1, |q| q.row_len.max(1)) as u32,
        _pad: 0,
    };
    let bias = bias.unwrap_or(dummy);
    let (bq, scales) = qb.map_or((dummy, dummy), |q| (q.q, q.scales));
    let groups = [tiles_n.max(1) as u32, tiles_m.max(1) as u32, g.batch.max(1) as u32];
    let entry = match variant {
        MatmulVariant::Tiled => "matmul",
        MatmulVariant::Direct => return launch_direct(k, [c, a, b, bias, bq, scales], &p, g, qb.is_some(), groups),
        MatmulVariant::Large => return launch_large(k, [c, a, b, bias, bq, scales], &p, g, groups, false),
        MatmulVariant::Narrow => return launch_large(k, [c, a, b, bias, bq, scales], &p, g, groups, true),
        MatmulVariant::Coop => return launch_coop(k, [c, a, b, bias, dummy], &p, g, groups),
    };
    let views = [c, a, b, bias, bq, scales];
    k.dispatch_detailed(MATMUL, entry, Variant::default(), &views, &p, groups, || shape(&g, 0))
}

/// `matmul_direct` (CPU adapters), its operand reads compiled in (see [`direct_flags`]); the
/// subgroup-shared reads of A (`matmul_direct_shared`) where the adapter's subgroups allow.
fn launch_direct(
    k: &Kernels,
    [c, a, b, bias, bq, scales]: [&View; 6],
    p: &Params,
    g: Gemm,
    quant_b: bool,
    groups: [u32; 3],
) -> Result<()> {
    let flags = direct_flags(&g, a, b, quant_b);
    // (the stand-in for an operand read by scalars: 16 bytes, the least a vec4 array binds)
    let unused = k.write_dummy();
    let (a4, b4) = (if flags & 4 != 0 { a } else { &unused }, if flags & 8 != 0 { b } else { &unused });
    let variant = Variant { flags, ..Default::default() };
    let views = [c, a, b, bias, bq, scales, a4, b4];
    let (shader, entry) = if flags & 4 != 0 && subgroups_share_rows(k) {
        (MATMUL_DIRECT_SUBGROUPS, "matmul_direct_shared")
    } else {
        (MATMUL_DIRECT, "matmul_direct")
    };
    k.dispatch_detailed(shader, entry, variant, &views, p, groups, || shape(&g, flags))
}

/// `matmul_large`, its layout, epilogue and tile width (`narrow`: 96 columns) compiled in (see
/// [`large_flags`]). An f32 operand whose stored rows are a multiple of 4 long and that starts
/// 4-aligned is read a vec4 at a time through a second binding of the same view (a 16-byte
/// stand-in is bound otherwise).
fn launch_large(
    k: &Kernels,
    [c, a, b, bias, bq, scales]: [&View; 6],
    p: &Params,
    g: Gemm,
    groups: [u32; 3],
    narrow: bool,
) -> Result<()> {
    let quant = p.quant_b != 0;
    // stored row length of each operand (its contiguous dimension)
    let a_row = if g.trans_a { g.m } else { g.k };
    let b_row = if g.trans_b { g.k } else { g.n };
    let vec_ok = |row: usize, off: usize, v: &View| {
        v.dtype == DType::F32
            && row.is_multiple_of(4)
            && off.is_multiple_of(4)
            && v.offset.is_multiple_of(16)
            && v.size >= 16
    };
    let allowed = |depth_fast: bool, depth_bit: u32, rows_bit: u32| {
        let bit = if depth_fast { depth_bit } else { rows_bit };
        (k.tuning.large_vec4 & bit) != 0
    };
    let vec_a = allowed(!g.trans_a, LargeVec4::A_DEPTH, LargeVec4::A_ROWS) && vec_ok(a_row, g.offsets[0], a);
    let vec_b = allowed(g.trans_b, LargeVec4::B_DEPTH, LargeVec4::B_ROWS) && !quant && vec_ok(b_row, g.offsets[1], b);
    let flags =
        large_flags(&g, p.has_bias != 0, quant) | (vec_a as u32) << 5 | (vec_b as u32) << 6 | (narrow as u32) << 7;
    let stand_in = k.write_dummy();
    let (a4, b4) = (if vec_a { a } else { &stand_in }, if vec_b { b } else { &stand_in });
    let variant = Variant { flags, ..Default::default() };
    let views = [c, a, b, bias, bq, scales, a4, b4];
    k.dispatch_detailed(MATMUL_LARGE, "matmul_large", variant, &views, p, groups, || shape(&g, flags))
}

/// How `PAGETRAIN_PROFILE=shapes` names a product: M×N×K, layout, batch and compiled flags.
pub(super) fn shape(g: &Gemm, flags: u32) -> String {
    let t = |trans| if trans { 't' } else { 'n' };
    format!("{}x{}x{} {}{} x{} flags {flags}", g.m, g.n, g.k, t(g.trans_a), t(g.trans_b), g.batch)
}

/// Whether `matmul_direct_shared` can run: subgroups of 8 or 16 lanes (each then lies within
/// one row of 16 threads and reaches the 8 lanes that read A).
fn subgroups_share_rows(k: &Kernels) -> bool {
    let gpu = k.gpu();
    let size_ok = |s: u32| s == 8 || s == 16;
    gpu.features.contains(wgpu::Features::SUBGROUP)
        && size_ok(gpu.info.subgroup_min_size)
        && size_ok(gpu.info.subgroup_max_size)
}

/// `matmul_direct`'s compile-time choices (FLAGS in its shader): 4 A and 8 B read as vec4 (f32
/// operands whose stored rows are a multiple of 4 long and start 4-aligned, in a 16-aligned
/// view), 1 A and 2 B transposed (only with their vec4 bit: scalar reads go by the strides),
/// 16 int8 B.
fn direct_flags(g: &Gemm, a: &View, b: &View, quant_b: bool) -> u32 {
    let vec_ok = |row: usize, off: usize, v: &View| {
        v.dtype == DType::F32
            && row.is_multiple_of(4)
            && off.is_multiple_of(4)
            && v.offset.is_multiple_of(16)
            && v.size >= 16
    };
    let vec_a = vec_ok(if g.trans_a { g.m } else { g.k }, g.offsets[0], a);
    let vec_b = !quant_b && vec_ok(if g.trans_b { g.k } else { g.n }, g.offsets[1], b);
    (vec_a && g.trans_a) as u32
        | ((vec_b && g.trans_b) as u32) << 1
        | (vec_a as u32) << 2
        | (vec_b as u32) << 3
        | (quant_b as u32) << 4
}

/// The layout and epilogue `matmul_large` and `matmul_coop` compile in (FLAGS in the shaders):
/// 1 A transposed, 2 B transposed, 4 bias, 8 beta != 0 (C is read); 16 int8 B for
/// `matmul_large` (16 and up are each kernel's own).
pub(super) fn large_flags(g: &Gemm, bias: bool, quant_b: bool) -> u32 {
    g.trans_a as u32
        | (g.trans_b as u32) << 1
        | (bias as u32) << 2
        | ((g.beta != 0.0) as u32) << 3
        | (quant_b as u32) << 4
}

/// Symmetric int8 quantization with one scale per row: row r of `w` (rows × cols) becomes
/// `q = round(w / s)` in [-127, 127] with `s = max|w_r| / 127`, packed four to a u32 (element
/// e in byte e % 4 of word e / 4). Returns (packed words, scales).
pub fn quantize_rows(w: &[f32], rows: usize, cols: usize) -> (Vec<u32>, Vec<f32>) {
    let mut words = vec![0u32; (rows * cols).div_ceil(4)];
    let mut scales = vec![0f32; rows];
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = if max > 0.0 { max / 127.0 } else { 1.0 };
        scales[r] = s;
        for (c, &v) in row.iter().enumerate() {
            let q = (v / s).round().clamp(-127.0, 127.0) as i8;
            let e = r * cols + c;
            words[e / 4] |= (q as u8 as u32) << ((e % 4) * 8);
        }
    }
    (words, scales)
}

/// The f32 values int8 weights stand for (what the kernel computes with).
pub fn dequantize_rows(words: &[u32], scales: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|e| ((words[e / 4] >> ((e % 4) * 8)) as u8 as i8) as f32 * scales[e / cols]).collect()
}
