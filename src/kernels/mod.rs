//! The one place where kernels are created, cached and dispatched.
//!
//! Every WGSL family in `shaders/` is a [`Shader`]; its launcher in this folder turns buffer views
//! and a `Params` struct into a dispatch. Dispatches go into the [`Recorder`]'s pending encoder,
//! in order with the pager's copies, their uniforms packed into one arena per submission.
//! [`Tuning`] holds the per-adapter choices (which matmul, row kernels by length).

#[macro_use]
mod params;
pub mod activation;
pub mod attention;
pub mod bindings;
mod compile;
mod compile_ahead;
pub mod cross_entropy;
pub mod decode;
pub mod elementwise;
pub mod embedding;
pub mod fill;
pub mod layernorm;
pub mod matmul;
mod matmul_coop;
pub mod optim;
pub mod pipeline_cache;
mod profile;
pub mod reduce;
pub mod softmax;
pub mod sumsq;
pub mod transpose;
pub mod tuned;
mod tuning;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::pager::View;
use crate::recorder::Recorder;

/// One WGSL source file and its family name.
#[derive(Clone, Copy, Debug)]
pub struct Shader {
    pub name: &'static str,
    pub source: &'static str,
    /// The WGSL `struct Params` of the family's uniform, made from its Rust side (`gpu_params!`).
    pub params: &'static str,
    /// Every entry writes its workgroup memory before reading it, so the zero fill wgpu adds by
    /// default at the start of each workgroup is wasted work.
    pub writes_workgroup_first: bool,
    /// WGSL extensions the family always needs (`enable …;` lines), put in front of everything.
    pub enables: &'static str,
}

/// Helpers every family uses (`flat`, `block_sum`, `block_max`), prepended to each source.
pub const COMMON: &str = include_str!("../../shaders/common.wgsl");

macro_rules! shader {
    ($name:literal, $params:ty) => {
        shader!($name, $params, false, "")
    };
    // (after the enables: files every source of the family starts with, e.g. shared functions)
    ($name:literal, $params:ty, $writes_first:literal, $enables:literal $(, $prelude:literal)*) => {
        Shader {
            name: $name,
            source: concat!(
                include_str!("../../shaders/common.wgsl"),
                $(include_str!(concat!("../../shaders/", $prelude, ".wgsl")),)*
                include_str!(concat!("../../shaders/", $name, ".wgsl"))
            ),
            params: <$params>::WGSL,
            writes_workgroup_first: $writes_first,
            enables: $enables,
        }
    };
}

pub const ACTIVATION: Shader = shader!("activation", activation::Params);
pub const ATTENTION: Shader = shader!("attention", attention::Params, false, "", "attention_layout");
pub const ATTENTION_BLOCKED: Shader = shader!("attention_blocked", attention::Params, true, "", "attention_layout");
pub const ATTENTION_BLOCKED_BACKWARD: Shader =
    shader!("attention_blocked_backward", attention::Params, true, "", "attention_layout");
