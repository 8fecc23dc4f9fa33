//! Launchers for fused causal self-attention that never stores the (T,T) scores, compiled per
//! head size: `shaders/attention_blocked.wgsl` and `attention_blocked_backward.wgsl` (blocks of
//! rows, 2-D register tiles; head sizes up to 64), `shaders/attention.wgsl` (a thread per row)
//! and `attention_lanes.wgsl` (the per-row backward with a few subgroup lanes per row), and
//! `attention_coop.wgsl` and `attention_coop_backward.wgsl` (tensor cores, f16 qkv of head size
//! 64). Every backward takes any forward's `out` and `lse` (the same quantities); [`pick`] chooses
//! per pass, and [`forward`] and [`backward`] take the cooperative kernels wherever they run.

use super::{
    Kernels, Variant, ATTENTION, ATTENTION_BLOCKED, ATTENTION_BLOCKED_BACKWARD, ATTENTION_COOP,
    ATTENTION_COOP_BACKWARD, ATTENTION_LANES, MAX_GROUPS,
};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::pager::View;
use crate::tensor::DType;

/// Query (or key) rows per workgroup (`ROWS` in the shader).
const ROWS: usize = 64;
/// Largest head size: q, the accumulators and the streamed tiles must fit registers and 16 KiB.
pub const MAX_HEAD_DIM: usize = 256;

/// The head size of the cooperative-matrix kernels.
pub const COOP_HEAD_DIM: usize = 64;
/// Query (or key) rows of their workgroups (`ROWS` in their shaders).
const COOP_ROWS: usize = 64;
/// Workgroup memory the cooperative kernels declare, at most: three tiles of 64 rows of 64 + 8
/// halves (two operands and the f16 probabilities), 64 rows of 64 + 4 f32 products, and the
/// backward's 2 · 64 f32 row statistics.
pub const COOP_WORKGROUP_BYTES: u64 = 3 * 64 * 72 * 2 + 64 * 68 * 4 + 2 * 64 * 4;

/// Largest head size of the blocked kernels (their per-thread accumulators grow with it).
pub const BLOCKED_MAX_HEAD_DIM: usize = 64;
/// Rows of the blocked kernels' streamed tiles, largest first (a multiple of 4; the forward's
/// query blocks are twice as tall).
pub const BLOCKED_TILES: [u32; 2] = [32, 16];
/// The one tile (block) size of the blocked backward (`CB` in `attention_blocked_backward.wgsl`).
pub const BLOCKED_BACKWARD_TILE: u32 = 32;

/// Which kernels run attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// A thread per query (key) row (`attention.wgsl`), any head size up to [`MAX_HEAD_DIM`].
    Rows,
    /// Blocks of rows, tiles of `tile` rows streamed through workgroup memory
    /// (`attention_blocked.wgsl`, and `attention_blocked_backward.wgsl` at `tile`
    /// [`BLOCKED_BACKWARD_TILE`] only), head sizes up to [`BLOCKED_MAX_HEAD_DIM`].
    Blocked { tile: u32 },
    /// Backward only: [`Kernel::Rows`] with `lanes` (2, 4 or 8) threads of a subgroup per row, each
    /// holding a slice of the head dimension (`attention_lanes.wgsl`), where [`lanes_supported`].
    Lanes { lanes: u32 },
    /// Tensor cores (`attention_coop.wgsl`, `attention_coop_backward.wgsl`) for f16 qkv of head
    /// size [`COOP_HEAD_DIM`], where [`coop_supported`].
    Coop,
}

/// Whether `k` runs [`Kernel::Coop`]: the adapter's f16 products run on cooperative matrices
/// (`super::Tuning::coop_f16`, which also asks for 32-lane subgroups) and its workgroup memory
/// holds [`COOP_WORKGROUP_BYTES`].
pub fn coop_supported(k: &Kernels) -> bool {
    k.tuning.coop_f16 && k.gpu().limits.max_compute_workgroup_storage_size as u64 >= COOP_WORKGROUP_BYTES
}

