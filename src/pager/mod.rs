//! The pager owns every tensor's bytes. Their truth lives in a host store (mmap'ed files or
//! memory); a pool of GPU buffers under a hard byte budget caches the tensors the kernels need.
//!
//! Ops ask for a tensor with an [`Access`]: the pager makes it resident (uploading through the
//! staging ring, clearing a zero tensor, or nothing for an output that will be overwritten),
//! evicting others when the budget is short — the one needed farthest in the future, predicted
//! from the previous step's trace ([`plan`]) — and writing dirty victims back through the
//! readback ring first. Tensors bound for the op in flight are pinned and never evicted.
//! Every transfer is recorded into the same command stream as the kernels, so order is program
//! order.

pub mod budget;
mod copier;
mod dma;
mod entry;
mod eviction;
mod host;
mod host_loan;
mod options;
#[cfg(vulkan_hal)]
mod pinned_store;
pub mod plan;
mod pool;
mod ranges;
mod readback_ring;
mod report;
mod residency;
mod slabs;
mod staging;
pub mod telemetry;
mod transfers;
mod upload_path;
mod upload_ring;
mod window;

use std::cell::{Cell, RefCell, RefMut};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use copier::Copier;
#[cfg(not(target_arch = "wasm32"))]
pub use host::MmapStore;
pub use host::{HostRange, HostStore, MemStore};
pub use host_loan::HostLoan;
pub use options::{memory_store, PagerOptions};
#[cfg(vulkan_hal)]
pub use pinned_store::PinnedStore;
pub use plan::{Key, Policy};
use pool::Pool;
pub use pool::{size_class, GpuPool};
pub use report::MemoryStats;
use staging::{ReadbackRing, UploadRing};
use telemetry::stall;
pub use telemetry::{Counters, Location, Snapshot, StepTransfers, TensorInfo};
pub use upload_path::UploadPath;

use entry::{Contents, Entry, DISCARDED, DROPPED_BY_PLAN, FORGOTTEN};

use crate::clock::Stopwatch;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::recorder::Recorder;
use crate::tensor::{DType, TensorId};

/// Where a kernel finds a tensor: a buffer, a byte range and the element type kernels read it as
/// (which compiled variant of a kernel binds it; the pager itself only moves bytes).
#[derive(Clone, Debug)]
pub struct View {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
    pub dtype: DType,
}

impl View {
    /// Elements `start..start + count` of this view (the start's byte offset must suit the
    /// adapter's storage binding alignment, 256 bytes at most).
    pub fn elements(&self, start: usize, count: usize) -> View {
        let size = self.dtype.size() as u64;
        View { offset: self.offset + start as u64 * size, size: count as u64 * size, ..self.clone() }
    }
}

/// How a kernel uses a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Every element is overwritten: nothing needs uploading first.
    Write,
    /// Read and written (accumulation).
    ReadWrite,
}

impl Access {
    fn writes(self) -> bool {
        self != Access::Read
    }
}

pub struct Pager {
    gpu: Rc<Gpu>,
    recorder: Rc<Recorder>,
    state: RefCell<State>,
    /// The upload path in use and why it was chosen.
    upload_choice: RefCell<(UploadPath, String)>,
    /// `auto` kept the staging ring unmeasured on a GPU that offers pinned memory: a paged run
    /// may time both (`upload_trial_offered`).
    upload_trial: Cell<bool>,
    /// Upload slots asked for, and as many as a ring in GPU memory may take of the budget.
    upload_slots: (usize, usize),
    /// How the budget was set.
    budget_source: String,
    /// Pinned host memory for the upload ring (Vulkan), or why there is none.
    #[cfg(vulkan_hal)]
    pinned: Option<Rc<crate::vulkan_hal::PinnedAllocator>>,
    #[cfg(vulkan_hal)]
    pinned_error: Option<String>,
    /// Releases and unpins that came while `state` was borrowed (a handle dropped inside an
    /// `update_host` closure or during a panic's unwind): done at the next borrow, never lost.
    deferred: RefCell<Deferred>,
}

#[derive(Default)]
struct Deferred {
    releases: Vec<TensorId>,
    unpin_to: Option<usize>,
}

