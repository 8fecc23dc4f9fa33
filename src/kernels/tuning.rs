//! Per-adapter kernel choices ([`Tuning`]): which matmul, attention's tiles and kernels, tensor
//! cores, made once from the adapter's type, backend, limits and features (environment
//! variables override them, for measuring).

use super::attention;
use crate::device::Gpu;

/// Per-adapter kernel choices, made once when the kernels are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    pub matmul: MatmulVariant,
    /// Most rows of the tiles fused attention streams through workgroup memory. Its loops over a
    /// tile are unrolled, which OpenGL drivers compile slowly (llvmpipe: 69 s at 32 rows for head
    /// size 64, 2.7 s at 8), so GL gets short tiles.
    pub attention_tile: u32,
    /// Which passes of attention run the blocked kernels where the head size allows
    /// (`attention::pick`): the forward (H200, GPT-2 small: 31.8 against 48.8 ms a step), not the
    /// backward (blocked q + kv 45.4 + 41.0 against per row 18.8 + 35.3 ms a step in f32, 54.6 +
    /// 50.5 against 18.4 + 35.0 in f16: the per-row kernels stay), nothing on OpenGL (the
    /// per-row kernels' short tiles keep its compiles short). `PAGETRAIN_ATTENTION=rows|blocked`
    /// puts both passes on one kind.
    pub attention_blocked: (bool, bool),
    /// Rows of the blocked forward's tiles (`None`: the largest whose workgroup memory fits).
    /// 16 on CPU adapters (lavapipe, `small` preset's head size 32: 97 → 78 ms a step against 32
    /// rows; a tie at head size 64), the largest elsewhere.
    pub attention_forward_tile: Option<u32>,
    /// Attention on f16 qkv of head size 64 runs on cooperative matrices where the adapter has
    /// them (`attention::coop_supported`; H200, GPT-2 small f16: 47.9 → 20.2 ms a step).
    /// `PAGETRAIN_ATTENTION=rows|blocked` says no.
    pub attention_coop: bool,
    /// Products with an f16 operand (the other f16 or f32) run on cooperative matrices
    /// (`matmul_coop`): the device has them in 16×16×16 f16 → f32, 32-lane subgroups and the
    /// workgroup memory the kernel takes.
    pub coop_f16: bool,
    /// Threads per row of the per-row attention backward where it runs (`attention::pick`): over
    /// 1, `attention_lanes.wgsl` splits the head dimension between that many lanes of a subgroup.
    /// 2 on GPUs with subgroups (H200, GPT-2 small, f32: q + kv 16.1 + 15.7 ms a step, against
    /// 25.9 + 19.8 at 4, 42.6 + 22.2 at 8 and 16.7 + 33.4 at 1), not on CPU adapters, where the
    /// shuffles only add work, nor OpenGL; else 1. `PAGETRAIN_ATTENTION_LANES=1|2|4|8` chooses.
    pub attention_lanes: u32,
    /// Which operand reads `matmul_large` makes a vec4 at a time where the layout allows
    /// ([`LargeVec4`] bits): all (H200 4096³ NN / NT / TN 41.2 / 40.2 / 47.2 TFLOP/s against 39.7
    /// / 37.4 / 41.8 reading elements; GPT-2 small's f32 step 259.2 against 264.9 ms).
    /// `PAGETRAIN_MATMUL_VEC4=<bits>` overrides it, for measuring.
    pub large_vec4: u32,
    /// Attention's kernels per head size: built-in ones where a size ranks the kernels
    /// differently ([`Tuning::builtin_heads`]), replaced by what `pagetrain tune` measured
    /// (`super::tuned`). For those sizes they replace `attention_blocked`, `attention_forward_tile`
    /// and `attention_lanes`.
    pub attention_tuned: [Option<HeadKernels>; TUNED_HEAD_SIZES],
}

/// Head sizes a tuned file may hold attention choices for.
pub const TUNED_HEAD_SIZES: usize = 4;

/// Attention's kernels for one head size: built in ([`Tuning::builtin_heads`]) or as `pagetrain
/// tune` measured them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadKernels {
    pub head_size: u32,
    /// Forward, backward on the blocked kernels.
    pub blocked: (bool, bool),
    /// Rows of the blocked forward's tiles (`None`: the largest that fits).
    pub forward_tile: Option<u32>,
    /// Lanes a row of the per-row backward (1: the plain per-row kernels).
    pub lanes: u32,
}

