//! How much of the logits the head holds at once: its rows per chunk, and whether the forward's
//! logits are kept for backward; in which type they come.

use crate::context::Context;
use crate::kernels::matmul as mm;
use crate::tensor::DType;

/// Rows of logits a chunk should have for its products to run near full speed (see [`chunk_rows`]).
const TALL_ROWS: u64 = 1024;

/// Rows of logits computed at once: at most an eighth of the GPU budget (a quarter where an eighth
/// holds fewer than [`TALL_ROWS`], below) and one storage binding, and 1 GiB where backward makes
/// them again, split evenly. Chunks must be tall: backward's
/// dx[chunk] = dlogits · wte has only rows/128 × C/128 output tiles over a K of V, so short chunks
/// leave most of a GPU idle (GPT-2, 8 × 1024 rows: 64 MiB chunks of 333 rows gave 18 tiles, 1 GiB
/// gives two of 4096; on cooperative matrices dx now splits along K instead (`head_dx`), but
/// dwte still rewrites all of itself once a chunk). Kept logits are all held anyway, and logits
/// whose gradients are made in forward are held one chunk at a time, so those come in the
/// tallest chunks (H200, f16 dx: 8192×768×50264 NN 113.6 TFLOP/s against 85.2 at 4096 rows).
/// Short chunks cost: on an H100, GPT-2 small in f16 at a tenth of its footprint, the head's three
/// products took 20.4 ms a step in 17 chunks of 456 rows, 16.4 in 9 of 911, 11.4 resident in one;
/// at a quarter, chunks of a quarter of the budget saved 0.8 ms and doubled the bytes paged, so
/// eighths stay there. f16 logits (mixed precision, [`logits_dtype`]) come in the same rows, in
/// half the bytes: twice the rows (H100, GPT-2 small at a quarter: 4 chunks of 2048) paged 60 MB
/// more each way a step and stepped 2–4 ms slower.
///
/// Chunks hold whole tiles of rows where the budget allows ([`rows_per_chunk`]): at a tenth, 9
/// chunks of 911 rows left the products testing bounds and dwte's K unaligned, 20.0 ms a step
/// with stop 54's kernels; 9 of 896 and one of 128 take 12.5 (H100, f16; 11.5 at a quarter in 8
/// of 1024, 9.0 resident).
/// A chunk may round up to a whole tile where its logits, in their own type, still fit the
/// target: f16 logits at a tenth come in 8 chunks of 1024 rows, which stepped 99.5 / 101.6 ms
/// against 100.7 / 105.1 in 896 and paged 30–40 MB less each way.
pub(super) fn chunk_rows(ctx: &Context, rows: usize, v: usize, tallest: bool, logits: DType) -> usize {
    let (budget, row_bytes) = (ctx.pager.budget(), v as u64 * 4);
    let cap = if tallest { u64::MAX } else { 1 << 30 };
    let target = (budget / 8).max((budget / 4).min(TALL_ROWS * row_bytes)).min(cap).min(ctx.gpu.max_binding_bytes());
    let rows = rows.max(1);
    let most = |row_bytes: u64| ((target / row_bytes) as usize).clamp(1, rows);
    rows_per_chunk(rows, most(row_bytes), most((v * logits.size()) as u64))
}

/// Rows per chunk for `rows` in chunks of about `most` rows, at most `fits`: as even as whole
/// tiles (`mm::COOP_TILE`) let them be where a chunk holds one — rounded up to a tile where that
/// fits, else down — and plainly even otherwise.
fn rows_per_chunk(rows: usize, most: usize, fits: usize) -> usize {
    let even = rows.div_ceil(rows.div_ceil(most));
    if most < rows && most >= mm::COOP_TILE {
        let up = even.next_multiple_of(mm::COOP_TILE);
        if up <= fits {
            up
        } else {
            up.min(most / mm::COOP_TILE * mm::COOP_TILE)
        }
    } else {
        even
    }
}

/// Whether `lm_head_loss` keeps the forward's logits (`rows` × `v`, of [`logits_dtype`] for an
/// `x` of `x_dtype`) for backward instead of making them again there: where all of them fit in an
/// eighth of the GPU budget. GPT-2 small at 8 × 1024 rows keeps 1.6 GB in f32 on a large GPU and
/// saves backward two products of 316 GFLOP (H200, f32 at 41 TFLOP/s: 15 ms a step); a paged run
/// makes them again rather than page them.
pub fn head_keeps_logits(ctx: &Context, rows: usize, v: usize, x_dtype: DType) -> bool {
    rows as u64 * (v * logits_dtype(x_dtype).size()) as u64 <= ctx.pager.budget() / 8
}

/// The logits' element type for an `x` of `x_dtype`: f16 under mixed precision, as PyTorch's
/// autocast makes them (the loss kernels sum in f32), f32 otherwise. They are a step's largest
/// tensor (GPT-2 small, 8 × 1024 rows: 1.6 GB in f32), written by one product and read by two
/// kernels: in f16 those move half the bytes, and a paged step's chunks hold half the bytes.
pub fn logits_dtype(x_dtype: DType) -> DType {
    match x_dtype {
        DType::F16 => DType::F16,
        _ => DType::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::rows_per_chunk;

    #[test]
    fn chunks_hold_whole_tiles_where_one_fits() {
        // GPT-2 small, 8 × 1024 rows: a tenth's budget holds 922 rows of f32 logits (1844 of
        // f16), a quarter's 1153
        assert_eq!(rows_per_chunk(8192, 922, 922), 896);
        assert_eq!(rows_per_chunk(8192, 922, 1844), 1024);
        assert_eq!(rows_per_chunk(8192, 1153, 1153), 1024);
        assert_eq!(rows_per_chunk(8192, 8192, 8192), 8192);
        assert_eq!(rows_per_chunk(1000, 300, 300), 256);
        assert_eq!(rows_per_chunk(1000, 200, 200), 128);
        assert_eq!(rows_per_chunk(1000, 200, 255), 128);
        assert_eq!(rows_per_chunk(1000, 200, 256), 256);
        // under a tile: plainly even, as before
        assert_eq!(rows_per_chunk(20, 13, 26), 10);
        assert_eq!(rows_per_chunk(1000, 100, 200), 100);
        assert_eq!(rows_per_chunk(1, 1, 1), 1);
    }
}
