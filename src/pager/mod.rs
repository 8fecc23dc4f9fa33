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
mod host;
pub mod plan;
mod pool;
mod report;
mod staging;
pub mod telemetry;
mod upload_path;

use std::cell::{RefCell, RefMut};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use copier::Copier;
#[cfg(not(target_arch = "wasm32"))]
pub use host::MmapStore;
pub use host::{HostRange, HostStore, MemStore};
pub use plan::{Key, Policy};
pub use pool::size_class;
use pool::{Pool, Taken};
pub use report::MemoryStats;
use staging::{Job, ReadbackRing, UploadRing};
pub use telemetry::{Counters, Location, Snapshot, StepTransfers, TensorInfo};
pub use upload_path::UploadPath;

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

/// What the host holds for a tensor that is not dirty on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contents {
    /// Never written: any bytes will do.
    Undefined,
    /// Logically zero: cleared on the GPU when placed there, never uploaded.
    Zero,
    /// The host bytes are the values.
    Host,
}

struct Entry {
    name: String,
    bytes: u64,
    host: HostRange,
    gpu: Option<wgpu::Buffer>,
    /// The GPU copy is newer than the host's.
    dirty: bool,
    contents: Contents,
    key: Key,
    last_use: u64,
    uploads: u32,
    pins: u32,
    /// A write-back of the only copy failed (the cause): the host bytes are stale, so every read
    /// is this error until the tensor is overwritten whole.
    lost: Option<String>,
    /// Shape and element type, for telemetry (set by the context that made the tensor).
    layout: Option<(Box<[usize]>, DType)>,
    /// Bytes written back since the host copy was last read (uploaded or read by the caller):
    /// counted as wasted if the tensor is freed first.
    unread_writeback: u64,
    /// The caller has read its host copy (`read`, `sync_to_host`, ...): never dropped unwritten.
    read_on_host: bool,
    /// `lost` because the plan dropped it unwritten (not a failure: `flush` does not report it).
    lost_by_plan: bool,
}

/// Why a dirty tensor was evicted without a write-back.
const DROPPED_BY_PLAN: &str = "not written back: the previous step freed it without reading it again, and this \
     step had matched that one access for access; a read now means the steps differ (call `begin_step` at each \
     step, or set `PagerOptions::drop_dead_writebacks` to false)";

/// What happened to a tensor whose write-back could not be delivered.
const LOST: &str = "its values are lost: reads fail until it is overwritten";
const KEPT: &str = "its values stay on the GPU and its next write-back tries again";

impl Entry {
    /// Bytes moved per transfer (copies are whole 4-byte words).
    fn copy_len(&self) -> u64 {
        self.bytes.max(4).div_ceil(4) * 4
    }

    /// The error every read of a lost tensor gets.
    fn check_lost(&self) -> Result<()> {
        match &self.lost {
            Some(cause) => Err(Error::WriteBack { tensor: self.name.clone(), cause: cause.clone(), fate: LOST }),
            None => Ok(()),
        }
    }

    /// A delivery of this tensor's write-back failed with `err`: the GPU copy, if still there, is
    /// again the only one (dirty); otherwise the values are gone and the tensor is marked lost.
    fn delivery_failed(&mut self, err: Error) -> Error {
        let cause = err.to_string();
        let fate = if self.gpu.is_some() {
            self.dirty = true;
            KEPT
        } else {
            self.lost = Some(cause.clone());
            LOST
        };
        Error::WriteBack { tensor: self.name.clone(), cause, fate }
    }
}

