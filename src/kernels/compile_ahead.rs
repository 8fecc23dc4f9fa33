//! Pipelines compiled ahead of use, on worker threads. A fresh machine's first step waits for
//! every pipeline it needs, one after the other, when each is first dispatched (NVIDIA: 3.5 s of
//! a GPT-2 step's first 5 s, 0.13 s a pipeline). When a family's first pipeline of a variant is
//! asked for, its other entry points are compiled beside the main thread, since a step uses most
//! of a family's entries with the same variant (LayerNorm forward, backward, parameter
//! gradients). An entry the run never dispatches costs a worker's time, not the main thread's.
//!
//! A pipeline a dispatch needs that is not compiled yet is compiled on a worker too, and the
//! dispatch waits in the recorder (`Recorder::dispatch_deferred`) until its pass ends: the new
//! pipelines of a pass compile in parallel (a fresh f16 GPT-2 step needs about thirty).
//!
//! Only on real GPUs (on a CPU adapter the workers would take the cores the step runs on), not on
//! GL (one context), not in the browser (no threads); `PAGETRAIN_COMPILE_AHEAD=0` turns it off.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::mpsc;

use super::{Shader, Variant};
use crate::device::Gpu;

/// How one pipeline is created, on the main thread or a worker.
pub(super) fn create(
    device: &wgpu::Device,
    module: &wgpu::ShaderModule,
    shader: Shader,
    entry: &str,
    layout: &wgpu::PipelineLayout,
    cache: Option<&wgpu::PipelineCache>,
) -> wgpu::ComputePipeline {
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: Some(layout),
        module,
        entry_point: Some(entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            zero_initialize_workgroup_memory: !shader.writes_workgroup_first,
            ..Default::default()
        },
        cache,
    })
}

/// The names of the `@compute` entry points in a WGSL source.
pub(super) fn entry_points(source: &str) -> Vec<&str> {
    source
        .split("@compute")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split_once("fn ")?.1;
            let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
            Some(&name[..end])
        })
        .collect()
}

type Key = (&'static str, &'static str, Variant);
type Answer = mpsc::Receiver<Option<wgpu::ComputePipeline>>;

/// Compiles `entry` on a worker thread; the answer is `None` where it failed (in the worker's
/// own error scope: the main thread compiles it again and reports the error then).
fn spawn(
    device: &wgpu::Device,
    module: &wgpu::ShaderModule,
    shader: Shader,
    entry: &'static str,
    layout: &wgpu::PipelineLayout,
    cache: Option<&wgpu::PipelineCache>,
) -> Option<Answer> {
    let (device, module, layout, cache) = (device.clone(), module.clone(), layout.clone(), cache.cloned());
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("compile {entry}"))
        .spawn(move || {
            let _ = tx.send(create_scoped(&device, &module, shader, entry, &layout, cache.as_ref()).ok());
        })
        .ok()?;
    Some(rx)
}

/// [`create`] in an error scope of its own: the validation error, if any.
fn create_scoped(
    device: &wgpu::Device,
    module: &wgpu::ShaderModule,
    shader: Shader,
    entry: &str,
    layout: &wgpu::PipelineLayout,
    cache: Option<&wgpu::PipelineCache>,
) -> std::result::Result<wgpu::ComputePipeline, String> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let pipeline = create(device, module, shader, entry, layout, cache);
    // native wgpu answers at once (as the pool's out-of-memory check relies on)
    match futures::FutureExt::now_or_never(scope.pop()) {
        Some(None) => Ok(pipeline),
        Some(Some(e)) => Err(e.to_string()),
        None => Err(format!("{entry}: the error scope did not answer")),
    }
}

/// A compute pipeline, or one still compiling on a worker.
pub(super) struct PipelineSlot {
    pipeline: OnceCell<Option<wgpu::ComputePipeline>>,
    /// Waits for the worker (and compiles here where it failed); run once.
    finish: Cell<Option<Box<dyn FnOnce() -> Option<wgpu::ComputePipeline>>>>,
}

impl PipelineSlot {
    pub(super) fn ready(pipeline: wgpu::ComputePipeline) -> Rc<Self> {
        Rc::new(PipelineSlot { pipeline: OnceCell::from(Some(pipeline)), finish: Cell::new(None) })
    }

