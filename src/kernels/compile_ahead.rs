//! Pipelines compiled ahead of use, on worker threads. A fresh machine's first step waits for
//! every pipeline it needs, one after the other, when each is first dispatched (NVIDIA: 3.5 s of
//! a GPT-2 step's first 5 s, 0.13 s a pipeline). When a family's module is created for a
//! variant, its other entry points are compiled beside the main thread, since a step uses most
//! of a family's entries with the same variant (LayerNorm forward, backward, parameter
//! gradients). An entry the run never dispatches costs a worker's time, not the main thread's.
//!
//! Only on real GPUs (on a CPU adapter the workers would take the cores the step runs on), not on
//! GL (one context), not in the browser (no threads); `PAGETRAIN_COMPILE_AHEAD=0` turns it off.

use std::cell::RefCell;
use std::collections::HashMap;
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

/// Pipelines being compiled on workers, each answered once.
pub(super) struct CompileAhead {
    enabled: bool,
    pending: RefCell<HashMap<Key, mpsc::Receiver<Option<wgpu::ComputePipeline>>>>,
}

impl CompileAhead {
    pub(super) fn new(gpu: &Gpu) -> Self {
        // GL serialises everything on one context: workers would only queue behind it
        let real_gpu = !matches!(gpu.info.device_type, wgpu::DeviceType::Cpu) && gpu.info.backend != wgpu::Backend::Gl;
        let enabled = cfg!(not(target_arch = "wasm32"))
            && real_gpu
            && !std::env::var("PAGETRAIN_COMPILE_AHEAD").is_ok_and(|v| v == "0");
        CompileAhead { enabled, pending: RefCell::new(HashMap::new()) }
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
        if !self.enabled {
            return;
        }
        let mut pending = self.pending.borrow_mut();
        for (entry, layout) in siblings {
            if pending.contains_key(&(shader.name, entry, variant)) {
                continue;
            }
            let (device, module, cache) = (gpu.device.clone(), module.clone(), cache.cloned());
            let (tx, rx) = mpsc::channel();
            let spawned = std::thread::Builder::new().name(format!("compile {entry}")).spawn(move || {
                // An entry this variant cannot build (or a driver error) is dropped here, in
                // this thread's own error scope; the main thread compiles it again if a
                // dispatch needs it, and reports the error then.
                let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
                let pipeline = create(&device, &module, shader, entry, &layout, cache.as_ref());
                // native wgpu answers at once (as the pool's out-of-memory check relies on)
                let failed = !matches!(futures::FutureExt::now_or_never(scope.pop()), Some(None));
                let _ = tx.send((!failed).then_some(pipeline));
            });
            if spawned.is_ok() {
                pending.insert((shader.name, entry, variant), rx);
            }
        }
    }

    /// The pipeline a worker compiled for `key` (waiting for it), if one was started and worked.
    pub(super) fn take(&self, key: Key) -> Option<wgpu::ComputePipeline> {
        let rx = self.pending.borrow_mut().remove(&key)?;
        rx.recv().ok().flatten()
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