/// Sizes and rules of a pager.
#[derive(Clone, Debug)]
pub struct PagerOptions {
    /// GPU byte budget; `None`: from the device's memory ([`budget::auto_budget`]).
    pub budget: Option<u64>,
    pub policy: Policy,
    /// Most staging buffers for uploads and for write-backs, each `slot_bytes`; made as needed.
    /// A mapped upload ring on a discrete GPU (VRAM) stays within a quarter of the budget
    /// ([`budget::ring_slots`]).
    /// A tensor takes whole slots, so many small slots keep more tensors in flight: on an H200,
    /// GPT-2 (f16) at a quarter budget stepped in 1113 ms with 128 + 128 slots of 8 MiB, 1335 ms
    /// with 16 + 32 of 32 MiB, 1415 ms with 512 + 512 of 2 MiB.
    pub upload_slots: usize,
    pub readback_slots: usize,
    pub slot_bytes: u64,
    /// Accesses to look ahead for uploads.
    pub prefetch_window: usize,
    pub upload: UploadPath,
    /// Evict a dirty tensor without writing it back when the previous step freed it unread and
    /// it has no access left in this step (off: every dirty eviction is written back).
    pub drop_dead_writebacks: bool,
    /// Whether a synchronous call may block on the GPU (natively, yes). The browser cannot: a
    /// map completes only once control returns to it. Without blocking waits the pager waits
    /// only in its futures (`read`, `settle`), evicts a dirty tensor only when the step's plan
    /// says it is not used again before the step ends (its write-back lands at the next await),
    /// and a staging ring that is full grows or falls back to `queue.write_buffer`. Off natively
    /// for tests of the browser's behaviour.
    pub blocking_waits: bool,
}

impl PagerOptions {
    /// For the browser: no blocking waits (see [`PagerOptions::blocking_waits`]) and staging
    /// slots of 64 KiB (a tensor takes whole slots; the demo's tensors are small).
    pub fn browser(budget: Option<u64>) -> PagerOptions {
        PagerOptions {
            budget,
            upload_slots: 32,
            readback_slots: 32,
            slot_bytes: 64 << 10,
            blocking_waits: false,
            ..PagerOptions::default()
        }
    }
}

impl Default for PagerOptions {
    fn default() -> Self {
        PagerOptions {
            budget: None,
            policy: Policy::Belady,
            upload_slots: 128,
            readback_slots: 128,
            slot_bytes: 8 << 20,
            prefetch_window: 32,
            upload: UploadPath::Auto,
            drop_dead_writebacks: true,
            blocking_waits: !cfg!(target_arch = "wasm32"),
        }
    }
}

pub struct Pager {
    gpu: Rc<Gpu>,
    recorder: Rc<Recorder>,
    state: RefCell<State>,
    /// The upload path in use and why it was chosen.
    upload_choice: RefCell<(UploadPath, String)>,
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
    next_id: TensorId,
    pool: Pool,
    copier: Arc<Copier>,
    upload: UploadRing,
    readback: ReadbackRing,
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
}

/// Where a write-back job's bytes go in the host store (`None`: the tensor is gone). The range
/// stays the job's alone until it is finished: the pager settles a tensor's jobs before it reads,
/// writes or uploads its host bytes, and waits for its deliveries before freeing them.
/// A store that fails here leaves the tensor dirty on the GPU, or lost when it has left it.
fn host_target(
    store: &mut dyn HostStore,
    entries: &mut HashMap<TensorId, Entry>,
    job: Job,
) -> Result<Option<(*mut u8, usize)>> {
    let Some(e) = entries.get_mut(&job.tensor) else { return Ok(None) };
    let dst = store.bytes_mut(&e.host).map_err(|err| e.delivery_failed(err))?;
    let (a, b) = (job.offset as usize, ((job.offset + job.len) as usize).min(dst.len()));
    Ok(Some((dst[a..b].as_mut_ptr(), b - a)))
}

impl Drop for State {
    /// Background copies read and write the host store: they end before it goes.
    fn drop(&mut self) {
        self.upload.wait_fills();
        self.readback.wait_deliveries();
    }
}

impl State {
    fn drain(&mut self, recorder: &Recorder, wait: bool) -> Result<()> {
        let State { store, entries, readback, counters, .. } = self;
        counters.stall_s += readback.drain(recorder, wait, &mut |job| host_target(store.as_mut(), entries, job))?;
        Ok(())
    }

    /// Delivers the write-backs of `id` still in flight (and the older ones before them).
    fn settle(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        let State { store, entries, readback, counters, .. } = self;
        counters.stall_s +=
            readback.deliver_through(recorder, id, &mut |job| host_target(store.as_mut(), entries, job))?;
        Ok(())
    }