/// Bits of [`Tuning::large_vec4`]: an operand read by vec4 along its depth (A not transposed,
/// B transposed) or along its rows (A transposed, B not transposed).
pub struct LargeVec4;

impl LargeVec4 {
    pub const A_DEPTH: u32 = 1;
    pub const A_ROWS: u32 = 2;
    pub const B_DEPTH: u32 = 4;
    pub const B_ROWS: u32 = 8;
    pub const ALL: u32 = 15;
}

/// Workgroup memory `matmul_large` declares (two double-buffered 8-deep slices of 33 vec4 rows).
pub const LARGE_WORKGROUP_BYTES: u32 = 2 * 2 * 8 * 33 * 16;
/// Storage buffers `matmul_large` binds (c, a, b, bias, bq, bscale, and a, b again as vec4).
pub const LARGE_STORAGE_BINDINGS: u32 = 8;
/// Storage buffers `matmul_coop` binds (c, a, b, bias, a4, b4, c32, c16).
pub const COOP_STORAGE_BINDINGS: u32 = 8;
/// Workgroup memory `matmul_coop` declares: two operands, one buffer each of 128 × (32 + 8) halves,
/// and a 16×16 f32 scratch for each of its 4 subgroups.
pub const COOP_WORKGROUP_BYTES: u32 = 2 * 128 * 40 * 2 + 4 * 256 * 4;

/// Which matmul entry point runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulVariant {
    /// 64×64 workgroup-memory tiles, layout by runtime strides (GPUs: small products, int8 B).
    Tiled,
    /// No workgroup memory (CPU adapters, where barriers are expensive).
    Direct,
    /// 128×128 tiles, 8×8 outputs a thread, double-buffered, one pipeline per layout and epilogue
    /// (GPUs: products with enough such tiles to fill the device).
    Large,
    /// `matmul_large` with 128×96 tiles, 8×6 outputs a thread: products whose 128×128 tiles
    /// would leave the GPU's last wave half empty (see `matmul::pick`).
    Narrow,
    /// Cooperative matrices (tensor cores), 128×128 tiles, for products with an f16 operand where
    /// the adapter has them ([`Tuning::coop_f16`]).
    Coop,
}

impl Tuning {
    /// Attention's kernels at head size `d`: the choice for `d` in `attention_tuned` where there
    /// is one, else `attention_blocked`, `attention_forward_tile` and `attention_lanes`.
    pub fn attention_for(&self, d: usize) -> HeadKernels {
        let default = HeadKernels {
            head_size: d as u32,
            blocked: self.attention_blocked,
            forward_tile: self.attention_forward_tile,
            lanes: self.attention_lanes,
        };
        *self.attention_tuned.iter().flatten().find(|h| h.head_size as usize == d).unwrap_or(&default)
    }

    /// Rows of attention's streamed tiles for head size `d`: two tiles of `rows × d` f32 fill at
    /// most 16 KiB of workgroup memory (WebGPU's default limit).
    pub fn attention_tile_rows(&self, d: usize) -> u32 {
        self.attention_tile.min((2048 / d.max(1)).max(1) as u32)
    }

