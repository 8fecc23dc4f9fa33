//! The context every op runs in: the GPU, its kernels, the pager that owns tensor bytes, and the
//! autograd tape.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

use crate::autograd::{Backward, Tape};
use crate::device::{DeviceOptions, Gpu};
use crate::error::{Error, Result};
use crate::kernels::{self, Kernels};
use crate::pager::{Access, HostStore, Pager, PagerOptions, View};
use crate::recorder::Recorder;
use crate::tensor::{DType, Tensor, TensorId};

/// Where tensors live on the host.
#[derive(Clone, Debug, Default)]
pub enum StoreKind {
    /// In memory (the default; the only choice in the browser): pinned host memory the GPU copies
    /// by DMA where the adapter offers it (`pager::memory_store`).
    #[default]
    Memory,
    /// In memory-mapped files under this directory: RAM is the page cache, the disk the tier below.
    Mmap(PathBuf),
}

/// Options for [`Context::new`].
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    pub device: DeviceOptions,
    pub pager: PagerOptions,
    pub store: StoreKind,
}

pub struct Context {
    pub gpu: Rc<Gpu>,
    pub recorder: Rc<Recorder>,
    pub kernels: Kernels,
    pub pager: Rc<Pager>,
    tape: RefCell<Tape>,
    grad_enabled: Cell<bool>,
    scratch: RefCell<Option<Tensor>>,
    dummy: RefCell<Option<Tensor>>,
    /// Prefix of the names of tensors made now (`transformer.h.3/`), so telemetry can tell
    /// which layer an activation belongs to.
    name_scope: RefCell<String>,
    /// The loss the backward being replayed started from and the gradient it was given
    /// (`Context::backward`); None outside one, or in one from a tensor gradient.
    backward_root: Cell<Option<(TensorId, f32)>>,
}

/// While this guard lives, new tensors' names start with its scope (see [`Context::name_scope`]).
pub struct NameScope<'a> {
    ctx: &'a Context,
    previous: String,
}

impl Drop for NameScope<'_> {
    fn drop(&mut self) {
        *self.ctx.name_scope.borrow_mut() = std::mem::take(&mut self.previous);
    }
}

/// Pins taken while this guard lives are released when it drops: the tensors one op binds
/// stay on the GPU together while its kernels are recorded.
pub struct OpScope<'a> {
    pager: &'a Pager,
    depth: usize,
}

impl Drop for OpScope<'_> {
    fn drop(&mut self) {
        self.pager.unpin_to(self.depth);
    }
}

impl Context {
    /// Opens the best adapter (see [`crate::device`]) and builds a context on it.
    pub async fn new(opts: &ContextOptions) -> Result<Context> {
        let gpu = Gpu::new(&opts.device).await?;
        crate::clock::startup_phase("device open");
        let ctx = Self::from_gpu(gpu, opts)?;
        crate::clock::startup_phase("pager ready");
        Ok(ctx)
    }

    pub fn from_gpu(gpu: Gpu, opts: &ContextOptions) -> Result<Context> {
        if let Some(budget) = opts.pager.budget {
            crate::pager::budget::check_budget(&gpu, budget)?;
        }
        let store: Box<dyn HostStore> = match &opts.store {
            StoreKind::Memory => crate::pager::memory_store(&gpu.device),
            #[cfg(not(target_arch = "wasm32"))]
            StoreKind::Mmap(dir) => Box::new(crate::pager::MmapStore::new(dir)?),
            #[cfg(target_arch = "wasm32")]
            StoreKind::Mmap(dir) => {
                return Err(Error::invalid("store", format!("no files in the browser: {}", dir.display())))
            }
        };
        Ok(Self::with_store(gpu, store, &opts.pager))
    }