    /// Records the write-back of a dirty resident tensor (it stays resident, now clean).
    fn write_back(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        let (buffer, host, len, bytes) = {
            let e = &self.entries[&id];
            (e.gpu.clone().expect("resident"), e.host, e.copy_len(), e.bytes)
        };
        // Fail before anything moves if the host cannot take the bytes: the GPU copy stays.
        self.store.bytes_mut(&host)?;
        let State { store, entries, readback, counters, .. } = self;
        counters.stall_s +=
            readback.read(recorder, id, &buffer, 0, len, &mut |job| host_target(store.as_mut(), entries, job))?;
        counters.writebacks += 1;
        counters.bytes_written_back += bytes;
        let e = self.entries.get_mut(&id).expect("exists");
        e.unread_writeback += bytes;
        e.dirty = false;
        e.contents = Contents::Host;
        Ok(())
    }

    fn evict(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        if self.entries[&id].dirty && self.dead_by_plan(id) {
            let e = self.entries.get_mut(&id).expect("exists");
            e.dirty = false;
            e.contents = Contents::Undefined;
            e.lost = Some(DROPPED_BY_PLAN.into());
            e.lost_by_plan = true;
            self.counters.writeback_skipped_bytes += e.bytes;
        } else if self.entries[&id].dirty {
            self.write_back(recorder, id)?;
        }
        let e = self.entries.get_mut(&id).expect("exists");
        if let Some(buf) = e.gpu.take() {
            self.pool.give(buf);
        }
        self.counters.evictions += 1;
        Ok(())
    }

    /// Whether `id`'s values will never be read again, by the plan: it was made during the step,
    /// the previous step freed its counterpart without reading it on the host, the trace has
    /// matched so far, and no access to it is left in the step.
    fn dead_by_plan(&self, id: TensorId) -> bool {
        let e = &self.entries[&id];
        let Some(f) = self.future.as_ref().filter(|_| self.drop_dead_writebacks && !self.diverged && self.in_step)
        else {
            return false;
        };
        matches!(e.key, Key::Step(_))
            && !e.read_on_host
            && f.freed_unread(e.key)
            && f.next_use(e.key, self.trace.len().saturating_sub(1)) == u32::MAX
    }

    /// The plan says `key` is not used again before the step ends (without blocking waits, only
    /// such dirty tensors may leave: their write-backs are delivered at the step's end). Where
    /// this step went differently from the last, only a persistent tensor the last step never
    /// touched counts (the optimizer's moments in the first step that updates).
    fn done_this_step(&self, key: Key) -> bool {
        let Some(future) = self.future.as_ref().filter(|_| self.in_step) else { return false };
        if self.diverged {
            matches!(key, Key::Persistent(_)) && future.next_use(key, 0) == u32::MAX && future.at(0) != Some(key)
        } else {
            self.next_use(key).is_none()
        }
    }

    fn next_use(&self, key: Key) -> Option<u32> {
        let f = self.future.as_ref()?;
        let cursor = self.trace.len().saturating_sub(1);
        Some(f.next_use(key, cursor)).filter(|&n| n != u32::MAX)
    }