/// Whether `gpu` runs [`Kernel::Lanes`] with `lanes` threads a row: 2, 4 or 8, subgroups of at
/// least that many lanes (not on OpenGL, whose subgroups wgpu does not offer).
pub fn lanes_supported(gpu: &Gpu, lanes: u32) -> bool {
    matches!(lanes, 2 | 4 | 8)
        && gpu.features.contains(wgpu::Features::SUBGROUP)
        && gpu.info.subgroup_min_size >= lanes
        && gpu.info.backend != wgpu::Backend::Gl
}

/// Workgroup memory the blocked kernels declare for head size `d` and `tile` rows: `sm` (four
/// regions of 2·tile or tile rows of d+4 padded floats, and 2·tile probability rows of tile+4)
/// and `stat` (2·tile·tile/4 floats). Mirrors the constants in `attention_blocked.wgsl` (and in
/// `attention_blocked_backward.wgsl`, whose one tile lays out the same bytes).
pub fn blocked_workgroup_bytes(d: usize, tile: u32) -> u64 {
    let (cb, cb4, dp4) = (tile as u64, tile as u64 / 4, (d as u64).div_ceil(4));
    16 * (4 * cb * (dp4 + 1) + 2 * cb * (cb4 + 1)) + 4 * 2 * cb * cb4
}

/// The kernel for head size `d` on this adapter, for the forward (`backward` false) or the
/// backward: blocked with the largest tile whose workgroup memory fits where the tuning puts that
/// pass on blocked kernels ([`super::Tuning::attention_for`]: `attention_blocked`, or what
/// `pagetrain tune` measured at `d`) and `d` <= 64, else rows (the backward on
/// [`Kernel::Lanes`] where the tuning's lanes are over 1); the forward's tile is the tuned one
/// where it fits. The backward has one tile, [`BLOCKED_BACKWARD_TILE`].
pub fn pick(k: &Kernels, d: usize, backward: bool) -> Kernel {
    let chosen = k.tuning.attention_for(d);
    let (lanes, blocked) = (chosen.lanes, if backward { chosen.blocked.1 } else { chosen.blocked.0 });
    if !blocked || d > BLOCKED_MAX_HEAD_DIM {
        return if backward && lanes > 1 { Kernel::Lanes { lanes } } else { Kernel::Rows };
    }
    match blocked_tile(k, d, backward, chosen.forward_tile) {
        Some(tile) => Kernel::Blocked { tile },
        None => Kernel::Rows,
    }
}

/// The blocked kernels' tile at head size `d`: the forward's `preferred` one where it fits, else
/// the largest that fits (the backward has one, [`BLOCKED_BACKWARD_TILE`]); `None` where none
/// fits the adapter's workgroup memory or `d` is past [`BLOCKED_MAX_HEAD_DIM`].
pub fn blocked_tile(k: &Kernels, d: usize, backward: bool, preferred: Option<u32>) -> Option<u32> {
    let limit = k.gpu().limits.max_compute_workgroup_storage_size as u64;
    let tiles: &[u32] = if backward { &[BLOCKED_BACKWARD_TILE] } else { &BLOCKED_TILES };
    let preferred = preferred.filter(|_| !backward);
    let fits = |&t: &u32| d <= BLOCKED_MAX_HEAD_DIM && blocked_workgroup_bytes(d, t) <= limit;
    preferred.into_iter().chain(tiles.iter().copied()).find(fits)
}

/// Shape of one attention call: qkv (B,T,3·H·D), out (B,T,H·D), lse and delta (B,H,T).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
    /// Multiplies the scores (1/sqrt(D) in GPT-2).
    pub scale: f32,
}

gpu_params! {
    /// The uniform of every attention family (their shared functions: `shaders/attention_layout.wgsl`).
    pub(super) struct Params {
        b: u32,
        t: u32,
        h: u32,
        scale: f32,
    }
}

impl Dims {
    fn params(&self) -> Result<Params> {
        if self.d == 0 || self.d > MAX_HEAD_DIM || self.t == 0 || self.b * self.h == 0 {
            return Err(Error::invalid(
                "attention",
                format!("{self:?}: needs T, B·H > 0 and head size 1..={MAX_HEAD_DIM}"),
            ));
        }
        Ok(Params { b: self.b as u32, t: self.t as u32, h: self.h as u32, scale: self.scale })
    }

