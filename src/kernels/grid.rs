//! Workgroup grids: how many workgroups a dispatch over elements or rows takes, folded into
//! 2-D past WebGPU's 65535 a dimension, and the per-thread element counts the shaders share.

/// Threads per workgroup for 1-D elementwise kernels (matches `WG` in the shaders).
pub const WG: u32 = 256;
/// Most workgroups in one dispatch dimension (WebGPU's guaranteed minimum).
pub const MAX_GROUPS: u32 = 65535;

/// Elements a thread of the memory-bound elementwise kernels takes (`PER_THREAD` in every
/// shader, from [`specialize`]; shaders/common.wgsl's `strided` says why).
pub const PER_THREAD: u64 = 8;

/// Elements a thread takes in the elementwise kernels that hold much per element (GELU's
/// backward, AdamW): fewer registers a thread leave room for more threads (H200, GPT-2 small's
/// f16 step: GELU backward 1.13 → 0.94 ms, AdamW 1.74 → 1.63 ms against 8; the others lose).
pub const PER_THREAD_FEW: u64 = 4;

/// Workgroup grid for `n` elements, [`PER_THREAD`] a thread (common.wgsl `strided`).
pub fn grid_strided(n: u64) -> [u32; 3] {
    grid_strided_by(n, PER_THREAD)
}

/// Workgroup grid for `n` elements, `per_thread` a thread (common.wgsl `strided_by`).
pub fn grid_strided_by(n: u64, per_thread: u64) -> [u32; 3] {
    grid_1d(n.div_ceil(per_thread))
}

/// Workgroup grid for `threads` threads of `WG` each, folded into 2-D past 65535 groups. Shaders
/// recover the flat index as `gid.x + gid.y * nwg.x * WG`, then guard against the tail.
pub fn grid_1d(threads: u64) -> [u32; 3] {
    let groups = threads.div_ceil(WG as u64).max(1);
    if groups <= MAX_GROUPS as u64 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(MAX_GROUPS as u64);
        [groups.div_ceil(y) as u32, y as u32, 1]
    }
}

/// One workgroup per row for `rows` rows, folded into 2-D; shaders take `row = wid.x + wid.y * nwg.x`.
pub fn grid_rows(rows: u64) -> [u32; 3] {
    let rows = rows.max(1);
    if rows <= MAX_GROUPS as u64 {
        [rows as u32, 1, 1]
    } else {
        let y = rows.div_ceil(MAX_GROUPS as u64);
        [rows.div_ceil(y) as u32, y as u32, 1]
    }
}

/// Rows up to this long are processed one thread per row (`*_rows` entries): no workgroup
/// barriers, which cost far more than they save on short rows (16× on lavapipe for C = 64).
pub const SHORT_ROW: usize = 128;

/// The entry and grid for a row kernel: `wide` (a workgroup per row) or `short` (a thread per row).
pub fn row_launch(rows: usize, len: usize, wide: &'static str, short: &'static str) -> (&'static str, [u32; 3]) {
    if len <= SHORT_ROW {
        (short, grid_1d(rows as u64))
    } else {
        (wide, grid_rows(rows as u64))
    }
}