    /// A GPU buffer for `id`, evicting by the policy until the pool has room.
    fn place(&mut self, device: &wgpu::Device, recorder: &Recorder, id: TensorId, mapped: bool) -> Result<Taken> {
        let (name, bytes) = {
            let e = &self.entries[&id];
            (e.name.clone(), e.bytes)
        };
        loop {
            let oom = match self.pool.take(device, &name, bytes.max(4), mapped) {
                Ok(buf) => return Ok(buf),
                Err(Error::BudgetTooSmall { .. }) => None,
                Err(e @ Error::OutOfMemory { .. }) => {
                    // Cached free buffers hold driver memory the budget thought was there.
                    self.pool.trim();
                    Some(e)
                }
                Err(e) => return Err(e),
            };
            let candidates: Vec<(TensorId, plan::Candidate)> = self
                .entries
                .iter()
                .filter(|(_, e)| e.gpu.is_some() && e.pins == 0)
                .filter(|(_, e)| self.blocking_waits || !e.dirty || self.done_this_step(e.key))
                .map(|(&i, e)| {
                    (i, plan::Candidate { key: e.key, bytes: e.bytes, last_use: e.last_use, dirty: e.dirty })
                })
                .collect();
            let cands: Vec<plan::Candidate> = candidates.iter().map(|c| c.1).collect();
            let future = if self.diverged { None } else { self.future.as_ref() };
            let cursor = self.trace.len().saturating_sub(1);
            match plan::choose_victim(self.policy, future, cursor, &cands) {
                Some(v) => self.evict(recorder, candidates[v].0)?,
                None if oom.is_some() => return Err(oom.expect("checked")),
                None => {
                    let pinned: u64 = self
                        .entries
                        .values()
                        .filter(|e| e.pins > 0 && e.gpu.is_some())
                        .map(|e| size_class(e.bytes))
                        .sum();
                    return Err(Error::BudgetTooSmall {
                        tensor: name,
                        needed: pinned + size_class(bytes),
                        budget: self.pool.budget(),
                    });
                }
            }
        }
    }

    /// Gives a freshly placed buffer the tensor's contents (nothing when the kernel will
    /// `overwrite` it all), and unmaps a zero-copy buffer so kernels can use it.
    fn fill(&mut self, recorder: &Recorder, id: TensorId, taken: &Taken, overwrite: bool) -> Result<()> {
        self.settle(recorder, id)?;
        let e = self.entries.get_mut(&id).expect("exists");
        if overwrite {
            e.lost = None;
            e.lost_by_plan = false;
        } else if let Err(err) = e.check_lost() {
            if taken.mapped {
                taken.buffer.unmap();
            }
            return Err(err);
        }
        let e = &self.entries[&id];
        let len = e.copy_len();
        let result = match (overwrite, e.contents, taken.mapped) {
            (true, _, _) | (_, Contents::Undefined, _) => Ok(()),
            // A buffer created mapped starts zeroed.
            (_, Contents::Zero, true) => Ok(()),
            (_, Contents::Zero, false) => {
                recorder.record(|enc| enc.clear_buffer(&taken.buffer, 0, Some(len)));
                Ok(())
            }
            (_, Contents::Host, mapped) => self.upload(recorder, id, &taken.buffer, mapped),
        };
        if taken.mapped {
            taken.buffer.unmap();
        }
        result
    }

    /// Host bytes of `id` into `buffer`: written in place when it is mapped, else through the ring.
    fn upload(&mut self, recorder: &Recorder, id: TensorId, buffer: &wgpu::Buffer, mapped: bool) -> Result<()> {
        let e = &self.entries[&id];
        let len = e.copy_len() as usize;
        let src = &self.store.bytes(&e.host)?[..len];
        let start = Stopwatch::start();
        if mapped {
            let mut view = buffer
                .get_mapped_range_mut(0..len as u64)
                .map_err(|err| Error::Gpu { context: "zero-copy upload".into(), msg: err.to_string() })?;
            staging::fill_now(&self.copier, &mut view, src);
        } else {
            self.counters.stall_s += self.upload.upload(recorder, Some(id), src, buffer, 0)?;
        }
        self.counters.fill_s += start.seconds();
        self.counters.uploads += 1;
        self.counters.bytes_uploaded += e.bytes;
        let e = self.entries.get_mut(&id).expect("exists");
        e.uploads += 1;
        e.unread_writeback = 0;
        Ok(())
    }

    /// Frees `id`'s GPU buffer and host bytes, with no write-back.
    fn release(&mut self, id: TensorId) {
        if let Some(e) = self.entries.remove(&id) {
            // Background copies may still read or write its host bytes.
            self.readback.wait_deliveries_for(id);
            self.upload.wait_fills_for(&[id]);
            self.live_bytes -= e.bytes;
            self.counters.writeback_unread_bytes += e.unread_writeback;
            if self.in_step && matches!(e.key, Key::Step(_)) && !e.read_on_host {
                self.freed_unread.insert(e.key);
            }
            if let Some(buf) = e.gpu {
                self.pool.give(buf);
            }
            self.store.free(e.host);
        }
    }