    /// Blocks of `rows` rows in x, the B·H heads folded into y and z.
    fn grid(&self, rows: usize) -> [u32; 3] {
        let bh = self.b * self.h;
        let z = bh.div_ceil(MAX_GROUPS as usize);
        [self.t.div_ceil(rows) as u32, bh.div_ceil(z) as u32, z as u32]
    }

    /// Whether `kernel` takes this head size and fits the adapter's workgroup memory.
    fn check(&self, k: &Kernels, kernel: Kernel) -> Result<()> {
        let tile = match kernel {
            Kernel::Rows => return Ok(()),
            Kernel::Coop if coop_supported(k) && self.d == COOP_HEAD_DIM => return Ok(()),
            Kernel::Coop => {
                return Err(Error::invalid(
                    "attention",
                    format!(
                        "{kernel:?} for head size {}: needs head size {COOP_HEAD_DIM} and cooperative matrices ({})",
                        self.d,
                        k.gpu().describe()
                    ),
                ))
            }
            Kernel::Lanes { lanes } if lanes_supported(k.gpu(), lanes) => return Ok(()),
            Kernel::Lanes { .. } => {
                return Err(Error::invalid(
                    "attention",
                    format!("{kernel:?}: needs 2, 4 or 8 lanes and subgroups that wide ({})", k.gpu().describe()),
                ))
            }
            Kernel::Blocked { tile } => tile,
        };
        let limit = k.gpu().limits.max_compute_workgroup_storage_size as u64;
        let bytes = blocked_workgroup_bytes(self.d, tile);
        if self.d > BLOCKED_MAX_HEAD_DIM || !BLOCKED_TILES.contains(&tile) || bytes > limit {
            return Err(Error::invalid(
                "attention",
                format!("{kernel:?} for head size {}: needs head size <= {BLOCKED_MAX_HEAD_DIM}, a tile of {BLOCKED_TILES:?} and {bytes} bytes of workgroup memory (adapter: {limit})", self.d),
            ));
        }
        Ok(())
    }
}

/// out (B,T,C) = causal softmax(scale·q·kᵀ)·v per head, and lse (B,H,T) for backward: on tensor
/// cores for f16 qkv of head size 64 where the adapter has them, else on [`pick`]'s kernel.
pub fn forward(k: &Kernels, out: &View, lse: &View, qkv: &View, dims: Dims) -> Result<()> {
    forward_with(k, kernel_for(k, qkv.dtype, dims.d, false), out, lse, qkv, dims)
}

/// The kernel [`forward`] (`backward` false) or [`backward`] runs on qkv of `dtype` and head size
/// `d`: [`Kernel::Coop`] for f16 at head size [`COOP_HEAD_DIM`] where [`coop_supported`] (unless
/// the tuning says no), else [`pick`]'s.
pub fn kernel_for(k: &Kernels, dtype: DType, d: usize, backward: bool) -> Kernel {
    let coop = k.tuning.attention_coop && coop_supported(k) && d == COOP_HEAD_DIM && dtype == DType::F16;
    if coop {
        Kernel::Coop
    } else {
        pick(k, d, backward)
    }
}

/// [`forward`] on an explicit kernel (tests check each one).
pub fn forward_with(k: &Kernels, kernel: Kernel, out: &View, lse: &View, qkv: &View, dims: Dims) -> Result<()> {
    let p = dims.params()?;
    dims.check(k, kernel)?;
    let d = dims.d as u32;
    match kernel {
        Kernel::Lanes { .. } => {
            Err(Error::invalid("attention", format!("{kernel:?} is a backward kernel: forward with Kernel::Rows")))
        }
        Kernel::Rows => {
            let sizes = (d, k.tuning.attention_tile_rows(dims.d));
            k.dispatch_unrolled(ATTENTION, "attention_forward", sizes, &[out, lse, qkv], &p, dims.grid(ROWS))
        }
        Kernel::Blocked { tile } => {
            let grid = dims.grid(2 * tile as usize);
            k.dispatch_unrolled(ATTENTION_BLOCKED, "blocked_forward", (d, tile), &[out, lse, qkv], &p, grid)
        }
        Kernel::Coop if qkv.dtype != DType::F16 => {
            Err(Error::invalid("attention", format!("{kernel:?} reads f16 qkv, not {:?}", qkv.dtype)))
        }
        Kernel::Coop => {
            let variant = Variant { dim: d, ..Default::default() };
            k.dispatch_variant(ATTENTION_COOP, "coop_forward", variant, &[out, lse, qkv], &p, dims.grid(COOP_ROWS))
        }
    }
}