    /// A context over any host store (e.g. one that fails on purpose, in tests).
    pub fn with_store(gpu: Gpu, store: Box<dyn HostStore>, opts: &PagerOptions) -> Context {
        let gpu = Rc::new(gpu);
        let recorder = Rc::new(Recorder::new(gpu.clone()));
        Context {
            kernels: Kernels::new(recorder.clone()),
            pager: Rc::new(Pager::new(gpu.clone(), recorder.clone(), store, opts)),
            recorder,
            gpu,
            tape: RefCell::new(Tape::default()),
            grad_enabled: Cell::new(true),
            scratch: RefCell::new(None),
            dummy: RefCell::new(None),
            name_scope: RefCell::new(String::new()),
            backward_root: Cell::new(None),
        }
    }

    fn tensor(&self, id: u64, shape: &[usize], dtype: DType, requires_grad: bool) -> Tensor {
        self.pager.set_layout(id, shape, dtype);
        Tensor::new(id, shape.to_vec(), dtype, requires_grad, self.pager.clone())
    }

    /// Tensors made while the returned guard lives are named `scope/name` (`scope` is the layer
    /// the model is computing, e.g. `transformer.h.3`); scopes do not nest.
    pub fn name_scope(&self, scope: &str) -> NameScope<'_> {
        let previous = std::mem::replace(&mut *self.name_scope.borrow_mut(), scope.to_string());
        NameScope { ctx: self, previous }
    }

    fn scoped(&self, name: &str) -> String {
        let scope = self.name_scope.borrow();
        if scope.is_empty() {
            name.to_string()
        } else {
            format!("{scope}/{name}")
        }
    }

    /// A tensor with undefined contents.
    pub fn empty(&self, name: &str, shape: &[usize], dtype: DType, requires_grad: bool) -> Result<Tensor> {
        let elems: usize = shape.iter().product();
        let id = self.pager.alloc(&self.scoped(name), (elems * dtype.size()) as u64)?;
        Ok(self.tensor(id, shape, dtype, requires_grad))
    }

    /// An f32 tensor of zeros (cleared on the GPU when first used; nothing is uploaded).
    pub fn zeros(&self, name: &str, shape: &[usize], requires_grad: bool) -> Result<Tensor> {
        self.zeros_of(name, shape, DType::F32, requires_grad)
    }

    /// A tensor of zeros of any element type.
    pub fn zeros_of(&self, name: &str, shape: &[usize], dtype: DType, requires_grad: bool) -> Result<Tensor> {
        let elems: usize = shape.iter().product();
        let id = self.pager.alloc_zeroed(&self.scoped(name), (elems * dtype.size()) as u64)?;
        Ok(self.tensor(id, shape, dtype, requires_grad))
    }

    /// An f32 tensor holding `data` (row-major, `shape`).
    pub fn from_f32(&self, name: &str, shape: &[usize], data: &[f32], requires_grad: bool) -> Result<Tensor> {
        check_len(name, shape, data.len())?;
        let t = self.empty(name, shape, DType::F32, requires_grad)?;
        self.pager.write(t.id(), bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// A u32 tensor holding `data` (token ids, targets).
    pub fn from_u32(&self, name: &str, shape: &[usize], data: &[u32]) -> Result<Tensor> {
        check_len(name, shape, data.len())?;
        let t = self.empty(name, shape, DType::U32, false)?;
        self.pager.write(t.id(), bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// Overwrites an f32 tensor's contents.
    pub fn write_f32(&self, t: &Tensor, data: &[f32]) -> Result<()> {
        check_len("write_f32", t.shape(), data.len())?;
        self.pager.write(t.id(), bytemuck::cast_slice(data))
    }

    /// Copies an f32 tensor back to the host (waits for the GPU).
    pub async fn to_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        if t.dtype() != DType::F32 {
            return Err(Error::invalid("to_f32", format!("{t:?} is not f32")));
        }
        let bytes = self.pager.read(t.id()).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Copies a u32 tensor back to the host (waits for the GPU).
    pub async fn to_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        let bytes = self.pager.read(t.id()).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Starts an op: tensors bound until the guard drops stay resident together.
    pub fn op(&self) -> OpScope<'_> {
        OpScope { pager: &self.pager, depth: self.pager.pin_depth() }
    }

    /// `t` on the GPU for reading.
    pub fn read(&self, t: &Tensor) -> Result<View> {
        self.view(t, Access::Read)
    }

    /// `t` on the GPU to be overwritten entirely.
    pub fn write(&self, t: &Tensor) -> Result<View> {
        self.view(t, Access::Write)
    }

    /// `t` on the GPU to be read and written (accumulated into).
    pub fn modify(&self, t: &Tensor) -> Result<View> {
        self.view(t, Access::ReadWrite)
    }

    /// [`Context::modify`] where the kernel adds to `t`, else [`Context::write`] (a new output or
    /// gradient, written whole: nothing of it is uploaded or cleared first).
    pub fn write_or_modify(&self, t: &Tensor, accumulate: bool) -> Result<View> {
        self.view(t, if accumulate { Access::ReadWrite } else { Access::Write })
    }

    fn view(&self, t: &Tensor, access: Access) -> Result<View> {
        Ok(View { dtype: t.dtype(), ..self.pager.access(t.id(), access)? })
    }

    /// Submits recorded work and waits for it (native) — the end of a step.
    pub fn sync(&self) -> Result<()> {
        self.recorder.flush();
        // (a wait for everything: the recorder then knows the GPU is idle, `Recorder::drained`)
        self.recorder.wait(None)?;
        self.pager.poll()
    }

    /// Whether ops record backward nodes now.
    pub fn grad_enabled(&self) -> bool {
        self.grad_enabled.get()
    }

    /// Runs `f` without recording anything on the tape (evaluation, sampling).
    pub fn no_grad<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = self.grad_enabled.replace(false);
        let r = f();
        self.grad_enabled.set(before);
        r
    }

    /// True when an op with these inputs must record a backward node.
    pub(crate) fn wants_grad(&self, inputs: &[&Tensor]) -> bool {
        self.grad_enabled.get() && inputs.iter().any(|t| t.requires_grad())
    }

    /// The loss the running backward started from and d loss, where it started from a scalar
    /// seed (`Context::backward`): an op whose output that loss is knows its gradient exactly.
    pub(crate) fn backward_root(&self) -> Option<(TensorId, f32)> {
        self.backward_root.get()
    }

    /// Sets [`Context::backward_root`] for a backward about to replay; returns the outer one.
    pub(crate) fn replace_backward_root(&self, root: Option<(TensorId, f32)>) -> Option<(TensorId, f32)> {
        self.backward_root.replace(root)
    }

    /// Records a backward node producing gradients for the inputs of `outputs`.
    pub(crate) fn record(&self, outputs: &[&Tensor], node: impl Backward + 'static) {
        self.tape.borrow_mut().push(outputs.iter().map(|t| t.id()).collect(), Box::new(node));
    }

    pub fn tape(&self) -> std::cell::RefMut<'_, Tape> {
        self.tape.borrow_mut()
    }

    /// Scratch for two-stage reductions (MAX_PARTIALS floats), reused in dispatch order.
    pub(crate) fn partials(&self) -> Result<View> {
        let mut s = self.scratch.borrow_mut();
        if s.is_none() {
            *s = Some(self.empty("reduce partials", &[kernels::reduce::MAX_PARTIALS], DType::F32, false)?);
        }
        self.write(s.as_ref().expect("just set"))
    }

    /// A tiny buffer standing in for an absent optional binding (e.g. no bias).
    pub(crate) fn dummy(&self) -> Result<View> {
        let mut d = self.dummy.borrow_mut();
        if d.is_none() {
            *d = Some(self.zeros("dummy", &[4], false)?);
        }
        self.read(d.as_ref().expect("just set"))
    }
}

fn check_len(name: &str, shape: &[usize], len: usize) -> Result<()> {
    let want: usize = shape.iter().product();
    if want != len {
        return Err(Error::Shape {
            op: "upload",
            expected: format!("{want} elements for {name} {shape:?}"),
            got: format!("{len}"),
        });
    }
    Ok(())
}