    /// Direct matmul on CPU adapters; on GPUs large tiles where a product has enough of them
    /// (and the adapter the workgroup memory and bindings), 64×64 tiles elsewhere.
    /// `PAGETRAIN_MATMUL=tiled|direct|large|narrow` forces one variant.
    pub fn for_adapter(info: &wgpu::AdapterInfo, limits: &wgpu::Limits) -> Tuning {
        let matmul = match std::env::var("PAGETRAIN_MATMUL").as_deref() {
            Ok("tiled") => MatmulVariant::Tiled,
            Ok("direct") => MatmulVariant::Direct,
            Ok("large") => MatmulVariant::Large,
            Ok("narrow") => MatmulVariant::Narrow,
            _ if info.device_type == wgpu::DeviceType::Cpu => MatmulVariant::Direct,
            _ if !Tuning::large_fits(limits) => MatmulVariant::Tiled,
            _ => MatmulVariant::Large,
        };
        let attention_tile = if info.backend == wgpu::Backend::Gl { 8 } else { 32 };
        let attention_blocked = match std::env::var("PAGETRAIN_ATTENTION").as_deref() {
            Ok("rows") => (false, false),
            Ok("blocked") => (true, true),
            _ if info.backend == wgpu::Backend::Gl => (false, false),
            _ => (true, false),
        };
        let attention_coop = !matches!(std::env::var("PAGETRAIN_ATTENTION").as_deref(), Ok("rows" | "blocked"));
        let large_vec4 =
            std::env::var("PAGETRAIN_MATMUL_VEC4").ok().and_then(|v| v.parse().ok()).unwrap_or(LargeVec4::ALL);
        Tuning {
            matmul,
            attention_tile,
            attention_blocked,
            attention_forward_tile: (info.device_type == wgpu::DeviceType::Cpu).then_some(16),
            attention_coop,
            coop_f16: false,
            attention_lanes: 1,
            large_vec4,
            attention_tuned: [None; TUNED_HEAD_SIZES],
        }
    }

    /// Whether `matmul_large` fits the adapter's limits (its workgroup memory and bindings).
    pub fn large_fits(limits: &wgpu::Limits) -> bool {
        limits.max_compute_workgroup_storage_size >= LARGE_WORKGROUP_BYTES
            && limits.max_storage_buffers_per_shader_stage >= LARGE_STORAGE_BINDINGS
    }

    /// Attention's built-in choices by head size for `gpu` (see [`Tuning::attention_tuned`]): on
    /// CPU adapters with subgroups, 2 lanes a row for the backward at head size 64 (lavapipe, a
    /// 4-layer model 256 wide in 4 heads, 16 × 128 tokens: 600–604 → 650–652 tokens/s), where at
    /// 32 they lose (the `small` preset's backward: 214–220 → 243–252 ms a step). None where an
    /// environment variable chooses attention's kernels.
    pub fn builtin_heads(gpu: &Gpu) -> [Option<HeadKernels>; TUNED_HEAD_SIZES] {
        let mut heads = [None; TUNED_HEAD_SIZES];
        let chosen_by_env =
            ["PAGETRAIN_ATTENTION", "PAGETRAIN_ATTENTION_LANES"].iter().any(|v| std::env::var_os(v).is_some());
        if gpu.info.device_type == wgpu::DeviceType::Cpu && !chosen_by_env && attention::lanes_supported(gpu, 2) {
            heads[0] = Some(HeadKernels { head_size: 64, blocked: (true, false), forward_tile: Some(16), lanes: 2 });
        }
        heads
    }

    /// [`Tuning::attention_lanes`] for `gpu`.
    pub fn attention_lanes_on(gpu: &Gpu) -> u32 {
        let chosen = std::env::var("PAGETRAIN_ATTENTION_LANES").ok().and_then(|v| v.parse().ok());
        let default = if gpu.info.device_type == wgpu::DeviceType::Cpu { 1 } else { 2 };
        let lanes = chosen.unwrap_or(default);
        if lanes > 1 && attention::lanes_supported(gpu, lanes) {
            lanes
        } else {
            1
        }
    }

    /// Whether `matmul_coop` can run on `gpu` (see [`Tuning::coop_f16`]); `PAGETRAIN_COOP=0` says no.
    pub fn coop_f16_on(gpu: &Gpu) -> bool {
        // (subgroup barriers order each subgroup's scratch in the coop kernels)
        let wanted = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP_BARRIER;
        let f16_to_f32 = gpu.adapter.cooperative_matrix_properties().iter().any(|c| {
            (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                && c.ab_type == wgpu::CooperativeScalarType::F16
                && c.cr_type == wgpu::CooperativeScalarType::F32
        });
        std::env::var("PAGETRAIN_COOP").map_or(true, |v| v != "0")
            && gpu.features.contains(wanted)
            && f16_to_f32
            && gpu.info.subgroup_min_size == 32
            && gpu.info.subgroup_max_size == 32
            && gpu.limits.max_compute_workgroup_storage_size >= COOP_WORKGROUP_BYTES
            && gpu.limits.max_storage_buffers_per_shader_stage >= COOP_STORAGE_BINDINGS
    }
}
