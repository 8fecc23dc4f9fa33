//! Staging rings: reused mapped buffers that carry bytes between host memory and GPU buffers.
//!
//! Upload: take a slot that is mapped for writing, start copying host bytes into it on the copy
//! threads ([`Copier`]), record `slot → GPU buffer`; just before the submission the copy is waited
//! for and the slot unmapped, after it the slot is re-mapped (`map_async`) and comes round again.
//! Readback: record `GPU buffer → slot`; after the submission the slot is mapped for reading and
//! its bytes are copied to the host store on the copy threads, while recording goes on.
//! No `queue.write_buffer` on this path: it allocates staging memory on every call.
//!
//! The browser cannot block: a map completes only once control returns to it. There (rings made
//! with `may_block: false`) a ring never waits inside a call: the upload ring falls back to
//! `queue.write_buffer` when no slot is mapped, the readback ring grows, and waits happen only in
//! [`MapWait`] futures the pager awaits at step boundaries and read-backs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;

use super::copier::{Copier, Ticket};
use crate::clock::Stopwatch;
use crate::error::{Error, Result};
use crate::recorder::Recorder;
use crate::tensor::TensorId;
#[cfg(vulkan_hal)]
use crate::vulkan_hal::{PinnedAllocator, PinnedBuffer};

/// Slot states (in an atomic: map callbacks may run on another thread).
const IDLE: u8 = 0; // mapped and free (upload) / unmapped and free (readback)
const RECORDED: u8 = 1; // used by a copy that is not yet submitted
const MAPPING: u8 = 2; // map_async issued, not yet done
const MAPPED: u8 = 3; // map done: ready to fill (upload) / to deliver (readback)
const FAILED: u8 = 4;

struct Slot {
    buffer: wgpu::Buffer,
    /// Pinned host memory (Vulkan): mapped for the slot's whole life, never by wgpu; it is free
    /// again when the GPU has finished the submission that read it, instead of when re-mapped.
    #[cfg(vulkan_hal)]
    pinned: Option<PinnedBuffer>,
    state: Arc<AtomicU8>,
    submission: RefCell<Option<wgpu::SubmissionIndex>>,
    /// Woken when a map completes (what a [`MapWait`] waits on in the browser).
    waker: Arc<AtomicWaker>,
}

impl Slot {
    /// A slot in pinned host memory, ready to fill.
    #[cfg(vulkan_hal)]
    fn pinned(alloc: &PinnedAllocator, label: &str, bytes: u64) -> Result<Rc<Slot>> {
        let pinned = alloc
            .create(label, bytes, wgpu::BufferUsages::COPY_SRC)
            .map_err(|msg| Error::Gpu { context: "pinned staging buffer".into(), msg })?;
        Ok(Rc::new(Slot {
            buffer: pinned.buffer.clone(),
            pinned: Some(pinned),
            state: Arc::new(AtomicU8::new(MAPPED)),
            submission: RefCell::new(None),
            waker: Arc::new(AtomicWaker::new()),
        }))
    }

    /// Where a fill of this slot writes, when it is pinned (else the caller maps it).
    fn pinned_ptr(&self) -> Option<*mut u8> {
        #[cfg(vulkan_hal)]
        return self.pinned.as_ref().map(|p| p.as_ptr());
        #[cfg(not(vulkan_hal))]
        None
    }