    fn unpin_to(&mut self, depth: usize) {
        while self.pinned.len() > depth {
            let id = self.pinned.pop().expect("non-empty");
            if let Some(e) = self.entries.get_mut(&id) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// After the host bytes of `id` changed: its GPU copy is dropped, or, while an op in flight
    /// has it pinned, rewritten in place (recorded in program order, before the op's kernels).
    fn host_changed(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        let e = self.entries.get_mut(&id).expect("exists");
        e.contents = Contents::Host;
        e.dirty = false;
        e.lost = None;
        e.lost_by_plan = false;
        if e.pins == 0 {
            if let Some(buf) = e.gpu.take() {
                self.pool.give(buf);
            }
        } else if let Some(buf) = e.gpu.clone() {
            let (host, len) = (e.host, e.copy_len() as usize);
            let src = &self.store.bytes(&host)?[..len];
            self.counters.stall_s += self.upload.upload(recorder, Some(id), src, &buf, 0)?;
        }
        Ok(())
    }

    /// The accesses traced so far become the prediction for the next step.
    fn new_step(&mut self) {
        if let Some((clock, before)) = self.step_start.take() {
            self.last_step = Some(StepTransfers::between(&before, &self.counters, clock.seconds()));
        }
        self.step_start = Some((Stopwatch::start(), self.counters));
        let freed_unread = std::mem::take(&mut self.freed_unread);
        if self.in_step && !self.trace.is_empty() {
            let trace = std::mem::take(&mut self.trace);
            self.future = Some(plan::Future::new(trace).with_freed_unread(freed_unread));
        }
        self.trace.clear();
        self.in_step = true;
        self.step_ids.clear();
        self.diverged = false;
    }

    /// Uploads tensors the next accesses will read while there is free room (no evictions),
    /// and asks the OS to read their host pages ahead.
    fn prefetch(&mut self, device: &wgpu::Device, recorder: &Recorder) -> Result<()> {
        if self.diverged || self.prefetch_window == 0 {
            return Ok(());
        }
        let Some(future) = self.future.as_ref() else {
            return Ok(());
        };
        let cursor = self.trace.len();
        let wanted: Vec<TensorId> = (cursor..cursor + self.prefetch_window)
            .filter_map(|i| future.at(i))
            .filter_map(|key| match key {
                Key::Persistent(id) => Some(id),
                Key::Step(n) => self.step_ids.get(n as usize).copied(),
            })
            .collect();
        for id in wanted {
            let Some(e) = self.entries.get(&id) else {
                continue;
            };
            if e.gpu.is_some() || e.contents != Contents::Host || e.lost.is_some() || self.readback.has_jobs_for(id) {
                continue;
            }
            if !self.pool.fits_without_eviction(e.bytes.max(4)) {
                break;
            }
            self.store.will_need(&e.host);
            let taken = self.pool.take(device, &e.name.clone(), e.bytes.max(4), true)?;
            self.fill(recorder, id, &taken, false)?;
            self.entries.get_mut(&id).expect("exists").gpu = Some(taken.buffer);
            self.counters.prefetches += 1;
        }
        Ok(())
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
        let state = State {
            store,
            entries: HashMap::new(),
            next_id: 1,
            pool: Pool::new(budget),
            upload: UploadRing::new(&gpu.device, copier.clone(), upload_slots.1, slot_bytes, may_block),
            readback: ReadbackRing::new(&gpu.device, copier.clone(), opts.readback_slots.max(1), slot_bytes, may_block),
            copier,
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
        let device = &self.gpu.device;
        let recorder = &*self.recorder;
        let mut st = self.state();
        st.clock += 1;
        let clock = st.clock;
        let key = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?.key;
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
                st.pool.give(taken.buffer);
                return Err(e);
            }
            st.entries.get_mut(&id).expect("exists").gpu = Some(taken.buffer);
            st.prefetch(device, recorder)?;
        }
        let e = st.entries.get_mut(&id).expect("exists");
        if access.writes() {
            e.dirty = true;
        }
        let buffer = e.gpu.clone().expect("resident");
        Ok(View { buffer, offset: 0, size: e.copy_len(), dtype: DType::F32 })
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

    /// Overwrites a tensor's values from the host (any GPU copy is dropped).
    pub fn write(&self, id: TensorId, data: &[u8]) -> Result<()> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        st.settle(recorder, id)?;
        st.upload.wait_fills_for(&[id]);
        let (host, bytes) = {
            let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
            (e.host, e.bytes as usize)
        };
        if data.len() != bytes {
            return Err(Error::shape("tensor write", bytes, data.len()));
        }
        st.store.bytes_mut(&host)?[..bytes].copy_from_slice(data);
        st.host_changed(recorder, id)
    }

    /// Moves a tensor off the GPU now (written back first if dirty).
    pub fn evict(&self, id: TensorId) -> Result<()> {
        let mut st = self.state();
        match st.entries.get(&id) {
            Some(e) if e.gpu.is_some() && e.pins == 0 => st.evict(&self.recorder, id),
            Some(_) => Ok(()),
            None => Err(Error::invalid("tensor", format!("#{id} was released"))),
        }
    }

    /// Waits until every write-back recorded so far has landed in the host store.
    pub fn drain(&self) -> Result<()> {
        self.recorder.flush();
        self.state().drain(&self.recorder, true)
    }

    /// Sets a tensor to zero: a clear on the GPU if it is there, nothing at all otherwise.
    pub fn zero(&self, id: TensorId) -> Result<()> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        st.settle(recorder, id)?;
        let e = st.entries.get_mut(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
        if let Some(buf) = &e.gpu {
            let len = e.copy_len();
            recorder.record(|enc| enc.clear_buffer(buf, 0, Some(len)));
        }
        e.contents = Contents::Zero;
        e.dirty = false;
        e.lost = None;
        e.lost_by_plan = false;
        Ok(())
    }

    /// Runs `f` on the host bytes of `ids` (each trimmed to its tensor's size), which must hold
    /// their newest values (call `sync_to_host` first). Tensors in `written` (some of `ids`) are
    /// taken to be changed: their GPU copies are dropped, or rewritten when an op has them pinned.
    /// `f` runs while the pager is held: it must not call it (handles it drops are released, and
    /// op scopes it ends unpinned, at the pager's next use).
    pub fn update_host<R>(
        &self,
        ids: &[TensorId],
        written: &[TensorId],
        f: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> Result<R> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        if let Some(id) = written.iter().find(|id| !ids.contains(id)) {
            let name = st.entries.get(id).map_or(format!("#{id}"), |e| e.name.clone());
            return Err(Error::invalid("update_host", format!("`{name}` is written but not among the tensors given")));
        }
        let mut ranges = Vec::with_capacity(ids.len());
        for &id in ids {
            let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
            if (e.dirty && e.gpu.is_some()) || st.readback.has_jobs_for(id) {
                return Err(Error::invalid("update_host", format!("`{}` has newer values on the GPU", e.name)));
            }
            e.check_lost()?;
            let mut r = e.host;
            r.len = e.bytes as usize;
            ranges.push(r);
        }
        st.upload.wait_fills_for(ids);
        let zero: Vec<bool> = ids.iter().map(|id| st.entries[id].contents == Contents::Zero).collect();
        let mut slices = st.store.bytes_mut_many(&ranges)?;
        for (s, z) in slices.iter_mut().zip(zero) {
            if z {
                s.fill(0);
            }
        }
        let out = f(&mut slices);
        drop(slices);
        for id in ids {
            let e = st.entries.get_mut(id).expect("checked");
            e.contents = Contents::Host;
            e.unread_writeback = 0;
            e.read_on_host = true;
        }
        for &id in written {
            st.host_changed(recorder, id)?;
        }
        Ok(out)
    }

    /// A tensor's values when the host holds the newest copy (an error if the GPU does; use
    /// `read` then). For set-up code that runs before any kernel touched the tensor.
    pub fn read_now(&self, id: TensorId) -> Result<Vec<u8>> {
        let mut st = self.state();
        if let Some(e) = st.entries.get_mut(&id) {
            e.unread_writeback = 0;
            e.read_on_host = true;
        }
        let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
        if (e.dirty && e.gpu.is_some()) || st.readback.has_jobs_for(id) {
            return Err(Error::invalid("read_now", format!("`{}` has newer values on the GPU", e.name)));
        }
        e.check_lost()?;
        if e.contents == Contents::Zero {
            return Ok(vec![0; e.bytes as usize]);
        }
        Ok(st.store.bytes(&e.host)?[..e.bytes as usize].to_vec())
    }

    /// Records the write-back of every listed tensor whose newest copy is on the GPU and waits
    /// once for all of them, so reading many tensors costs one GPU round trip, not one each.
    pub fn sync_to_host(&self, ids: &[TensorId]) -> Result<()> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        let mut any = false;
        for &id in ids {
            let dirty = st.entries.get(&id).is_some_and(|e| e.dirty && e.gpu.is_some());
            if dirty {
                st.write_back(recorder, id)?;
            }
            any |= dirty || st.readback.has_jobs_for(id);
        }
        if any {
            recorder.flush();
            st.drain(recorder, true)?;
        }
        for id in ids {
            if let Some(e) = st.entries.get_mut(id) {
                e.unread_writeback = 0;
                e.read_on_host = true;
                e.check_lost()?;
            }
        }
        Ok(())
    }