struct State {
    store: Box<dyn HostStore>,
    entries: HashMap<TensorId, Entry>,
    /// The tensors with a GPU buffer (`gpu` set): eviction looks only at these, not at every
    /// tensor (a paged GPT-2 XL has thousands, a few dozen of them resident).
    resident: HashSet<TensorId>,
    next_id: TensorId,
    pool: Pool,
    copier: Arc<Copier>,
    upload: UploadRing,
    readback: ReadbackRing,
    /// Copies straight between a pinned store and GPU buffers (see `dma.rs`).
    dma: dma::DmaCopies,
    /// Uploads from a pinned store go by DMA straight from it (the `Pinned` path).
    direct_upload: bool,
    /// On the ring's path, a tensor whose direct write-back is still in flight is uploaded by
    /// DMA from the store instead of waiting for it (`PAGETRAIN_REUPLOAD_DMA=0`: waits, for
    /// measuring).
    reupload_in_flight: bool,
    /// Upload-ring slots are filled ahead from the plan (`PAGETRAIN_PREFILL=0`: only at the
    /// access, for measuring).
    prefill: bool,
    pinned: Vec<TensorId>,
    policy: Policy,
    prefetch_window: usize,
    drop_dead_writebacks: bool,
    in_step: bool,
    step_ids: Vec<TensorId>,
    trace: Vec<Key>,
    future: Option<plan::Future>,
    diverged: bool,
    /// The caller marks steps with `begin_step`; optimizer updates then no longer do.
    explicit_steps: bool,
    /// See [`PagerOptions::blocking_waits`].
    blocking_waits: bool,
    clock: u64,
    counters: Counters,
    channel: telemetry::Channel,
    /// Bytes of all live tensors (wherever they are), and the most there ever were: the footprint.
    live_bytes: u64,
    peak_live_bytes: u64,
    /// When the current step began, with the counters then; and the last step's traffic.
    step_start: Option<(Stopwatch, Counters)>,
    last_step: Option<StepTransfers>,
    /// Tensors made in this step and freed with no read of their host copy (by key).
    freed_unread: HashSet<Key>,
    /// Host bytes of tensors released while lent (`Pager::lend_host`): freed when returned.
    released_while_lent: HashMap<TensorId, HostRange>,
    /// Where in the slabs each key was last placed (`Pool::take`'s hint).
    last_place: HashMap<Key, (usize, u64)>,
}

impl Drop for State {
    /// Background copies read and write the host store: they end before it goes.
    fn drop(&mut self) {
        self.upload.wait_fills();
        self.readback.wait_deliveries();
    }
}

impl Pager {
    pub fn new(gpu: Rc<Gpu>, recorder: Rc<Recorder>, store: Box<dyn HostStore>, opts: &PagerOptions) -> Self {
        let (budget, budget_source) = match opts.budget {
            Some(b) => (b, "asked for".to_string()),
            None => budget::auto_budget(&gpu),
        };
        let slot_bytes = opts.slot_bytes.min(gpu.limits.max_buffer_size).max(4096);
        let upload_slots = (opts.upload_slots.max(1), budget::ring_slots(budget, slot_bytes, opts.upload_slots.max(1)));
        let copier = Arc::new(Copier::new());
        // The browser cannot block, whatever the options say.
        let may_block = opts.blocking_waits && !cfg!(target_arch = "wasm32");
        if opts.gpu_pool == GpuPool::Slabs {
            recorder.set_tensors_share_buffers();
        }
        let state = State {
            store,
            entries: HashMap::new(),
            resident: HashSet::new(),
            next_id: 1,
            pool: Pool::new(budget, recorder.retired_counter(), opts.gpu_pool, gpu.limits.max_buffer_size),
            upload: UploadRing::new(&gpu.device, copier.clone(), upload_slots.1, slot_bytes, may_block),
            readback: ReadbackRing::new(&gpu.device, copier.clone(), opts.readback_slots.max(1), slot_bytes, may_block),
            copier,
            dma: dma::DmaCopies::default(),
            direct_upload: false,
            reupload_in_flight: std::env::var("PAGETRAIN_REUPLOAD_DMA").map_or(true, |v| v != "0"),
            prefill: std::env::var("PAGETRAIN_PREFILL").map_or(true, |v| v != "0"),
            pinned: Vec::new(),
            policy: opts.policy,
            prefetch_window: opts.prefetch_window,
            drop_dead_writebacks: opts.drop_dead_writebacks,
            in_step: false,
            step_ids: Vec::new(),
            trace: Vec::new(),
            future: None,
            diverged: false,
            explicit_steps: false,
            blocking_waits: may_block,
            clock: 0,
            counters: Counters::default(),
            channel: telemetry::Channel::default(),
            live_bytes: 0,
            peak_live_bytes: 0,
            step_start: None,
            last_step: None,
            freed_unread: HashSet::new(),
            released_while_lent: HashMap::new(),
            last_place: HashMap::new(),
        };
        #[cfg(vulkan_hal)]
        let (pinned, pinned_error) = match crate::vulkan_hal::PinnedAllocator::new(&gpu.device) {
            Ok(a) => (Some(Rc::new(a)), None),
            Err(why) => (None, Some(why)),
        };
        let pager = Pager {
            gpu,
            recorder,
            state: RefCell::new(state),
            upload_choice: RefCell::new((UploadPath::Ring, String::new())),
            upload_trial: Cell::new(false),
            upload_slots,
            budget_source,
            #[cfg(vulkan_hal)]
            pinned,
            #[cfg(vulkan_hal)]
            pinned_error,
            deferred: RefCell::new(Deferred::default()),
        };
        pager.choose_upload_path(opts.upload);
        pager
    }