    /// The slot for `answer`; where the worker failed, `entry` is compiled again on this thread
    /// and its error left with the device (`Gpu::check` reports it).
    pub(super) fn compiling(
        answer: Answer,
        gpu: Rc<Gpu>,
        module: wgpu::ShaderModule,
        shader: Shader,
        entry: &'static str,
        layout: wgpu::PipelineLayout,
        cache: Option<wgpu::PipelineCache>,
        waited: Rc<Cell<f64>>,
    ) -> Rc<Self> {
        let finish = move || {
            let clock = crate::clock::Stopwatch::start();
            let answer = answer.recv().ok().flatten();
            waited.set(waited.get() + clock.seconds());
            answer.or_else(|| match create_scoped(&gpu.device, &module, shader, entry, &layout, cache.as_ref()) {
                Ok(pipeline) => Some(pipeline),
                Err(msg) => {
                    gpu.report_error(format!("compiling {}::{entry}: {msg}", shader.name));
                    None
                }
            })
        };
        Rc::new(PipelineSlot { pipeline: OnceCell::new(), finish: Cell::new(Some(Box::new(finish))) })
    }

    /// Whether the pipeline is here without waiting.
    pub(super) fn is_ready(&self) -> bool {
        self.pipeline.get().is_some()
    }

    /// The pipeline (waiting for its worker), or `None` where it could not be built.
    pub(super) fn get(&self) -> Option<&wgpu::ComputePipeline> {
        self.pipeline.get_or_init(|| self.finish.take().and_then(|finish| finish())).as_ref()
    }
}

/// Pipelines being compiled on workers, each answered once.
pub(super) struct CompileAhead {
    enabled: Cell<bool>,
    pending: RefCell<HashMap<Key, Answer>>,
    /// Seconds the main thread waited for workers' pipelines.
    waited: Rc<Cell<f64>>,
}

impl CompileAhead {
    pub(super) fn new(gpu: &Gpu) -> Self {
        // GL serialises everything on one context: workers would only queue behind it
        let real_gpu = !matches!(gpu.info.device_type, wgpu::DeviceType::Cpu) && gpu.info.backend != wgpu::Backend::Gl;
        let enabled = cfg!(not(target_arch = "wasm32"))
            && real_gpu
            && !std::env::var("PAGETRAIN_COMPILE_AHEAD").is_ok_and(|v| v == "0");
        CompileAhead { enabled: Cell::new(enabled), pending: RefCell::new(HashMap::new()), waited: Rc::default() }
    }

    /// Turns compiling on workers on or off (tests use it on CPU adapters; not on GL or wasm).
    pub(super) fn set_enabled(&self, on: bool) {
        self.enabled.set(on && cfg!(not(target_arch = "wasm32")));
    }

    /// Seconds the main thread has waited for workers' pipelines (shared with their slots).
    pub(super) fn waited(&self) -> Rc<Cell<f64>> {
        self.waited.clone()
    }

    /// Whether pipelines are compiled on workers.
    pub(super) fn enabled(&self) -> bool {
        self.enabled.get()
    }

    /// Starts compiling `siblings` (entries of `shader` and their layouts) as `variant` on
    /// worker threads.
    pub(super) fn siblings(
        &self,
        gpu: &Gpu,
        module: &wgpu::ShaderModule,
        shader: Shader,
        siblings: Vec<(&'static str, wgpu::PipelineLayout)>,
        variant: Variant,
        cache: Option<&wgpu::PipelineCache>,
    ) {
        if !self.enabled() {
            return;
        }
        let mut pending = self.pending.borrow_mut();
        for (entry, layout) in siblings {
            let key = (shader.name, entry, variant);
            if pending.contains_key(&key) {
                continue;
            }
            if let Some(answer) = spawn(&gpu.device, module, shader, entry, &layout, cache) {
                pending.insert(key, answer);
            }
        }
    }

    /// The worker compiling `key`: the one [`CompileAhead::siblings`] started, or a new one.
    pub(super) fn take_or_spawn(
        &self,
        key: Key,
        device: &wgpu::Device,
        module: &wgpu::ShaderModule,
        shader: Shader,
        layout: &wgpu::PipelineLayout,
        cache: Option<&wgpu::PipelineCache>,
    ) -> Option<Answer> {
        if !self.enabled() {
            return None;
        }
        let started = self.pending.borrow_mut().remove(&key);
        started.or_else(|| spawn(device, module, shader, key.1, layout, cache))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_points_are_the_compute_functions() {
        let src = "fn helper() {}\n@compute @workgroup_size(256)\nfn first(@builtin(x) g: u32) {}\n\
                   @compute @workgroup_size(64, 1)\nfn second_one() {}\nfn other() {}";
        assert_eq!(super::entry_points(src), ["first", "second_one"]);
    }
}