    /// A tensor's values (waits for the GPU when its newest copy is there).
    pub async fn read(&self, id: TensorId) -> Result<Vec<u8>> {
        let recorder = &*self.recorder;
        let (dirty, contents, bytes, waits) = {
            let mut st = self.state();
            let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
            let (dirty, contents, bytes) = (e.dirty && e.gpu.is_some(), e.contents, e.bytes as usize);
            if dirty {
                st.write_back(recorder, id)?;
            }
            (dirty, contents, bytes, st.readback.map_waits(&self.recorder, Some(id)))
        };
        // The browser returns to its event loop here until the maps are done (natively these
        // block, as `settle` below would). No borrow of the state lives across the awaits.
        let start = Stopwatch::start();
        for wait in waits {
            wait.await?;
        }
        let mut st = self.state();
        st.counters.stall_s += start.seconds();
        st.settle(recorder, id)?;
        st.entries[&id].check_lost()?;
        let e = st.entries.get_mut(&id).expect("checked");
        e.unread_writeback = 0;
        e.read_on_host = true;
        // A rejected command (validation error) leaves stale bytes behind: say so instead.
        self.gpu.check("reading a tensor back")?;
        if contents == Contents::Zero && !dirty {
            return Ok(vec![0; bytes]);
        }
        let e = &st.entries[&id];
        Ok(st.store.bytes(&e.host)?[..bytes].to_vec())
    }

