//! Launcher for `shaders/matmul_coop.wgsl` (cooperative matrices: tensor cores from WGSL) and
//! the rules of what it takes: which operand types, which padded rows, which products it fetches
//! and stores without bounds tests. `matmul::matmul_variant` dispatches to it.

use super::matmul::{large_flags, shape, Gemm, Params};
use super::{Kernels, MatmulVariant, Variant, MATMUL_COOP};
use crate::error::{Error, Result};
use crate::pager::View;
use crate::tensor::DType;

/// `matmul_coop`'s square tile of C and the depth of its K slices (CT and CK in the shader).
pub const COOP_TILE: usize = 128;
const COOP_DEPTH: usize = 32;
/// Operands `matmul_coop` takes: f16 and f16, or f16 and f32.
pub(super) fn coop_operands(a: &View, b: &View) -> bool {
    coop_dtypes(a.dtype, b.dtype)
}

pub(super) fn coop_dtypes(a: DType, b: DType) -> bool {
    let float = |d: DType| matches!(d, DType::F16 | DType::F32);
    float(a) && float(b) && (a == DType::F16 || b == DType::F16)
}

/// Whether a product of A and B in these element types runs on cooperative matrices, which read
/// an operand's rows 8 halves at a time where they are padded to a multiple of 8
/// ([`Gemm::a_stride`], [`Gemm::b_stride`]): e.g. GPT-2's dlogits and the head's transposed
/// weight, whose 50257-long rows are otherwise read a half at a time (H200: 4096x768x50257 NN
/// 37.5 TFLOP/s against 79.8 at K = 50264; 50257x768x4096 TN 49.3 against 116.6).
pub fn coop_pads_rows(k: &Kernels, a: DType, b: DType) -> bool {
    k.tuning.coop_f16 && k.tuning.matmul != MatmulVariant::Direct && coop_dtypes(a, b)
}

/// `matmul_coop`: A or B f16, the other f16 or f32 (int8 B has no cooperative path). Operands whose stored
/// rows are a multiple of 8 elements long and start 8-aligned are read 16 bytes at a time, through
/// a second binding of the same view as raw words (`dummy` stands in for it otherwise); an f32 C
/// that whole tiles may store to directly is bound again too, and so is an f16 C stored 4 halves
/// at a time.
pub(super) fn launch_coop(
    k: &Kernels,
    [c, a, b, bias, dummy]: [&View; 5],
    p: &Params,
    g: Gemm,
    groups: [u32; 3],
) -> Result<()> {
    if !k.tuning.coop_f16 {
        return Err(Error::invalid("matmul", format!("{} has no cooperative matrices", k.gpu().describe())));
    }
    if !coop_operands(a, b) || p.quant_b != 0 {
        return Err(Error::invalid(
            "matmul",
            format!(
                "the cooperative-matrix kernel takes an f16 operand (and f16 or f32), not {:?} and {:?}",
                a.dtype, b.dtype
            ),
        ));
    }
    // stored row stride of each operand (its contiguous dimension, or its padded rows)
    let a_row = (if g.trans_a { p.a_cs } else { p.a_rs }) as usize;
    let b_row = (if g.trans_b { p.b_cs } else { p.b_rs }) as usize;
    let vec_ok = |row: usize, off: usize, v: &View| {
        row.is_multiple_of(8) && off.is_multiple_of(8) && v.offset.is_multiple_of(16) && v.size >= 16
    };
    // (batch entries start 8-aligned too: packed ones do where rows are)
    let (vec_a, vec_b) = (
        vec_ok(a_row, g.offsets[0], a) && p.stride_a.is_multiple_of(8),
        vec_ok(b_row, g.offsets[1], b) && p.stride_b.is_multiple_of(8),
    );
    // whole tiles of a plain f32 C (no bias, rows 4-aligned) store their accumulators directly
    let direct_c = c.dtype == DType::F32
        && p.has_bias == 0
        && g.n.is_multiple_of(4)
        && g.offsets[2].is_multiple_of(4)
        && c.offset.is_multiple_of(16);
    // an f16 C whose rows hold whole groups of 4 from an 8-byte boundary is stored 4 halves at a time
    let packed_c = c.dtype == DType::F16
        && g.n.is_multiple_of(4)
        && g.offsets[2].is_multiple_of(4)
        && c.offset.is_multiple_of(8)
        && c.size >= 8;
    // fetches and stores that need no bounds tests, each compiled without them
    let loads_inside = vec_a && vec_b && coop_loads_inside(&g, a, b);
    let tiles_whole = g.m.is_multiple_of(COOP_TILE) && g.n.is_multiple_of(COOP_TILE);
    let flags = large_flags(&g, p.has_bias != 0, false)
        | (vec_a as u32) << 4
        | (vec_b as u32) << 5
        | (direct_c as u32) << 6
        | (loads_inside as u32) << 7
        | (tiles_whole as u32) << 8
        | ((vec_a && a.dtype == DType::F16) as u32) << 9
        | ((vec_b && b.dtype == DType::F16) as u32) << 10
        | (packed_c as u32) << 11;
    // (a4 and b4 are read as raw 16-byte words, whatever the operand's type)
    let words = |v: &View| View { dtype: DType::U32, ..v.clone() };
    let (a4, b4) = (words(if vec_a { a } else { dummy }), words(if vec_b { b } else { dummy }));
    let write_dummy = k.write_dummy();
    let c32 = if direct_c { c } else { &write_dummy };
    let c16 = if packed_c { words(c) } else { write_dummy.clone() };
    let variant = Variant { flags, ..Default::default() };
    let views = [c, a, b, bias, &a4, &b4, c32, &c16];
    k.dispatch_detailed(MATMUL_COOP, "matmul_coop", variant, &views, p, groups, || shape(&g, flags))
}