    fn new(device: &wgpu::Device, label: &str, bytes: u64, usage: wgpu::BufferUsages, mapped: bool) -> Rc<Slot> {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage,
            mapped_at_creation: mapped,
        });
        Rc::new(Slot {
            buffer,
            #[cfg(vulkan_hal)]
            pinned: None,
            state: Arc::new(AtomicU8::new(if mapped { MAPPED } else { IDLE })),
            submission: RefCell::new(None),
            waker: Arc::new(AtomicWaker::new()),
        })
    }

    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// After the submission carrying this slot's copy: map it again in `mode`.
    fn remap_after_submit(self: &Rc<Self>, recorder: &Recorder, mode: wgpu::MapMode) {
        self.state.store(RECORDED, Ordering::Release);
        let slot = self.clone();
        let queue = recorder.gpu().queue.clone();
        recorder.after_submit(move |index| {
            *slot.submission.borrow_mut() = Some(index.clone());
            slot.state.store(MAPPING, Ordering::Release);
            let (state, waker) = (slot.state.clone(), slot.waker.clone());
            if slot.pinned_ptr().is_some() {
                // Still mapped: reusable once the GPU has read it (work submitted so far done).
                queue.on_submitted_work_done(move || {
                    state.store(MAPPED, Ordering::Release);
                    waker.wake();
                });
            } else {
                slot.buffer.map_async(mode, .., move |r| {
                    state.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release);
                    waker.wake();
                });
            }
        });
    }

    /// Waits (submitting first if needed) until the slot's map completes; returns seconds waited.
    /// Without `may_block` (the browser) a map not done yet is an error, never a hang.
    fn wait_mapped(&self, recorder: &Recorder, may_block: bool) -> Result<f64> {
        if self.state() == RECORDED {
            recorder.flush();
        }
        let mut waited = 0.0;
        if self.state() == MAPPING {
            let start = Stopwatch::start();
            recorder.poll();
            if self.state() == MAPPING && !may_block {
                return Err(Error::Gpu {
                    context: "staging buffer".into(),
                    msg: "in the browser a buffer can only be waited for between steps, and this one was needed \
                          within a step (a tensor written back this step was read again): raise the GPU budget"
                        .into(),
                });
            }
            if self.state() == MAPPING {
                recorder.wait(self.submission.borrow().clone())?;
            }
            // The map callback runs in the poll after the submission is done.
            while self.state() == MAPPING {
                recorder.wait(None)?;
            }
            waited = start.seconds();
        }
        match self.state() {
            MAPPED => Ok(waited),
            FAILED => Err(Error::Gpu { context: "staging buffer".into(), msg: "map_async failed".into() }),
            s => Err(Error::Gpu { context: "staging buffer".into(), msg: format!("unexpected state {s}") }),
        }
    }

    /// Whether the slot is waiting for a submission or a map.
    fn pending(&self) -> bool {
        matches!(self.state(), RECORDED | MAPPING)
    }
}

/// A future that resolves when a staging slot's map is done (submitting its copy first if it is
/// still being recorded). Natively it blocks in `poll`, as the synchronous waits do; in the
/// browser it returns to the event loop until the map callback wakes it.
pub struct MapWait {
    slot: Rc<Slot>,
    recorder: Rc<Recorder>,
}

impl Future for MapWait {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if !cfg!(target_arch = "wasm32") {
            return Poll::Ready(self.slot.wait_mapped(&self.recorder, true).map(|_| ()));
        }
        if self.slot.state() == RECORDED {
            self.recorder.flush();
        }
        self.slot.waker.register(cx.waker());
        match self.slot.state() {
            MAPPING => Poll::Pending,
            _ => Poll::Ready(self.slot.wait_mapped(&self.recorder, false).map(|_| ())),
        }
    }
}

/// Copies `src` into a mapped buffer view (same length) on the copy threads, and waits.
pub fn fill_now(copier: &Copier, view: &mut wgpu::BufferViewMut, src: &[u8]) {
    let mut dst = view.slice(..);
    assert_eq!(dst.len(), src.len());
    let to = dst.as_raw_element_ptr();
    // SAFETY: the view is mapped and ours until the wait below returns; `src` is borrowed as long.
    unsafe { copier.copy(to.as_ptr(), src.as_ptr(), src.len()) }.wait();
}

/// Ring of `MAP_WRITE | COPY_SRC` buffers for uploads.
pub struct UploadRing {
    device: wgpu::Device,
    copier: Arc<Copier>,
    /// Fills not yet known to be done, by the tensor whose host bytes they read (those bytes must
    /// not change or be freed until then; `None`: the caller's own buffer, e.g. a probe).
    pending: RefCell<Vec<(Option<TensorId>, Ticket)>>,
    /// Grown on demand up to `max`: a ring that is busy gets another slot before anyone waits.
    slots: RefCell<Vec<Rc<Slot>>>,
    max: usize,
    slot_bytes: u64,
    next: Cell<usize>,
    /// New slots come from pinned host memory (DMA uploads) instead of `MAP_WRITE` buffers.
    #[cfg(vulkan_hal)]
    pinned: Option<Rc<PinnedAllocator>>,
    /// False in the browser: no slot mapped means `queue.write_buffer`, not a wait.
    may_block: bool,
}