    /// Writes back every dirty tensor and flushes the host store: its files then hold every value.
    pub fn flush(&self) -> Result<()> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        let dirty: Vec<TensorId> =
            st.entries.iter().filter(|(_, e)| e.dirty && e.gpu.is_some()).map(|(&i, _)| i).collect();
        for id in dirty {
            st.write_back(recorder, id)?;
        }
        recorder.flush();
        st.drain(recorder, true)?;
        if let Some(e) = st.entries.values().find(|e| e.lost.is_some() && !e.lost_by_plan) {
            e.check_lost()?;
        }
        st.store.flush()
    }

    /// Waits for every transfer in flight and delivers every write-back: the step boundary of a
    /// run that cannot block (the browser), after which each staging slot is mapped again.
    pub async fn settle(&self) -> Result<()> {
        self.recorder.flush();
        let waits = {
            let st = self.state();
            let mut w = st.readback.map_waits(&self.recorder, None);
            w.extend(st.upload.map_waits(&self.recorder));
            w
        };
        let start = Stopwatch::start();
        for wait in waits {
            wait.await?;
        }
        let mut st = self.state();
        st.counters.stall_s += start.seconds();
        st.drain(&self.recorder, true)?;
        drop(st);
        self.gpu.check("settling transfers")
    }

    /// Delivers finished write-backs without waiting.
    pub fn poll(&self) -> Result<()> {
        self.state().drain(&self.recorder, false)
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