/// Whether `matmul_coop`'s tiles and K slices cover `g` exactly (M and N multiples of 128, K of
/// 32): its fetches then test no bounds wherever the operands are packed.
pub fn coop_tiles_whole(g: &Gemm) -> bool {
    [g.m, g.n].iter().all(|d| d.is_multiple_of(COOP_TILE)) && g.k.is_multiple_of(COOP_DEPTH)
}

/// `len` rounded up to what `matmul_coop` fetches of it: rows padded to this (with zeros,
/// [`Gemm::a_stride`]) hold every chunk its tiles and K slices read, so it tests no bounds
/// where the other dimensions are covered too (GPT-2's 50257-long dlogits and head weight rows).
pub fn coop_padded_len(len: usize) -> usize {
    len.next_multiple_of(COOP_TILE)
}

/// Whether every chunk `matmul_coop`'s tiles fetch for `g` lies inside its operand's view, and
/// is zero wherever a K slice runs past K: then no fetch needs a bounds test. Past K that takes
/// rows padded to [`coop_padded_len`] (whose padding is zeros by [`Gemm::a_stride`]'s contract)
/// where depth is an operand's contiguous dimension, and K a multiple of the slice otherwise (the
/// rows after a matrix may hold anything). Rows or columns past M or N may hold anything in the
/// view: they only meet outputs that are never stored.
pub fn coop_loads_inside(g: &Gemm, a: &View, b: &View) -> bool {
    if g.m == 0 || g.n == 0 || g.k == 0 {
        return false;
    }
    let a_dims = (g.trans_a, g.m, g.a_stride, g.offsets[0], g.batch_strides.map(|s| s[0]));
    let b_dims = (!g.trans_b, g.n, g.b_stride, g.offsets[1], g.batch_strides.map(|s| s[1]));
    [(a, a_dims), (b, b_dims)].into_iter().all(|(view, (depth_rows, width, stride, offset, entry_stride))| {
        let (width_p, depth_p) = (width.next_multiple_of(COOP_TILE), g.k.next_multiple_of(COOP_DEPTH));
        // stored (rows, row length) as the tiles reach them, and the stored row's stride
        let (rows, row_len, contiguous) = if depth_rows { (depth_p, width_p, width) } else { (width_p, depth_p, g.k) };
        let stride = if stride == 0 { contiguous } else { stride };
        let matrix = entry_stride.unwrap_or(if depth_rows { g.k } else { width } * stride);
        let last_row_end = g.batch.saturating_sub(1) * matrix + (rows - 1) * stride + row_len;
        let elements = (view.size / view.dtype.size() as u64) as usize;
        (!depth_rows || g.k == depth_p) && row_len <= stride && offset + last_row_end <= elements
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cooperative_shader_tiles_as_the_launcher_counts() {
        let src = include_str!("../../shaders/matmul_coop.wgsl");
        for line in
            [format!("const CT: u32 = {}u;", super::COOP_TILE), format!("const CK: u32 = {}u;", super::COOP_DEPTH)]
        {
            assert!(src.contains(&line), "matmul_coop.wgsl lacks `{line}`");
        }
    }
}
