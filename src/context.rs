//! The context every op runs in: the GPU, its kernels, the pager that owns tensor bytes, and the
//! autograd tape.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::autograd::{Backward, Tape};
use crate::device::{DeviceOptions, Gpu};
use crate::error::{Error, Result};
use crate::kernels::{self, Kernels};
use crate::pager::{Pager, View};
use crate::tensor::{DType, Tensor};

/// Options for [`Context::new`].
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    pub device: DeviceOptions,
    /// GPU byte budget for tensors; `None`: as much as the adapter allows.
    pub gpu_budget: Option<u64>,
}

pub struct Context {
    pub gpu: Rc<Gpu>,
    pub kernels: Kernels,
    pub pager: Rc<Pager>,
    tape: RefCell<Tape>,
    grad_enabled: Cell<bool>,
    scratch: RefCell<Option<Tensor>>,
    dummy: RefCell<Option<Tensor>>,
}

impl Context {
    /// Opens the best adapter (see [`crate::device`]) and builds a context on it.
    pub async fn new(opts: &ContextOptions) -> Result<Context> {
        let gpu = Gpu::new(&opts.device).await?;
        Ok(Self::from_gpu(gpu, opts.gpu_budget))
    }

    pub fn from_gpu(gpu: Gpu, gpu_budget: Option<u64>) -> Context {
        let gpu = Rc::new(gpu);
        Context {
            kernels: Kernels::new(gpu.clone()),
            pager: Rc::new(Pager::new(gpu.clone(), gpu_budget)),
            gpu,
            tape: RefCell::new(Tape::default()),
            grad_enabled: Cell::new(true),
            scratch: RefCell::new(None),
            dummy: RefCell::new(None),
        }
    }

    /// A tensor with undefined contents.
    pub fn empty(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        requires_grad: bool,
    ) -> Result<Tensor> {
        let elems: usize = shape.iter().product();
        let id = self.pager.alloc(name, (elems * dtype.size()) as u64)?;
        Ok(Tensor::new(
            id,
            shape.to_vec(),
            dtype,
            requires_grad,
            self.pager.clone(),
        ))
    }

    /// An f32 tensor of zeros.
    pub fn zeros(&self, name: &str, shape: &[usize], requires_grad: bool) -> Result<Tensor> {
        let t = self.empty(name, shape, DType::F32, requires_grad)?;
        self.kernels.zero(&self.view(&t));
        Ok(t)
    }

    /// An f32 tensor holding `data` (row-major, `shape`).
    pub fn from_f32(
        &self,
        name: &str,
        shape: &[usize],
        data: &[f32],
        requires_grad: bool,
    ) -> Result<Tensor> {
        check_len(name, shape, data.len())?;
        let t = self.empty(name, shape, DType::F32, requires_grad)?;
        self.kernels
            .write_bytes(&self.view(&t), bytemuck::cast_slice(data));
        Ok(t)
    }

    /// A u32 tensor holding `data` (token ids, targets).
    pub fn from_u32(&self, name: &str, shape: &[usize], data: &[u32]) -> Result<Tensor> {
        check_len(name, shape, data.len())?;
        let t = self.empty(name, shape, DType::U32, false)?;
        self.kernels
            .write_bytes(&self.view(&t), bytemuck::cast_slice(data));
        Ok(t)
    }

    /// Overwrites an f32 tensor's contents.
    pub fn write_f32(&self, t: &Tensor, data: &[f32]) -> Result<()> {
        check_len("write_f32", t.shape(), data.len())?;
        self.kernels
            .write_bytes(&self.view(t), bytemuck::cast_slice(data));
        Ok(())
    }

    /// Copies an f32 tensor back to the host (waits for the GPU).
    pub async fn to_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        if t.dtype() != DType::F32 {
            return Err(Error::invalid("to_f32", format!("{t:?} is not f32")));
        }
        let bytes = self.kernels.read_bytes(&self.view(t), t.bytes()).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Copies a u32 tensor back to the host (waits for the GPU).
    pub async fn to_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        let bytes = self.kernels.read_bytes(&self.view(t), t.bytes()).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Where the kernels find `t` now.
    pub fn view(&self, t: &Tensor) -> View {
        self.pager.view(t.id())
    }

    /// Submits recorded work and waits for it (native) — the end of a step.
    pub fn sync(&self) -> Result<()> {
        self.kernels.flush();
        self.gpu.wait_idle()
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

    /// Records a backward node producing gradients for the inputs of `outputs`.
    pub(crate) fn record(&self, outputs: &[&Tensor], node: impl Backward + 'static) {
        self.tape
            .borrow_mut()
            .push(outputs.iter().map(|t| t.id()).collect(), Box::new(node));
    }

    pub fn tape(&self) -> std::cell::RefMut<'_, Tape> {
        self.tape.borrow_mut()
    }

    /// Scratch for two-stage reductions (MAX_PARTIALS floats), reused in dispatch order.
    pub(crate) fn partials(&self) -> Result<View> {
        let mut s = self.scratch.borrow_mut();
        if s.is_none() {
            *s = Some(self.empty(
                "reduce partials",
                &[kernels::reduce::MAX_PARTIALS],
                DType::F32,
                false,
            )?);
        }
        Ok(self.view(s.as_ref().expect("just set")))
    }

    /// A tiny buffer standing in for an absent optional binding (e.g. no bias).
    pub(crate) fn dummy(&self) -> Result<View> {
        let mut d = self.dummy.borrow_mut();
        if d.is_none() {
            *d = Some(self.zeros("dummy", &[4], false)?);
        }
        Ok(self.view(d.as_ref().expect("just set")))
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