impl UploadRing {
    pub fn new(device: &wgpu::Device, copier: Arc<Copier>, max: usize, slot_bytes: u64, may_block: bool) -> Self {
        UploadRing {
            device: device.clone(),
            copier,
            pending: RefCell::new(Vec::new()),
            slots: RefCell::new(Vec::new()),
            max: max.max(1),
            slot_bytes,
            next: Cell::new(0),
            #[cfg(vulkan_hal)]
            pinned: None,
            may_block,
        }
    }

    /// Makes the ring's slots pinned host memory from `alloc` (`None`: `MAP_WRITE` buffers).
    /// Every slot made so far is let go: the caller has submitted and waited for their copies.
    #[cfg(vulkan_hal)]
    pub fn set_pinned(&mut self, alloc: Option<Rc<PinnedAllocator>>) {
        self.wait_fills();
        self.slots.borrow_mut().clear();
        self.next.set(0);
        self.pinned = alloc;
    }

    /// Lets the ring grow to `max` slots (fewer: the extra ones are let go; the caller has
    /// submitted and waited for their copies).
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
        let mut slots = self.slots.borrow_mut();
        if slots.len() > self.max {
            slots.truncate(self.max);
            self.next.set(0);
        }
    }

    /// Whether the ring's slots are pinned host memory.
    pub fn is_pinned(&self) -> bool {
        #[cfg(vulkan_hal)]
        return self.pinned.is_some();
        #[cfg(not(vulkan_hal))]
        false
    }

    fn new_slot(&self, index: usize) -> Result<Rc<Slot>> {
        let label = format!("upload ring {index}");
        #[cfg(vulkan_hal)]
        if let Some(alloc) = &self.pinned {
            return Slot::pinned(alloc, &label, self.slot_bytes);
        }
        let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
        Ok(Slot::new(&self.device, &label, self.slot_bytes, usage, true))
    }

    /// A slot ready to fill: a mapped one, else a new one while below `max`, else the next in
    /// turn (waited for; `None` where the ring may not block). Returns it and the seconds waited.
    fn acquire(&self, recorder: &Recorder) -> Result<Option<(Rc<Slot>, f64)>> {
        recorder.poll();
        let mut slots = self.slots.borrow_mut();
        if let Some(slot) = slots.iter().find(|s| s.state() == MAPPED) {
            return Ok(Some((slot.clone(), 0.0)));
        }
        if slots.len() < self.max {
            let slot = self.new_slot(slots.len())?;
            slots.push(slot.clone());
            return Ok(Some((slot, 0.0)));
        }
        if !self.may_block {
            return Ok(None);
        }
        let slot = slots[self.next.get() % slots.len()].clone();
        self.next.set((self.next.get() + 1) % slots.len());
        drop(slots);
        let waited = slot.wait_mapped(recorder, true)?;
        Ok(Some((slot, waited)))
    }

    /// Waits for every slot still in flight (the browser's step boundary: the next step finds
    /// them mapped).
    pub fn map_waits(&self, recorder: &Rc<Recorder>) -> Vec<MapWait> {
        let slots = self.slots.borrow();
        slots.iter().filter(|s| s.pending()).map(|s| MapWait { slot: s.clone(), recorder: recorder.clone() }).collect()
    }

    /// Records the upload of `src` (length a multiple of 4, the host bytes of `owner`) into `dst`
    /// at `dst_offset`; the bytes are copied into staging in the background until the next
    /// submission. `src` must stay as it is until then (see [`UploadRing::wait_fills_for`]).
    /// Returns the seconds spent waiting for a free slot (a stall).
    pub fn upload(
        &self,
        recorder: &Recorder,
        owner: Option<TensorId>,
        src: &[u8],
        dst: &wgpu::Buffer,
        dst_offset: u64,
    ) -> Result<f64> {
        debug_assert!(src.len().is_multiple_of(4));
        self.pending.borrow_mut().retain(|(_, t)| !t.is_done());
        let mut stalled = 0.0;
        for (i, chunk) in src.chunks(self.slot_bytes as usize).enumerate() {
            let offset = dst_offset + i as u64 * self.slot_bytes;
            let Some((slot, waited)) = self.acquire(recorder)? else {
                // The browser, every slot in flight: the queue's own staging. Its writes land
                // before the next submission, so what is recorded so far is submitted first.
                recorder.flush();
                recorder.gpu().queue.write_buffer(dst, offset, chunk);
                continue;
            };
            stalled += waited;
            let len = chunk.len() as u64;
            let (to, mut view) = match slot.pinned_ptr() {
                Some(p) => (p, None),
                None => {
                    let mut view = slot
                        .buffer
                        .get_mapped_range_mut(0..len)
                        .map_err(|e| Error::Gpu { context: "upload ring".into(), msg: e.to_string() })?;
                    (view.slice(..).as_raw_element_ptr().as_ptr(), Some(view))
                }
            };
            // SAFETY: the view (or, pinned, the slot's own mapping, which lives as long as the slot,
            // held by the hook below) stays mapped until the hook has waited for the copy, and the
            // slot is not filled again before the GPU has read it (state MAPPED only then);
            // `chunk` is host-store memory that the pager neither changes nor frees while fills
            // are pending (it calls `wait_fills_for` first).
            let ticket = unsafe { self.copier.copy(to, chunk.as_ptr(), chunk.len()) };
            self.pending.borrow_mut().push((owner, ticket.clone()));
            recorder.record(|enc| enc.copy_buffer_to_buffer(&slot.buffer, 0, dst, offset, len));
            let filled = slot.clone();
            recorder.before_submit(move || {
                ticket.wait();
                if let Some(view) = view.take() {
                    drop(view);
                    filled.buffer.unmap();
                }
            });
            slot.remap_after_submit(recorder, wgpu::MapMode::Write);
            recorder.staged(len);
        }
        Ok(stalled)
    }

    /// Waits for every background fill: the host bytes they read may change after this.
    pub fn wait_fills(&self) {
        for (_, t) in self.pending.borrow_mut().drain(..) {
            t.wait();
        }
    }

    /// Whether a background fill reading the host bytes of `tensor` may still be running.
    pub fn has_fills_for(&self, tensor: TensorId) -> bool {
        self.pending.borrow().iter().any(|(owner, t)| *owner == Some(tensor) && !t.is_done())
    }

    /// Bytes of staging buffers made so far.
    pub fn held_bytes(&self) -> u64 {
        self.slots.borrow().len() as u64 * self.slot_bytes
    }

    /// Waits for the background fills reading the host bytes of `ids` (before they change or are
    /// freed); others go on.
    pub fn wait_fills_for(&self, ids: &[TensorId]) {
        for (_, t) in self.pending.borrow().iter().filter(|(owner, _)| owner.is_some_and(|o| ids.contains(&o))) {
            t.wait();
        }
    }
}

