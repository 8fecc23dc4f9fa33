//! Bind groups made once and kept across dispatches and steps.
//!
//! Every kernel binds its storage buffers at 0..n and its `Params` uniform at n. The uniform is
//! bound with a dynamic offset into the recorder's arena, so a bind group depends only on the
//! layout and the storage buffer ranges, which repeat from step to step: a training step then
//! creates no bind groups at all once warm. Layouts are explicit (a dynamic offset needs that),
//! made from what naga says each entry point uses: the storage bindings' access modes.
//!
//! A kept bind group holds its buffers alive; when the pager's pool drops buffers (evictions
//! under a budget, trims), the cache is emptied so that their memory really goes.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use crate::error::{Error, Result};
use crate::pager::View;
use crate::recorder::{Recorder, UNIFORM_SLOT};

/// What a layout holds: storage bindings 0..n (true: read-only) and the uniform at n.
pub type Signature = Vec<bool>;

/// Most bind groups kept before the cache starts over (buffers that never go back to the pool,
/// e.g. in tests, would otherwise be held forever).
const MAX_GROUPS: usize = 16384;

/// The signature of every entry point of a WGSL module, by name.
pub fn reflect(name: &str, source: &str) -> Result<HashMap<String, Signature>> {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let bad = |msg: String| Error::ShaderCompile { kernel: name.into(), msg };
    let module = naga::front::wgsl::parse_str(source).map_err(|e| bad(e.emit_to_string(source)))?;
    let info = Validator::new(ValidationFlags::empty(), Capabilities::all())
        .validate(&module)
        .map_err(|e| bad(e.emit_to_string(source)))?;
    let mut out = HashMap::new();
    for (i, ep) in module.entry_points.iter().enumerate() {
        let uses = info.get_entry_point(i);
        // binding -> Some(read_only) for storage, None for the uniform.
        let mut bound: Vec<(u32, Option<bool>)> = Vec::new();
        for (handle, var) in module.global_variables.iter() {
            let Some(rb) = &var.binding else { continue };
            if uses[handle].is_empty() {
                continue;
            }
            if rb.group != 0 {
                return Err(bad(format!("{}: only bind group 0 is supported", ep.name)));
            }
            let kind = match var.space {
                naga::AddressSpace::Storage { access } => Some(!access.contains(naga::StorageAccess::STORE)),
                naga::AddressSpace::Uniform => None,
                _ => return Err(bad(format!("{}: binding {} is neither storage nor uniform", ep.name, rb.binding))),
            };
            bound.push((rb.binding, kind));
        }
        bound.sort_by_key(|b| b.0);
        // Storage at 0..n, the uniform last: the calling convention of `Kernels::dispatch`.
        let n = bound.len().saturating_sub(1);
        let well_formed = bound.iter().enumerate().all(|(i, (b, k))| *b == i as u32 && (k.is_none() == (i == n)));
        if !well_formed {
            return Err(bad(format!("{}: bindings must be storage at 0..n and the uniform at n", ep.name)));
        }
        out.insert(ep.name.clone(), bound[..n].iter().map(|(_, k)| k.expect("storage")).collect());
    }
    Ok(out)
}

/// A layout and its id (bind groups of equal layouts are shared between pipelines).
#[derive(Clone)]
pub struct Layout {
    pub id: u32,
    /// Storage bindings the layout has.
    pub sig_len: usize,
    pub bind: wgpu::BindGroupLayout,
    pub pipeline: wgpu::PipelineLayout,
}

#[derive(Hash, PartialEq, Eq)]
struct GroupKey {
    layout: u32,
    buffers: Vec<(wgpu::Buffer, u64, u64)>,
}

pub struct Bindings {
    device: wgpu::Device,
    recorder: Rc<Recorder>,
    layouts: RefCell<HashMap<Signature, Layout>>,
    groups: RefCell<HashMap<GroupKey, wgpu::BindGroup>>,
    /// The recorder's count of dropped pool buffers when the cache was last valid.
    retired: Cell<u64>,
    created: Cell<u64>,
}

impl Bindings {
    pub fn new(recorder: Rc<Recorder>) -> Self {
        Bindings {
            device: recorder.gpu().device.clone(),
            retired: Cell::new(recorder.retired()),
            recorder,
            layouts: RefCell::new(HashMap::new()),
            groups: RefCell::new(HashMap::new()),
            created: Cell::new(0),
        }
    }

    /// The layout for `sig`, made once.
    pub fn layout(&self, sig: &Signature) -> Layout {
        if let Some(l) = self.layouts.borrow().get(sig) {
            return l.clone();
        }
        let storage = |read_only| wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        };
        let mut entries: Vec<wgpu::BindGroupLayoutEntry> = sig
            .iter()
            .enumerate()
            .map(|(i, &ro)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: storage(ro),
                count: None,
            })
            .collect();
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: sig.len() as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: None,
            },
            count: None,
        });
        let bind =
            self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries });
        let pipeline = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&bind)],
            immediate_size: 0,
        });
        let mut layouts = self.layouts.borrow_mut();
        let l = Layout { id: layouts.len() as u32, sig_len: sig.len(), bind, pipeline };
        layouts.insert(sig.clone(), l.clone());
        l
    }

    /// The bind group of `buffers` (and the arena's uniform slot, offset at dispatch) for `layout`.
    pub fn group(&self, layout: &Layout, buffers: &[&View]) -> wgpu::BindGroup {
        let retired = self.recorder.retired();
        let mut groups = self.groups.borrow_mut();
        if retired != self.retired.get() || groups.len() >= MAX_GROUPS {
            groups.clear();
            self.retired.set(retired);
        }
        let key = GroupKey {
            layout: layout.id,
            buffers: buffers.iter().map(|v| (v.buffer.clone(), v.offset, v.size)).collect(),
        };
        if let Some(g) = groups.get(&key) {
            return g.clone();
        }
        let arena = self.recorder.arena();
        let mut entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, v)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &v.buffer,
                    offset: v.offset,
                    size: wgpu::BufferSize::new(v.size),
                }),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: buffers.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &arena,
                offset: 0,
                size: wgpu::BufferSize::new(UNIFORM_SLOT),
            }),
        });
        let g = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout.bind,
            entries: &entries,
        });
        self.created.set(self.created.get() + 1);
        groups.insert(key, g.clone());
        g
    }

    /// Bind groups created so far (for benchmarks and tests: a warm step creates none).
    pub fn created(&self) -> u64 {
        self.created.get()
    }
}