    /// The pager's state, after the releases and unpins deferred while it was borrowed.
    fn state(&self) -> RefMut<'_, State> {
        let mut st = self.state.borrow_mut();
        let d = std::mem::take(&mut *self.deferred.borrow_mut());
        if let Some(depth) = d.unpin_to {
            st.unpin_to(depth);
        }
        for id in d.releases {
            st.release(id);
        }
        st
    }

    fn create(&self, name: &str, bytes: u64, contents: Contents) -> Result<TensorId> {
        let limit = self.gpu.max_binding_bytes();
        if bytes > limit {
            return Err(Error::TooLarge { tensor: name.into(), bytes, limit, what: "storage-binding limit" });
        }
        let mut st = self.state();
        if size_class(bytes) > st.pool.budget() {
            return Err(Error::BudgetTooSmall {
                tensor: name.into(),
                needed: size_class(bytes),
                budget: st.pool.budget(),
            });
        }
        for r in st.dma.ready_frees() {
            st.store.free(r);
        }
        let host = st.store.alloc(bytes as usize)?;
        let id = st.next_id;
        st.next_id += 1;
        let key = if st.in_step {
            st.step_ids.push(id);
            Key::Step(st.step_ids.len() as u32 - 1)
        } else {
            Key::Persistent(id)
        };
        let entry = Entry {
            name: name.to_string(),
            bytes,
            host,
            gpu: None,
            dirty: false,
            contents,
            key,
            last_use: 0,
            uploads: 0,
            pins: 0,
            lost: None,
            layout: None,
            unread_writeback: 0,
            read_on_host: false,
            lost_by_plan: false,
            host_update_due: false,
            lent: false,
            kept: false,
        };
        st.entries.insert(id, entry);
        st.live_bytes += bytes;
        st.peak_live_bytes = st.peak_live_bytes.max(st.live_bytes);
        Ok(id)
    }

    /// A new tensor of `bytes` bytes with undefined contents.
    pub fn alloc(&self, name: &str, bytes: u64) -> Result<TensorId> {
        self.create(name, bytes, Contents::Undefined)
    }

    /// A new tensor whose bytes are all zero (cleared on the GPU when first placed there).
    pub fn alloc_zeroed(&self, name: &str, bytes: u64) -> Result<TensorId> {
        self.create(name, bytes, Contents::Zero)
    }

    /// Records the shape and element type of `id` for telemetry (the pager itself sees bytes).
    pub fn set_layout(&self, id: TensorId, shape: &[usize], dtype: DType) {
        if let Some(e) = self.state().entries.get_mut(&id) {
            e.layout = Some((shape.into(), dtype));
        }
    }

    /// Makes `id` resident for a kernel and pins it until the current op scope ends.
    pub fn access(&self, id: TensorId, access: Access) -> Result<View> {
        let start = Stopwatch::start();
        let view = self.access_timed(id, access);
        self.state().counters.access_s += start.seconds();
        view
    }

    fn access_timed(&self, id: TensorId, access: Access) -> Result<View> {
        let device = &self.gpu.device;
        let recorder = &*self.recorder;
        let mut st = self.state();
        st.clock += 1;
        let clock = st.clock;
        let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
        e.check_not_lent()?;
        let key = e.key;
        if st.in_step {
            st.trace.push(key);
            let pos = st.trace.len() - 1;
            if st.future.as_ref().is_some_and(|f| f.at(pos) != Some(key)) {
                st.diverged = true;
            }
        }
        {
            let e = st.entries.get_mut(&id).expect("checked");
            e.pins += 1;
            e.last_use = clock;
        }
        st.pinned.push(id);
        if st.entries[&id].gpu.is_some() {
            st.counters.hits += 1;
        } else {
            st.counters.misses += 1;
            // Only a tensor whose host bytes are coming wants a buffer created mapped.
            let needs_bytes = access != Access::Write && st.entries[&id].contents == Contents::Host;
            let taken = st.place(device, recorder, id, needs_bytes)?;
            if let Err(e) = st.fill(recorder, id, &taken, access == Access::Write) {
                st.pool.give(taken.region);
                return Err(e);
            }
            st.entries.get_mut(&id).expect("exists").gpu = Some(taken.region);
            st.resident.insert(id);
            st.prefetch(device, recorder)?;
        }
        st.prefill_ahead();
        let e = st.entries.get_mut(&id).expect("exists");
        if access.writes() {
            e.dirty = true;
            e.host_update_due = false;
        }
        let region = e.gpu.clone().expect("resident");
        Ok(View { buffer: region.buffer, offset: region.offset, size: e.copy_len(), dtype: DType::F32 })
    }

    /// Number of pins now held (for op scopes).
    pub fn pin_depth(&self) -> usize {
        self.state().pinned.len()
    }

    /// Unpins everything pinned after `depth` (deferred to the next use of the pager when it is
    /// busy, e.g. an op scope ending inside an `update_host` closure).
    pub fn unpin_to(&self, depth: usize) {
        match self.state.try_borrow_mut() {
            Ok(mut st) => st.unpin_to(depth),
            Err(_) => {
                if let Ok(mut d) = self.deferred.try_borrow_mut() {
                    d.unpin_to = Some(d.unpin_to.map_or(depth, |x| x.min(depth)));
                }
            }
        }
    }

    /// Marks the start of a training step: the last step's accesses become the prediction.
    /// Optional: every optimizer update ends a step ([`Pager::end_step`]), so a plain loop of
    /// forward, backward and `opt.step` is planned without it. Once called, the caller marks
    /// steps alone (the trainer does, to keep evaluations between steps out of the prediction).
    pub fn begin_step(&self) {
        let mut st = self.state();
        st.explicit_steps = true;
        st.new_step();
    }

    /// [`Pager::begin_step`] for a step the caller knows will not repeat the last one access for
    /// access (it changed what backward keeps or makes again): the last step's accesses are no
    /// prediction, so this step evicts, prefetches and drops write-backs as if it had diverged
    /// from its first access. Its own accesses plan the next step.
    pub fn begin_step_unlike_last(&self) {
        self.begin_step();
        self.state().diverged = true;
    }

    /// Marks the end of a training step; optimizers call it after each update. Ignored once
    /// [`Pager::begin_step`] is in use.
    pub fn end_step(&self) {
        let mut st = self.state();
        if !st.explicit_steps {
            st.new_step();
        }
    }

    /// Called when the last handle to `id` is dropped: its GPU buffer and host bytes are freed,
    /// with no write-back.
    pub(crate) fn release(&self, id: TensorId) {
        // While the pager is busy (the drop came from inside one of its calls, or a panic's
        // unwind), the release waits for its next use instead of panicking or leaking.
        match self.state.try_borrow_mut() {
            Ok(mut st) => st.release(id),
            Err(_) => {
                if let Ok(mut d) = self.deferred.try_borrow_mut() {
                    d.releases.push(id);
                }
            }
        }
    }

    pub fn name(&self, id: TensorId) -> String {
        self.state().entries.get(&id).map(|e| e.name.clone()).unwrap_or_default()
    }

    /// Changes the budget; tensors beyond it are evicted at their next placement.
    pub fn set_budget(&self, budget: u64) {
        self.state().pool.set_budget(budget);
    }

    pub fn set_policy(&self, policy: Policy) {
        self.state().policy = policy;
    }

    /// Frees cached GPU buffers that no tensor uses.
    pub fn trim(&self) {
        self.state().pool.trim();
    }

    /// Where tensor `id`'s bytes are in the host store (for tests that read the files).
    pub fn host_range(&self, id: TensorId) -> Option<HostRange> {
        self.state().entries.get(&id).map(|e| e.host)
    }

    pub fn describe_store(&self) -> String {
        self.state().store.describe()
    }
}