/// A chunk of a tensor on its way to the host.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    pub tensor: TensorId,
    /// Byte offset within the tensor.
    pub offset: u64,
    pub len: u64,
}

/// Where the pager wants a job's bytes: a pointer and a length (at most `job.len`), or `None`
/// to drop them (the tensor is gone). The memory must stay valid and untouched by anyone else
/// until the job is finished.
pub type Target<'a> = &'a mut dyn FnMut(Job) -> Result<Option<(*mut u8, usize)>>;

/// A slot holding a job, and its delivery once started.
struct Busy {
    slot: Rc<Slot>,
    job: Job,
    delivery: Option<(wgpu::BufferView, Ticket)>,
}

/// Ring of `MAP_READ | COPY_DST` buffers for write-backs and result reads.
pub struct ReadbackRing {
    device: wgpu::Device,
    copier: Arc<Copier>,
    /// Slots made so far (grown on demand up to `max`).
    made: Cell<usize>,
    max: usize,
    slot_bytes: u64,
    /// Slots holding a job, oldest first.
    busy: RefCell<VecDeque<Busy>>,
    free: RefCell<Vec<Rc<Slot>>>,
    /// False in the browser: a full ring grows (until the next step boundary frees it) instead
    /// of waiting.
    may_block: bool,
}

