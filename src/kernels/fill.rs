//! Clears as a kernel (`shaders/fill.wgsl`), so the pager's clears stay inside the open compute
//! pass instead of ending it (a clear per gradient per step: half of a small model's passes).
//! The recorder calls it through [`Clearer`]; ranges it cannot bind go to `clear_buffer`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::{grid_1d, specialize, Variant, FILL};
use crate::recorder::{Clearer, Recorder, UNIFORM_SLOT};

gpu_params! {
    pub(super) struct Params {
        n: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

pub struct Filler {
    device: wgpu::Device,
    limits: wgpu::Limits,
    /// Compiled at the first clear.
    pipeline: RefCell<Option<(wgpu::ComputePipeline, wgpu::BindGroupLayout)>>,
    /// Bind groups by range, dropped with the recorder's retired pool buffers (see `bindings`).
    groups: RefCell<HashMap<(wgpu::Buffer, u64, u64), wgpu::BindGroup>>,
    retired: Cell<u64>,
}

impl Filler {
    pub fn new(device: &wgpu::Device, limits: &wgpu::Limits) -> Self {
        Filler {
            device: device.clone(),
            limits: limits.clone(),
            pipeline: RefCell::new(None),
            groups: RefCell::new(HashMap::new()),
            retired: Cell::new(0),
        }
    }

    fn pipeline(&self) -> (wgpu::ComputePipeline, wgpu::BindGroupLayout) {
        let mut p = self.pipeline.borrow_mut();
        p.get_or_insert_with(|| {
            let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("fill"),
                source: wgpu::ShaderSource::Wgsl(specialize(FILL, Variant::default()).into()),
            });
            let buffer =
                |ty, dynamic| wgpu::BindingType::Buffer { ty, has_dynamic_offset: dynamic, min_binding_size: None };
            let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty,
                count: None,
            };
            let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("fill"),
                entries: &[
                    entry(0, buffer(wgpu::BufferBindingType::Storage { read_only: false }, false)),
                    entry(1, buffer(wgpu::BufferBindingType::Uniform, true)),
                ],
            });
            let pipeline_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("fill"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("fill_zero"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("fill_zero"),
                compilation_options: Default::default(),
                cache: None,
            });
            (pipeline, layout)
        })
        .clone()
    }
}

impl Clearer for Filler {
    fn clear(&self, recorder: &Recorder, buffer: &wgpu::Buffer, offset: u64, len: u64) -> bool {
        let bindable = buffer.usage().contains(wgpu::BufferUsages::STORAGE)
            && offset.is_multiple_of(self.limits.min_storage_buffer_offset_alignment as u64)
            && len.is_multiple_of(4)
            && len > 0
            && len <= self.limits.max_storage_buffer_binding_size
            && len / 4 <= u32::MAX as u64;
        if !bindable {
            return false;
        }
        let (pipeline, layout) = self.pipeline();
        let group = {
            let mut groups = self.groups.borrow_mut();
            if self.retired.get() != recorder.retired() || groups.len() >= 4096 {
                groups.clear();
                self.retired.set(recorder.retired());
            }
            let arena = recorder.arena();
            groups
                .entry((buffer.clone(), offset, len))
                .or_insert_with(|| {
                    self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("fill"),
                        layout: &layout,
                        entries: &[
                            wgpu::BindGroupEntry {
                                binding: 0,
                                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                    buffer,
                                    offset,
                                    size: wgpu::BufferSize::new(len),
                                }),
                            },
                            wgpu::BindGroupEntry {
                                binding: 1,
                                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                    buffer: &arena,
                                    offset: 0,
                                    size: wgpu::BufferSize::new(UNIFORM_SLOT),
                                }),
                            },
                        ],
                    })
                })
                .clone()
        };
        let words = len / 4;
        let groups = grid_1d(words);
        let params = Params { n: words as u32, ..Default::default() };
        recorder.dispatch_with_uniforms(bytemuck::bytes_of(&params), false, move |pass, at| {
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[at]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        });
        true
    }
}