/// Attention's forward on cooperative matrices (f16 qkv, head size 64), where the adapter has them.
pub const ATTENTION_COOP: Shader = shader!(
    "attention_coop",
    attention::Params,
    true,
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    "attention_layout"
);
/// Attention's backward on cooperative matrices, where [`ATTENTION_COOP`] runs.
pub const ATTENTION_COOP_BACKWARD: Shader = shader!(
    "attention_coop_backward",
    attention::Params,
    true,
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    "attention_layout"
);
pub const ATTENTION_LANES: Shader = shader!("attention_lanes", attention::Params, false, "", "attention_layout");
pub const CROSS_ENTROPY: Shader = shader!("cross_entropy", cross_entropy::Params);
pub const DECODE: Shader = shader!("decode", decode::Params);
pub const ELEMENTWISE: Shader = shader!("elementwise", elementwise::Params);
pub const EMBEDDING: Shader = shader!("embedding", embedding::Params);
pub const FILL: Shader = shader!("fill", fill::Params);
pub const LAYERNORM: Shader = shader!("layernorm", layernorm::Params);
pub const MATMUL: Shader = shader!("matmul", matmul::Params, true, "");
/// Matmul for CPU adapters: no workgroup memory, vec4 operand reads (see the shader's header).
pub const MATMUL_DIRECT: Shader = shader!("matmul_direct", matmul::Params, false, "");
/// `matmul_direct` with A's reads shared by a subgroup (its entry `matmul_direct_shared`), for
/// adapters with 8- or 16-lane subgroups: the same source with the subgroup entry appended.
pub const MATMUL_DIRECT_SUBGROUPS: Shader = Shader {
    name: "matmul_direct_subgroups",
    source: concat!(
        include_str!("../../shaders/common.wgsl"),
        include_str!("../../shaders/matmul_direct.wgsl"),
        include_str!("../../shaders/matmul_direct_subgroups.wgsl")
    ),
    params: matmul::Params::WGSL,
    writes_workgroup_first: false,
    enables: "",
};
pub const MATMUL_LARGE: Shader = shader!("matmul_large", matmul::Params, true, "");
/// Tensor-core matmul for f16 operands; compiled only where the adapter has cooperative matrices
/// (`enable` lines go first: `common.wgsl` comes before the family's own source).
pub const MATMUL_COOP: Shader =
    shader!("matmul_coop", matmul::Params, true, "enable f16;\nenable wgpu_cooperative_matrix;\n");
pub const OPTIM: Shader = shader!("optim", optim::Params);
pub const REDUCE: Shader = shader!("reduce", reduce::Params);
pub const SOFTMAX: Shader = shader!("softmax", softmax::Params);
pub const SUMSQ: Shader = shader!("sumsq", sumsq::Params);
pub const TRANSPOSE: Shader = shader!("transpose", transpose::Params, true, "");

/// How one compiled variant of a family differs from another. Kernels that can read or write f16
/// declare those bindings as `array<B0>` … `array<B7>` and convert on load and store; the prelude
/// [`specialize`] puts in front of the source makes `Bi` f16 where bit i of `f16_bindings` is set
/// and f32 elsewhere. `dim` and `tile` are sizes a family unrolls for (attention's head size and
/// the rows of its streamed tiles), as `DIM` and `TILE_ROWS`; `flags` are choices fixed at compile
/// time (matmul's layout and epilogue), as `FLAGS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    pub f16_bindings: u32,
    pub dim: u32,
    pub tile: u32,
    pub flags: u32,
}

/// Bindings a kernel may declare through the `Bi` aliases.
pub const TYPED_BINDINGS: u32 = 8;

/// The WGSL source of `shader` compiled as `variant`.
pub fn specialize(shader: Shader, variant: Variant) -> String {
    let mut src = String::from(shader.enables);
    if variant.f16_bindings != 0 && !shader.enables.contains("enable f16;") {
        src.push_str("enable f16;\n");
    }
    for i in 0..TYPED_BINDINGS {
        let ty = if variant.f16_bindings & (1 << i) != 0 { "f16" } else { "f32" };
        src.push_str(&format!("alias B{i} = {ty};\n"));
    }
    src.push_str(&format!("const DIM: u32 = {}u;\n", variant.dim.max(1)));
    src.push_str(&format!("const TILE_ROWS: u32 = {}u;\n", variant.tile.max(1)));
    src.push_str(&format!("const FLAGS: u32 = {}u;\n", variant.flags));
    src.push_str(&format!("const PER_THREAD: u32 = {PER_THREAD}u;\n"));
    src.push_str(&format!("const PER_THREAD_FEW: u32 = {PER_THREAD_FEW}u;\n"));
    src.push_str(shader.params);
    src.push_str(shader.source);
    src
}