impl ReadbackRing {
    pub fn new(device: &wgpu::Device, copier: Arc<Copier>, max: usize, slot_bytes: u64, may_block: bool) -> Self {
        ReadbackRing {
            device: device.clone(),
            copier,
            made: Cell::new(0),
            max: max.max(1),
            free: RefCell::new(Vec::new()),
            slot_bytes,
            busy: RefCell::new(VecDeque::new()),
            may_block,
        }
    }

    /// Waits for the maps of the jobs up to the last one for `tensor` (every job for `None`).
    pub fn map_waits(&self, recorder: &Rc<Recorder>, tensor: Option<TensorId>) -> Vec<MapWait> {
        let busy = self.busy.borrow();
        let through = match tensor {
            Some(t) => busy.iter().rposition(|b| b.job.tensor == t).map_or(0, |i| i + 1),
            None => busy.len(),
        };
        busy.iter()
            .take(through)
            .filter(|b| b.slot.pending())
            .map(|b| MapWait { slot: b.slot.clone(), recorder: recorder.clone() })
            .collect()
    }

    /// Records copies of `src[src_offset..+len]` for `tensor` (chunked by slot size). Deliveries
    /// whose slots are mapped start in the background; when no slot is free, the oldest job is
    /// finished first. Returns seconds stalled.
    pub fn read(
        &self,
        recorder: &Recorder,
        tensor: TensorId,
        src: &wgpu::Buffer,
        src_offset: u64,
        len: u64,
        target: Target,
    ) -> Result<f64> {
        let mut stalled = 0.0;
        let mut done = 0;
        self.start_ready(recorder, target)?;
        while done < len {
            let n = (len - done).min(self.slot_bytes);
            if self.free.borrow().is_empty() {
                self.reap()?;
            }
            if self.free.borrow().is_empty() {
                if self.made.get() < self.max || !self.may_block {
                    let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
                    let slot = Slot::new(
                        &self.device,
                        &format!("readback ring {}", self.made.get()),
                        self.slot_bytes,
                        usage,
                        false,
                    );
                    self.made.set(self.made.get() + 1);
                    self.free.borrow_mut().push(slot);
                } else {
                    stalled += self.finish_oldest(recorder, target)?;
                }
            }
            let slot = self.free.borrow_mut().pop().expect("a slot was freed above");
            recorder.record(|enc| enc.copy_buffer_to_buffer(src, src_offset + done, &slot.buffer, 0, n));
            slot.remap_after_submit(recorder, wgpu::MapMode::Read);
            self.busy.borrow_mut().push_back(Busy { slot, job: Job { tensor, offset: done, len: n }, delivery: None });
            recorder.staged(n);
            done += n;
        }
        Ok(stalled)
    }

    /// Starts the delivery of `b` (its slot is mapped).
    fn start(&self, b: &mut Busy, target: Target) -> Result<()> {
        if b.delivery.is_some() {
            return Ok(());
        }
        let view = b
            .slot
            .buffer
            .get_mapped_range(0..b.job.len)
            .map_err(|e| Error::Gpu { context: "readback ring".into(), msg: e.to_string() })?;
        let ticket = match target(b.job) {
            // SAFETY: the view keeps the slot mapped until the ticket is done (`finish_oldest`,
            // `reap`); `target` vouches for the destination; `n <= job.len`, the view's length.
            Ok(Some((dst, n))) => unsafe { self.copier.copy(dst, view.as_ptr(), n.min(view.len())) },
            Ok(None) => Ticket::finished(),
            // Tried once: the pager has marked the tensor (dirty again, or lost), and the slot
            // goes back to the ring.
            Err(e) => {
                b.delivery = Some((view, Ticket::finished()));
                return Err(e);
            }
        };
        b.delivery = Some((view, ticket));
        Ok(())
    }

