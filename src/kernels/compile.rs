//! Shader modules and pipelines, each created once per variant and kept: the module from the
//! specialised WGSL (naga parses and validates it; `bindings::reflect` reads each entry's
//! bindings), the pipeline from the driver or its on-disk cache, with the other entry points
//! compiled ahead on workers (`compile_ahead`). What that costs is counted for start-up figures.

use std::collections::HashMap;
use std::rc::Rc;

use super::{bindings, compile_ahead, specialize, Compiled, Kernels, Shader, Variant, TYPED_BINDINGS};
use crate::error::{Error, Result};

/// What creating shader modules (naga: parse, validate) and pipelines (driver compiles, or the
/// pipeline cache) has cost so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Creation {
    pub modules: u32,
    pub module_s: f64,
    pub pipelines: u32,
    /// Seconds the main thread spent creating pipelines (or fetching them from the cache).
    pub pipeline_s: f64,
    /// Seconds the main thread waited for pipelines compiling on workers.
    pub pipeline_wait_s: f64,
}

impl Kernels {
    #[allow(clippy::type_complexity)]
    pub(super) fn module(
        &self,
        shader: Shader,
        variant: Variant,
    ) -> Result<(wgpu::ShaderModule, Rc<HashMap<String, bindings::Signature>>)> {
        if let Some(m) = self.modules.borrow().get(&(shader.name, variant)) {
            return Ok(m.clone());
        }
        for i in 0..TYPED_BINDINGS {
            if variant.f16_bindings & (1 << i) != 0 && !shader.source.contains(&format!("<B{i}>")) {
                return Err(Error::invalid(shader.name, format!("binding {i} does not take f16 tensors")));
            }
        }
        if variant.f16_bindings != 0 && !self.gpu.features.contains(wgpu::Features::SHADER_F16) {
            return Err(Error::invalid(
                shader.name,
                format!("f16 tensors need shader-f16, which {} lacks", self.gpu.describe()),
            ));
        }
        self.gpu.check("before compiling a shader")?;
        let clock = crate::clock::Stopwatch::start();
        let source = specialize(shader, variant);
        let signatures = Rc::new(bindings::reflect(shader.name, &source)?);
        let desc =
            wgpu::ShaderModuleDescriptor { label: Some(shader.name), source: wgpu::ShaderSource::Wgsl(source.into()) };
        let module = if self.gpu.shader_checks {
            self.gpu.device.create_shader_module(desc)
        } else {
            // SAFETY: every kernel guards its reads and writes against the sizes in its Params
            // (tests run them on canary-guarded buffers and awkward shapes); dropping wgpu's
            // runtime bounds checks is what makes them fast on NVIDIA (15× on a matmul).
            unsafe { self.gpu.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        };
        self.gpu
            .check(shader.name)
            .map_err(|e| Error::ShaderCompile { kernel: shader.name.into(), msg: e.to_string() })?;
        let both = (module, signatures);
        self.modules.borrow_mut().insert((shader.name, variant), both.clone());
        let mut c = self.creation.get();
        (c.modules, c.module_s) = (c.modules + 1, c.module_s + clock.seconds());
        self.creation.set(c);
        Ok(both)
    }

    /// The compute pipeline for `entry` in `shader` as `variant` and its layout, compiled once (or
    /// compiling on a worker).
    pub(super) fn pipeline_and_layout(
        &self,
        shader: Shader,
        entry: &'static str,
        variant: Variant,
    ) -> Result<Compiled> {
        if let Some(p) = self.pipelines.borrow().get(&(shader.name, entry, variant)) {
            return Ok(p.clone());
        }
        // The module's first pipeline queues its siblings. (Not "the module is new": in slab mode
        // `Kernels::inputs_on_outputs` makes the module before its first pipeline is asked for.)
        let first_of_module = !self.pipelines.borrow().keys().any(|&(s, _, v)| s == shader.name && v == variant);
        let (module, signatures) = self.module(shader, variant)?;
        let clock = crate::clock::Stopwatch::start();
        let sig = signatures
            .get(entry)
            .ok_or_else(|| Error::invalid(shader.name, format!("has no entry point `{entry}`")))?;
        let layout = self.bindings.layout(sig);
        let cache = self.pipeline_cache.as_ref().map(|c| &c.cache);
        if first_of_module {
            let siblings = compile_ahead::entry_points(shader.source)
                .into_iter()
                .filter(|&e| e != entry)
                .filter_map(|e| Some((e, self.bindings.layout(signatures.get(e)?).pipeline)))
                .collect();
            self.compile_ahead.siblings(&self.gpu, &module, shader, siblings, variant, cache);
        }
        self.compiled.set(true);
        let key = (shader.name, entry, variant);
        let slot =
            match self.compile_ahead.take_or_spawn(key, &self.gpu.device, &module, shader, &layout.pipeline, cache) {
                Some(answer) => compile_ahead::PipelineSlot::compiling(
                    answer,
                    self.gpu.clone(),
                    module,
                    shader,
                    entry,
                    layout.pipeline.clone(),
                    cache.cloned(),
                    self.compile_ahead.waited(),
                ),
                None => {
                    let pipeline =
                        compile_ahead::create(&self.gpu.device, &module, shader, entry, &layout.pipeline, cache);
                    self.gpu.check(entry).map_err(|e| Error::ShaderCompile {
                        kernel: format!("{}::{entry}", shader.name),
                        msg: e.to_string(),
                    })?;
                    compile_ahead::PipelineSlot::ready(pipeline)
                }
            };
        let both = (slot, layout);
        self.pipelines.borrow_mut().insert((shader.name, entry, variant), both.clone());
        let mut c = self.creation.get();
        (c.pipelines, c.pipeline_s) = (c.pipelines + 1, c.pipeline_s + clock.seconds());
        self.creation.set(c);
        Ok(both)
    }
}
