//! The pager owns every tensor's bytes. Today they live in GPU buffers drawn from a byte-budgeted
//! pool; the host store, staging rings and the residency planner build on this interface
//! (`alloc` / `view` / `release`), so ops never hold GPU buffers themselves.

mod pool;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

pub use pool::size_class;
use pool::Pool;

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::tensor::TensorId;

/// Where a kernel finds a tensor: a buffer and a byte range.
#[derive(Clone, Debug)]
pub struct View {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

struct Slot {
    name: String,
    bytes: u64,
    buffer: wgpu::Buffer,
}

/// Memory counters, read by telemetry and `--json`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStats {
    pub tensors: usize,
    pub bytes_in_use: u64,
    pub bytes_held: u64,
    pub peak_bytes: u64,
    pub budget: u64,
}

pub struct Pager {
    gpu: Rc<Gpu>,
    state: RefCell<State>,
}

struct State {
    next_id: TensorId,
    slots: HashMap<TensorId, Slot>,
    pool: Pool,
}

impl Pager {
    /// `budget`: the most GPU bytes the pool may hold; `None` takes the adapter's largest buffer × 4.
    pub fn new(gpu: Rc<Gpu>, budget: Option<u64>) -> Self {
        let budget = budget.unwrap_or(gpu.limits.max_buffer_size.saturating_mul(4));
        Pager {
            gpu,
            state: RefCell::new(State {
                next_id: 1,
                slots: HashMap::new(),
                pool: Pool::new(budget),
            }),
        }
    }

    /// Reserves `bytes` for a new tensor named `name` (its contents are undefined).
    pub fn alloc(&self, name: &str, bytes: u64) -> Result<TensorId> {
        let limit = self.gpu.max_binding_bytes();
        if bytes > limit {
            return Err(Error::TooLarge {
                tensor: name.into(),
                bytes,
                limit,
                what: "storage-binding limit",
            });
        }
        let mut st = self.state.borrow_mut();
        let buffer = st.pool.take(&self.gpu.device, name, bytes.max(4))?;
        let id = st.next_id;
        st.next_id += 1;
        st.slots.insert(
            id,
            Slot {
                name: name.to_string(),
                bytes,
                buffer,
            },
        );
        Ok(id)
    }

    /// Where tensor `id` lives now.
    pub fn view(&self, id: TensorId) -> View {
        let st = self.state.borrow();
        let slot = &st.slots[&id];
        View {
            buffer: slot.buffer.clone(),
            offset: 0,
            size: slot.bytes.max(4).div_ceil(4) * 4,
        }
    }

    pub fn name(&self, id: TensorId) -> String {
        self.state
            .borrow()
            .slots
            .get(&id)
            .map(|s| s.name.clone())
            .unwrap_or_default()
    }

    /// Called when the last handle to `id` is dropped.
    pub(crate) fn release(&self, id: TensorId) {
        // `try_borrow_mut`: a drop during a panic unwind must not panic again.
        if let Ok(mut st) = self.state.try_borrow_mut() {
            if let Some(slot) = st.slots.remove(&id) {
                st.pool.give(slot.buffer);
            }
        }
    }

    pub fn stats(&self) -> MemoryStats {
        let st = self.state.borrow();
        MemoryStats {
            tensors: st.slots.len(),
            bytes_in_use: st.pool.in_use(),
            bytes_held: st.pool.held(),
            peak_bytes: st.pool.peak(),
            budget: st.pool.budget(),
        }
    }

    /// Frees cached GPU buffers that no tensor uses.
    pub fn trim(&self) {
        self.state.borrow_mut().pool.trim();
    }
}