/// dqkv (B,T,3C) += the gradient through attention, given the saved `out` and `lse` and the
/// output gradient `dout`; `delta` (B,H,T) is scratch the two passes share. Where `accumulate`
/// is false dqkv is overwritten instead, and not read (a new gradient needs no zero fill): only
/// where [`overwrites`] says the kernel can.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dqkv: &View,
    delta: &View,
    qkv: &View,
    out: &View,
    dout: &View,
    lse: &View,
    dims: Dims,
    accumulate: bool,
) -> Result<()> {
    backward_with(k, kernel_for(k, qkv.dtype, dims.d, true), dqkv, delta, qkv, out, dout, lse, dims, accumulate)
}

/// Whether [`backward`] can overwrite dqkv for these operands: where it takes the coop kernels,
/// which write each element of dqkv once (the others add to it from several workgroups).
pub fn overwrites(k: &Kernels, qkv: DType, d: usize) -> bool {
    kernel_for(k, qkv, d, true) == Kernel::Coop
}

/// [`backward`] on an explicit kernel (tests check each one).
#[allow(clippy::too_many_arguments)]
pub fn backward_with(
    k: &Kernels,
    kernel: Kernel,
    dqkv: &View,
    delta: &View,
    qkv: &View,
    out: &View,
    dout: &View,
    lse: &View,
    dims: Dims,
    accumulate: bool,
) -> Result<()> {
    if !accumulate && kernel != Kernel::Coop {
        return Err(Error::invalid("attention backward", format!("{kernel:?} adds to dqkv: it cannot overwrite it")));
    }
    let p = dims.params()?;
    dims.check(k, kernel)?;
    if let Kernel::Blocked { tile } = kernel {
        if tile != BLOCKED_BACKWARD_TILE {
            return Err(Error::invalid(
                "attention backward",
                format!("{kernel:?}: the blocked backward runs tiles of {BLOCKED_BACKWARD_TILE} rows only"),
            ));
        }
    }
    let d = dims.d as u32;
    let (shader, names, variant, rows) = match kernel {
        Kernel::Coop if qkv.dtype != DType::F16 => {
            return Err(Error::invalid("attention backward", format!("{kernel:?} reads f16 qkv, not {:?}", qkv.dtype)));
        }
        // FLAGS & 1: overwrite dqkv
        Kernel::Coop => (
            ATTENTION_COOP_BACKWARD,
            ["coop_backward_q", "coop_backward_kv"],
            Variant { dim: d, flags: !accumulate as u32, ..Default::default() },
            COOP_ROWS,
        ),
        // its tile rows are whole vec4s: rows for a head size rounded up to 4 fit the same memory
        Kernel::Rows => {
            let tile = k.tuning.attention_tile_rows(dims.d.next_multiple_of(4));
            (
                ATTENTION,
                ["attention_backward_q", "attention_backward_kv"],
                Variant { dim: d, tile, ..Default::default() },
                ROWS,
            )
        }
        // the same with rows of whole vec4s for each lane; FLAGS holds log2 of the lanes
        Kernel::Lanes { lanes } => {
            let tile = k.tuning.attention_tile_rows(dims.d.next_multiple_of(4 * lanes as usize));
            let variant = Variant { dim: d, tile, flags: lanes.trailing_zeros(), ..Default::default() };
            (ATTENTION_LANES, ["lanes_backward_q", "lanes_backward_kv"], variant, ROWS)
        }
        Kernel::Blocked { tile } => {
            let variant = Variant { dim: d, tile, ..Default::default() };
            (ATTENTION_BLOCKED_BACKWARD, ["blocked_backward_q", "blocked_backward_kv"], variant, tile as usize)
        }
    };
    // backward_kv reads the delta backward_q writes
    k.dispatch_variant(shader, names[0], variant, &[dqkv, delta, qkv, dout, lse, out], &p, dims.grid(rows))?;
    k.dispatch_variant(shader, names[1], variant, &[dqkv, delta, qkv, dout, lse], &p, dims.grid(rows))
}