/// Every shader family, for validation and warm-up.
pub const ALL: &[Shader] = &[
    ACTIVATION,
    ATTENTION,
    ATTENTION_BLOCKED,
    ATTENTION_BLOCKED_BACKWARD,
    ATTENTION_COOP,
    ATTENTION_COOP_BACKWARD,
    ATTENTION_LANES,
    CROSS_ENTROPY,
    DECODE,
    ELEMENTWISE,
    EMBEDDING,
    FILL,
    LAYERNORM,
    MATMUL,
    MATMUL_COOP,
    MATMUL_DIRECT,
    MATMUL_DIRECT_SUBGROUPS,
    MATMUL_LARGE,
    OPTIM,
    REDUCE,
    SOFTMAX,
    SUMSQ,
    TRANSPOSE,
];

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

pub use compile::Creation;
pub use tuning::{
    HeadKernels, LargeVec4, MatmulVariant, Tuning, COOP_STORAGE_BINDINGS, COOP_WORKGROUP_BYTES, LARGE_STORAGE_BINDINGS,
    LARGE_WORKGROUP_BYTES, TUNED_HEAD_SIZES,
};

/// A compiled pipeline and its layout.
type Compiled = (Rc<compile_ahead::PipelineSlot>, bindings::Layout);

/// Pipelines (compiled once, with or without shader runtime checks), per-adapter tuning, and
/// dispatch recording.
pub struct Kernels {
    gpu: Rc<Gpu>,
    recorder: Rc<Recorder>,
    /// Each module with the binding signature of its entry points.
    modules: RefCell<HashMap<(&'static str, Variant), (wgpu::ShaderModule, Rc<HashMap<String, bindings::Signature>>)>>,
    /// Each pipeline with its layout.
    pipelines: RefCell<HashMap<(&'static str, &'static str, Variant), Compiled>>,
    pub tuning: Tuning,
    /// The file `pagetrain tune` kept that `tuning` came from (`None`: the built-in choices).
    tuned_from: Option<std::path::PathBuf>,
    dispatch_count: std::cell::Cell<u64>,
    /// `PAGETRAIN_PROFILE=1`: GPU time per entry, from timestamps in the pass where the device has them.
    profile: Option<profile::Profile>,
    /// Driver pipelines kept on disk between runs, and whether new ones were compiled since.
    pipeline_cache: Option<pipeline_cache::DiskPipelineCache>,
    compiled: std::cell::Cell<bool>,
    compile_ahead: compile_ahead::CompileAhead,
    /// Shader modules and pipelines created so far and the seconds that took (start-up cost).
    creation: std::cell::Cell<Creation>,
    /// A small f32 buffer that stands in for an unused read-write binding (the context's dummy
    /// is bound read-only beside it, and a buffer may not be both in one dispatch).
    write_dummy: RefCell<Option<View>>,
    bindings: bindings::Bindings,
}

impl Drop for Kernels {
    fn drop(&mut self) {
        self.save_pipeline_cache();
    }
}

impl Kernels {
    pub fn new(recorder: Rc<Recorder>) -> Self {
        let gpu = recorder.gpu().clone();
        let pipeline_cache = pipeline_cache::DiskPipelineCache::open(&gpu);
        recorder.set_clearer(Rc::new(fill::Filler::new(&gpu.device, &gpu.limits)));
        let (tuning, tuned_from) = tuned::Tuned::apply_saved(
            &gpu,
            Tuning {
                coop_f16: Tuning::coop_f16_on(&gpu),
                attention_lanes: Tuning::attention_lanes_on(&gpu),
                ..Tuning::for_adapter(&gpu.info, &gpu.limits)
            },
        );
        let profile = std::env::var("PAGETRAIN_PROFILE")
            .ok()
            .filter(|v| v != "0")
            .map(|v| profile::Profile::new(&gpu, v == "shapes"));
        Kernels {
            compile_ahead: compile_ahead::CompileAhead::new(&gpu),
            pipeline_cache,
            tuning,
            tuned_from,
            gpu,
            recorder: recorder.clone(),
            modules: RefCell::new(HashMap::new()),
            pipelines: RefCell::new(HashMap::new()),
            dispatch_count: std::cell::Cell::new(0),
            profile,
            compiled: std::cell::Cell::new(false),
            creation: Default::default(),
            write_dummy: RefCell::new(None),
            bindings: bindings::Bindings::new(recorder.clone()),
        }
    }

