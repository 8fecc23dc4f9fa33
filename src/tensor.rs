//! Tensor handles. A `Tensor` names bytes the pager owns: id, shape, dtype, and whether gradients
//! flow through it. Dropping the last handle gives its memory back.
//!
//! Shape legend used in docs across the crate: B batch, T time (sequence), C channels (n_embd),
//! H heads, D head size (C/H), V vocabulary, N rows (B·T), K inner dimension of a matmul.

use std::rc::Rc;

use crate::pager::Pager;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    U32,
    I8,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::U32 => "u32",
            DType::I8 => "i8",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
            DType::I8 => 1,
        }
    }
}

pub type TensorId = u64;

/// A cheap, clonable handle to a tensor held by the pager.
#[derive(Clone)]
pub struct Tensor(Rc<TensorInner>);

struct TensorInner {
    id: TensorId,
    shape: Vec<usize>,
    dtype: DType,
    requires_grad: bool,
    pager: Rc<Pager>,
}

impl Drop for TensorInner {
    fn drop(&mut self) {
        self.pager.release(self.id);
    }
}

impl Tensor {
    pub(crate) fn new(id: TensorId, shape: Vec<usize>, dtype: DType, requires_grad: bool, pager: Rc<Pager>) -> Self {
        Tensor(Rc::new(TensorInner { id, shape, dtype, requires_grad, pager }))
    }

    pub fn id(&self) -> TensorId {
        self.0.id
    }

    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> u64 {
        (self.len() * self.0.dtype.size()) as u64
    }

    /// Whether backward computes a gradient for this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// The size of the last dimension (1 for a scalar).
    pub fn last_dim(&self) -> usize {
        self.0.shape.last().copied().unwrap_or(1)
    }

    /// Everything but the last dimension, multiplied: the number of rows.
    pub fn rows(&self) -> usize {
        self.len() / self.last_dim().max(1)
    }

    pub fn name(&self) -> String {
        self.0.pager.name(self.0.id)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor#{}{:?}:{:?}", self.0.id, self.0.shape, self.0.dtype)
    }
}
