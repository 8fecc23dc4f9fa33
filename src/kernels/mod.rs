//! The one place where kernels are created, cached and dispatched.
//!
//! Every WGSL family in `shaders/` is a [`Shader`] (`shaders.rs`, the catalogue); its launcher in
//! this folder turns buffer views and a `Params` struct into a dispatch over a grid (`grid.rs`).
//! Dispatches go into the [`Recorder`]'s pending encoder, in order with the pager's copies, their
//! uniforms packed into one arena per submission. [`Tuning`] holds the per-adapter choices (which
//! matmul, attention's kernels), `tuned.rs` the ones `pagetrain tune` measured.

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
mod grid;
pub mod layernorm;
pub mod matmul;
mod matmul_coop;
mod matmul_split;
pub mod optim;
pub mod pipeline_cache;
mod profile;
pub mod reduce;
mod shaders;
pub mod softmax;
pub mod sumsq;
pub mod timeline;
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

pub use compile::Creation;
pub use grid::{
    grid_1d, grid_rows, grid_strided, grid_strided_by, row_launch, MAX_GROUPS, PER_THREAD, PER_THREAD_FEW, SHORT_ROW,
    WG,
};
pub use shaders::*;
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
    /// Inside [`Kernels::without_dispatches`]: dispatches are left out.
    leaving_out: std::cell::Cell<bool>,
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
                attention_tuned: Tuning::builtin_heads(&gpu),
                ..Tuning::for_adapter(&gpu.info, &gpu.limits)
            },
        );
        let profile = std::env::var("PAGETRAIN_PROFILE")
            .ok()
            .filter(|v| v != "0")
            .map(|v| profile::Profile::new(&gpu, v == "shapes", v == "timeline"));
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
            leaving_out: std::cell::Cell::new(false),
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

    /// `f()` with every kernel dispatch it asks for left out (not recorded, not counted): ops in
    /// it make their outputs' tensors and record their backward, computing nothing
    /// (`autograd::Replay::unread`). The pager's zero fills (the recorder's clearer) still run.
    pub fn without_dispatches<T>(&self, f: impl FnOnce() -> T) -> T {
        let outer = self.leaving_out.replace(true);
        let out = f();
        self.leaving_out.set(outer);
        out
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
        if self.leaving_out.get() {
            return Ok(());
        }
        let f16_bindings = binding_bits(buffers.iter().map(|v| v.dtype == crate::tensor::DType::F16));
        let mut variant = Variant { f16_bindings, ..variant };
        if self.recorder.tensors_share_buffers() {
            variant.writable = self.inputs_on_outputs(shader, entry, variant, buffers)?;
        }
        let (pipeline, layout) = self.pipeline_and_layout(shader, entry, variant)?;
        if layout.sig_len != buffers.len() {
            return Err(Error::invalid(
                entry,
                format!("binds {} storage buffers, the kernel declares {}", buffers.len(), layout.sig_len),
            ));
        }
        // (read-write pipelines named apart: they lose NVIDIA's read-only loads)
        let label = self.profile.as_ref().map(|p| {
            p.label(entry, || {
                let rw = read_write_label(variant.writable);
                match detail() {
                    d if d.is_empty() => format!("{entry}{rw}"),
                    d => format!("{entry} {d}{rw}"),
                }
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
                self.gpu.wait(None)?;
                profile.add_waited(label.unwrap_or(entry), start.elapsed().as_secs_f64());
            }
            _ => self.recorder.maybe_submit(),
        }
        Ok(())
    }

    /// The read-only inputs of `entry` bound to a buffer that an output is bound to too (tensors
    /// in one slab of the GPU pool), as bits of their binding numbers. wgpu refuses that unless
    /// the input is declared read-write too, and read-write bindings cost NVIDIA's compiler its
    /// read-only loads and some unrolling (f32 GPT-2 small resident, every binding read-write: 220
    /// → 584 ms a step on an H200), so only those bindings of such dispatches go read-write
    /// ([`Variant::writable`]).
    fn inputs_on_outputs(&self, shader: Shader, entry: &str, variant: Variant, buffers: &[&View]) -> Result<u32> {
        let (_, signatures) = self.module(shader, variant)?;
        // An unknown entry point is `pipeline_and_layout`'s error to report.
        let Some(read_only) = signatures.get(entry) else { return Ok(0) };
        let bound = || buffers.iter().zip(read_only.iter());
        let is_output = |buffer: &wgpu::Buffer| bound().any(|(v, &ro)| !ro && v.buffer == *buffer);
        Ok(binding_bits(bound().map(|(v, &ro)| ro && is_output(&v.buffer))))
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

    /// Starts the per-entry totals of `PAGETRAIN_PROFILE` again from here.
    pub fn profile_restart(&self) {
        if let Some(p) = &self.profile {
            p.restart(&self.recorder);
        }
    }

    /// Marks the start of a training step for `PAGETRAIN_PROFILE=timeline`.
    pub fn profile_step(&self) {
        if let Some(p) = &self.profile {
            p.mark_step();
        }
    }

    /// The marked steps as the GPU ran them, under `PAGETRAIN_PROFILE=timeline` (else empty).
    pub fn profile_timeline(&self) -> Vec<timeline::StepTimeline> {
        self.profile.as_ref().map(|p| p.steps(&self.recorder)).unwrap_or_default()
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
        self.gpu.wait(None)?;
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

/// Bit i set where binding i is marked: the form of [`Variant`]'s per-binding choices.
fn binding_bits(marks: impl Iterator<Item = bool>) -> u32 {
    marks.enumerate().filter(|&(_, marked)| marked).fold(0, |bits, (i, _)| bits | 1 << i)
}

/// A profile label's mark for the bindings a dispatch declared read-write: ` rw` and their
/// numbers (` rw1,4`), nothing where it declared none.
fn read_write_label(bindings: u32) -> String {
    if bindings == 0 {
        return String::new();
    }
    let numbers: Vec<String> = (0..32).filter(|i| bindings & (1 << i) != 0).map(|i| i.to_string()).collect();
    format!(" rw{}", numbers.join(","))
}