    /// Where the kernel choices came from: `built-in`, or the file `pagetrain tune` kept.
    pub fn choices_from(&self) -> String {
        self.tuned_from.as_ref().map_or("built-in".into(), |p| format!("tuned ({})", p.display()))
    }

    /// A 16-byte f32 storage buffer for unused read-write bindings, or read-only ones that must
    /// hold at least a vec4 (see `write_dummy`).
    pub fn write_dummy(&self) -> View {
        self.write_dummy
            .borrow_mut()
            .get_or_insert_with(|| View {
                buffer: self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("unused read-write binding"),
                    size: 16,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                }),
                offset: 0,
                size: 16,
                dtype: crate::tensor::DType::F32,
            })
            .clone()
    }

    /// Writes the on-disk pipeline cache if pipelines were compiled since it was last written
    /// (also done when the kernels are dropped).
    pub fn save_pipeline_cache(&self) {
        if let Some(cache) = &self.pipeline_cache {
            if self.compiled.replace(false) {
                cache.save();
            }
        }
    }

    pub fn gpu(&self) -> &Rc<Gpu> {
        &self.gpu
    }

    pub fn recorder(&self) -> &Rc<Recorder> {
        &self.recorder
    }

    /// Shader modules and pipelines created so far, and the seconds spent creating them.
    pub fn creation(&self) -> Creation {
        Creation { pipeline_wait_s: self.compile_ahead.waited().get(), ..self.creation.get() }
    }

    /// Total dispatches recorded so far (for benchmarks).
    pub fn dispatch_count(&self) -> u64 {
        self.dispatch_count.get()
    }

    /// Bind groups created so far (a warm training step creates none).
    pub fn bind_groups_created(&self) -> u64 {
        self.bindings.created()
    }

    /// Records one dispatch of `entry`: `buffers` bind to 0..n in order, `params` to binding n.
    /// The variant follows the views' element types.
    pub fn dispatch<P: bytemuck::Pod>(
        &self,
        shader: Shader,
        entry: &'static str,
        buffers: &[&View],
        params: &P,
        groups: [u32; 3],
    ) -> Result<()> {
        self.dispatch_unrolled(shader, entry, (0, 0), buffers, params, groups)
    }

    /// [`Kernels::dispatch`] of a family compiled for sizes `(dim, tile)` (see [`Variant`]).
    pub fn dispatch_unrolled<P: bytemuck::Pod>(
        &self,
        shader: Shader,
        entry: &'static str,
        (dim, tile): (u32, u32),
        buffers: &[&View],
        params: &P,
        groups: [u32; 3],
    ) -> Result<()> {
        self.dispatch_variant(shader, entry, Variant { dim, tile, ..Default::default() }, buffers, params, groups)
    }

    /// [`Kernels::dispatch`] of a family compiled as `variant` (its `f16_bindings` are taken from
    /// the views' element types).
    pub fn dispatch_variant<P: bytemuck::Pod>(
        &self,
        shader: Shader,
        entry: &'static str,
        variant: Variant,
        buffers: &[&View],
        params: &P,
        groups: [u32; 3],
    ) -> Result<()> {
        self.dispatch_detailed(shader, entry, variant, buffers, params, groups, String::new)
    }

    /// [`Kernels::dispatch_variant`], profiled under `PAGETRAIN_PROFILE=shapes` as
    /// `entry detail()` (the products' shapes) instead of its entry alone.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dispatch_detailed<P: bytemuck::Pod>(
        &self,
        shader: Shader,
        entry: &'static str,
        variant: Variant,
        buffers: &[&View],
        params: &P,
        groups: [u32; 3],
        detail: impl FnOnce() -> String,
    ) -> Result<()> {
        let f16_bindings = buffers
            .iter()
            .enumerate()
            .filter(|(_, v)| v.dtype == crate::tensor::DType::F16)
            .fold(0, |bits, (i, _)| bits | 1 << i);
        let (pipeline, layout) = self.pipeline_and_layout(shader, entry, Variant { f16_bindings, ..variant })?;
        if layout.sig_len != buffers.len() {
            return Err(Error::invalid(
                entry,
                format!("binds {} storage buffers, the kernel declares {}", buffers.len(), layout.sig_len),
            ));
        }
        let label = self.profile.as_ref().map(|p| {
            p.label(entry, || match detail() {
                d if d.is_empty() => entry.to_string(),
                d => format!("{entry} {d}"),
            })
        });
        let stamps = self.profile.as_ref().and_then(|p| p.stamps(&self.recorder, label.unwrap_or(entry)));
        let bind_group = self.bindings.group(&layout, buffers);
        let wait_for_pipeline = !pipeline.is_ready();
        self.recorder.dispatch_with_uniforms(bytemuck::bytes_of(params), wait_for_pipeline, move |pass, offset| {
            if let Some((queries, at)) = &stamps {
                pass.write_timestamp(queries, *at);
            }
            // a pipeline that failed to build records nothing; its error is the device's
            if let Some(pipeline) = pipeline.get() {
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &bind_group, &[offset]);
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
            }
            if let Some((queries, at)) = &stamps {
                pass.write_timestamp(queries, *at + 1);
            }
        });
        self.dispatch_count.set(self.dispatch_count.get() + 1);
        match &self.profile {
            Some(profile) if !profile.stamped() => {
                self.recorder.flush();
                let start = std::time::Instant::now();
                self.gpu.wait_idle()?;
                profile.add_waited(label.unwrap_or(entry), start.elapsed().as_secs_f64());
            }
            _ => self.recorder.maybe_submit(),
        }
        Ok(())
    }

    /// Compiles new pipelines on worker threads (on by default on real GPUs, off on CPU
    /// adapters, which need their cores for the step; ignored on GL and in the browser).
    pub fn compile_on_workers(&self, on: bool) {
        self.compile_ahead.set_enabled(on && self.gpu.info.backend != wgpu::Backend::Gl);
    }

    /// Per-entry (dispatches, seconds of GPU time) when `PAGETRAIN_PROFILE=1`, slowest first
    /// (see `profile` for how they are timed).
    pub fn profile(&self) -> Vec<(&'static str, u64, f64)> {
        self.profile.as_ref().map(|p| p.totals(&self.recorder)).unwrap_or_default()
    }

    /// How the profile times dispatches: "timestamps", "waits" (each dispatch waited for), or
    /// `None` when not profiling; and how many dispatches' timestamps were lost.
    pub fn profile_method(&self) -> Option<(&'static str, u64)> {
        self.profile.as_ref().map(|p| (if p.stamped() { "timestamps" } else { "waits" }, p.lost()))
    }

    /// Submits everything recorded so far.
    pub fn flush(&self) {
        self.recorder.flush();
    }

    /// Copies `bytes` bytes of any buffer view back to the host through a temporary buffer
    /// (flushes pending work first). For tests and debugging; tensors are read through the pager.
    pub async fn read_view(&self, view: &View, bytes: u64) -> Result<Vec<u8>> {
        let size = bytes.div_ceil(4) * 4;
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read_view"),
            size: size.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.recorder.record(|enc| enc.copy_buffer_to_buffer(&view.buffer, view.offset, &staging, 0, size));
        self.recorder.flush();
        let (tx, rx) = futures::channel::oneshot::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.gpu.wait_idle()?;
        rx.await
            .map_err(|_| Error::Gpu { context: "readback".into(), msg: "map callback dropped".into() })?
            .map_err(|e| Error::Gpu { context: "readback".into(), msg: e.to_string() })?;
        let data = {
            let mapped = staging
                .get_mapped_range(..)
                .map_err(|e| Error::Gpu { context: "readback".into(), msg: e.to_string() })?;
            mapped[..bytes as usize].to_vec()
        };
        staging.unmap();
        Ok(data)
    }
}