    /// Starts every delivery whose slot is mapped by now.
    fn start_ready(&self, recorder: &Recorder, target: Target) -> Result<()> {
        recorder.poll();
        for b in self.busy.borrow_mut().iter_mut() {
            if b.delivery.is_none() && b.slot.state() == MAPPED {
                self.start(b, target)?;
            }
        }
        Ok(())
    }

    /// Frees the slots of finished deliveries at the front of the ring.
    fn reap(&self) -> Result<()> {
        loop {
            let finished =
                matches!(self.busy.borrow().front(), Some(Busy { delivery: Some((_, t)), .. }) if t.is_done());
            if !finished {
                return Ok(());
            }
            let b = self.busy.borrow_mut().pop_front().expect("checked");
            self.release(b);
        }
    }

    fn release(&self, b: Busy) {
        drop(b.delivery);
        b.slot.buffer.unmap();
        b.slot.state.store(IDLE, Ordering::Release);
        self.free.borrow_mut().push(b.slot);
    }

    /// Waits for the oldest job's copy to the GPU, then for its delivery; frees its slot.
    fn finish_oldest(&self, recorder: &Recorder, target: Target) -> Result<f64> {
        let Some(mut b) = self.busy.borrow_mut().pop_front() else {
            return Ok(0.0);
        };
        let start = Stopwatch::start();
        let result = b.slot.wait_mapped(recorder, self.may_block).and_then(|_| self.start(&mut b, target));
        if let Some((_, ticket)) = &b.delivery {
            ticket.wait();
        }
        let waited = start.seconds();
        if b.delivery.is_some() || b.slot.state() == MAPPED {
            self.release(b);
        }
        result.map(|_| waited)
    }

    /// Finishes every job whose slot is mapped; with `wait`, every job (submitting and blocking as
    /// needed).
    pub fn drain(&self, recorder: &Recorder, wait: bool, target: Target) -> Result<f64> {
        self.start_ready(recorder, target)?;
        let mut stalled = 0.0;
        if wait {
            while !self.busy.borrow().is_empty() {
                stalled += self.finish_oldest(recorder, target)?;
            }
        } else {
            self.reap()?;
        }
        Ok(stalled)
    }

    /// Finishes jobs oldest first until none for `tensor` is left (later ones stay in flight).
    pub fn deliver_through(&self, recorder: &Recorder, tensor: TensorId, target: Target) -> Result<f64> {
        let mut stalled = 0.0;
        while self.has_jobs_for(tensor) {
            stalled += self.finish_oldest(recorder, target)?;
        }
        Ok(stalled)
    }

    /// Waits for the deliveries of `tensor` already under way (before its host bytes are freed;
    /// jobs not started yet find it gone and drop their bytes).
    pub fn wait_deliveries_for(&self, tensor: TensorId) {
        for b in self.busy.borrow().iter().filter(|b| b.job.tensor == tensor) {
            if let Some((_, ticket)) = &b.delivery {
                ticket.wait();
            }
        }
    }

    /// Waits for every delivery under way.
    pub fn wait_deliveries(&self) {
        for b in self.busy.borrow().iter() {
            if let Some((_, ticket)) = &b.delivery {
                ticket.wait();
            }
        }
    }

    /// Bytes of staging buffers made so far.
    pub fn held_bytes(&self) -> u64 {
        self.made.get() as u64 * self.slot_bytes
    }

    /// Whether bytes of `tensor` are still on their way to the host (copied or being delivered).
    pub fn in_flight_for(&self, tensor: TensorId) -> bool {
        self.busy
            .borrow()
            .iter()
            .any(|b| b.job.tensor == tensor && b.delivery.as_ref().is_none_or(|(_, t)| !t.is_done()))
    }

    /// Whether a job for `tensor` is still on its way.
    pub fn has_jobs_for(&self, tensor: TensorId) -> bool {
        self.busy.borrow().iter().any(|b| b.job.tensor == tensor)
    }
}
