//! Staging rings: reused mapped buffers that carry bytes between host memory and GPU buffers.
//!
//! Upload: take a slot that is mapped for writing, copy host bytes into it (several threads for
//! large copies), unmap, record `slot → GPU buffer`; after the submission the slot is re-mapped
//! (`map_async`) and comes round again. Readback: record `GPU buffer → slot`; after the
//! submission the slot is mapped for reading and its bytes are delivered to the host store.
//! No `queue.write_buffer` on this path: it allocates staging memory on every call.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::clock::Stopwatch;
use crate::error::{Error, Result};
use crate::recorder::Recorder;
use crate::tensor::TensorId;

/// Slot states (in an atomic: map callbacks may run on another thread).
const IDLE: u8 = 0; // mapped and free (upload) / unmapped and free (readback)
const RECORDED: u8 = 1; // used by a copy that is not yet submitted
const MAPPING: u8 = 2; // map_async issued, not yet done
const MAPPED: u8 = 3; // map done: ready to fill (upload) / to deliver (readback)
const FAILED: u8 = 4;

struct Slot {
    buffer: wgpu::Buffer,
    state: Arc<AtomicU8>,
    submission: RefCell<Option<wgpu::SubmissionIndex>>,
}

impl Slot {
    fn new(device: &wgpu::Device, label: &str, bytes: u64, usage: wgpu::BufferUsages, mapped: bool) -> Rc<Slot> {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage,
            mapped_at_creation: mapped,
        });
        Rc::new(Slot {
            buffer,
            state: Arc::new(AtomicU8::new(if mapped { MAPPED } else { IDLE })),
            submission: RefCell::new(None),
        })
    }

    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// After the submission carrying this slot's copy: map it again in `mode`.
    fn remap_after_submit(self: &Rc<Self>, recorder: &Recorder, mode: wgpu::MapMode) {
        self.state.store(RECORDED, Ordering::Release);
        let slot = self.clone();
        recorder.after_submit(move |index| {
            *slot.submission.borrow_mut() = Some(index.clone());
            slot.state.store(MAPPING, Ordering::Release);
            let state = slot.state.clone();
            slot.buffer
                .map_async(mode, .., move |r| state.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release));
        });
    }

    /// Waits (submitting first if needed) until the slot's map completes; returns seconds waited.
    fn wait_mapped(&self, recorder: &Recorder) -> Result<f64> {
        if self.state() == RECORDED {
            recorder.flush();
        }
        let mut waited = 0.0;
        if self.state() == MAPPING {
            let start = Stopwatch::start();
            recorder.poll();
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
}

/// Threads worth using for a copy of `len` bytes: one per MiB, at most 8 (one thread of memcpy
/// does not saturate the bus: 7 GB/s with 1, 25 GB/s with 4–8 on an H200 host).
#[cfg(not(target_arch = "wasm32"))]
fn copy_threads(len: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    (len >> 20).clamp(1, cores)
}

/// `dst.copy_from_slice(src)` on several threads when it is large (readback delivery).
pub fn copy_parallel(dst: &mut [u8], src: &[u8]) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = copy_threads(src.len());
        if threads > 1 {
            let chunk = src.len().div_ceil(threads).div_ceil(64) * 64;
            std::thread::scope(|s| {
                for (d, part) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                    s.spawn(move || d.copy_from_slice(part));
                }
            });
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// A pointer into mapped staging memory that worker threads may write through.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Clone, Copy)]
struct StagingPtr(std::ptr::NonNull<u8>);

// SAFETY: the pointer is only used inside `fill`'s thread scope, while the mapping is alive, and
// each thread writes a disjoint range.
#[cfg(not(target_arch = "wasm32"))]
unsafe impl Send for StagingPtr {}

/// Copies `src` into mapped staging memory, with several threads when it is large.
pub fn fill(mut dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = copy_threads(src.len());
        if threads > 1 {
            let base = StagingPtr(dst.as_raw_element_ptr());
            let chunk = src.len().div_ceil(threads).div_ceil(64) * 64;
            std::thread::scope(|s| {
                for (i, part) in src.chunks(chunk).enumerate() {
                    s.spawn(move || {
                        // Bind the whole wrapper: capturing only `base.0` would move a non-Send
                        // pointer into the thread.
                        let base = base;
                        // SAFETY: `dst` is a live write mapping of `src.len()` bytes; the chunks
                        // are disjoint and in bounds; bytes are written, never read.
                        unsafe {
                            std::ptr::copy_nonoverlapping(part.as_ptr(), base.0.as_ptr().add(i * chunk), part.len())
                        }
                    });
                }
            });
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// Ring of `MAP_WRITE | COPY_SRC` buffers for uploads.
pub struct UploadRing {
    device: wgpu::Device,
    /// Grown on demand up to `max`: a ring that is busy gets another slot before anyone waits.
    slots: RefCell<Vec<Rc<Slot>>>,
    max: usize,
    slot_bytes: u64,
    next: Cell<usize>,
}

impl UploadRing {
    pub fn new(device: &wgpu::Device, max: usize, slot_bytes: u64) -> Self {
        UploadRing {
            device: device.clone(),
            slots: RefCell::new(Vec::new()),
            max: max.max(1),
            slot_bytes,
            next: Cell::new(0),
        }
    }

    /// A slot ready to fill: a mapped one, else a new one while below `max`, else the next in
    /// turn (waited for). Returns it and the seconds waited.
    fn acquire(&self, recorder: &Recorder) -> Result<(Rc<Slot>, f64)> {
        recorder.poll();
        let mut slots = self.slots.borrow_mut();
        if let Some(slot) = slots.iter().find(|s| s.state() == MAPPED) {
            return Ok((slot.clone(), 0.0));
        }
        if slots.len() < self.max {
            let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
            let slot = Slot::new(&self.device, &format!("upload ring {}", slots.len()), self.slot_bytes, usage, true);
            slots.push(slot.clone());
            return Ok((slot, 0.0));
        }
        let slot = slots[self.next.get() % slots.len()].clone();
        self.next.set((self.next.get() + 1) % slots.len());
        drop(slots);
        let waited = slot.wait_mapped(recorder)?;
        Ok((slot, waited))
    }

    /// Records the upload of `src` (length a multiple of 4) into `dst` at `dst_offset`.
    /// Returns the seconds spent waiting for a free slot (a stall).
    pub fn upload(&self, recorder: &Recorder, src: &[u8], dst: &wgpu::Buffer, dst_offset: u64) -> Result<f64> {
        debug_assert!(src.len().is_multiple_of(4));
        let mut stalled = 0.0;
        for (i, chunk) in src.chunks(self.slot_bytes as usize).enumerate() {
            let (slot, waited) = self.acquire(recorder)?;
            stalled += waited;
            {
                let mut view = slot
                    .buffer
                    .get_mapped_range_mut(0..chunk.len() as u64)
                    .map_err(|e| Error::Gpu { context: "upload ring".into(), msg: e.to_string() })?;
                fill(view.slice(..), chunk);
            }
            slot.buffer.unmap();
            let offset = dst_offset + i as u64 * self.slot_bytes;
            recorder.record(|enc| enc.copy_buffer_to_buffer(&slot.buffer, 0, dst, offset, chunk.len() as u64));
            slot.remap_after_submit(recorder, wgpu::MapMode::Write);
            recorder.staged(chunk.len() as u64);
        }
        Ok(stalled)
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

/// Ring of `MAP_READ | COPY_DST` buffers for write-backs and result reads.
pub struct ReadbackRing {
    device: wgpu::Device,
    /// Slots made so far (grown on demand up to `max`).
    made: Cell<usize>,
    max: usize,
    slot_bytes: u64,
    /// Slots holding a job, oldest first.
    busy: RefCell<VecDeque<(Rc<Slot>, Job)>>,
    free: RefCell<Vec<Rc<Slot>>>,
}

impl ReadbackRing {
    pub fn new(device: &wgpu::Device, max: usize, slot_bytes: u64) -> Self {
        ReadbackRing {
            device: device.clone(),
            made: Cell::new(0),
            max: max.max(1),
            free: RefCell::new(Vec::new()),
            slot_bytes,
            busy: RefCell::new(VecDeque::new()),
        }
    }

    /// Records copies of `src[src_offset..+len]` for `tensor` (chunked by slot size). When no slot
    /// is free, the oldest job is delivered first through `deliver`. Returns seconds stalled.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        recorder: &Recorder,
        tensor: TensorId,
        src: &wgpu::Buffer,
        src_offset: u64,
        len: u64,
        deliver: &mut dyn FnMut(Job, &[u8]) -> Result<()>,
    ) -> Result<f64> {
        let mut stalled = 0.0;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(self.slot_bytes);
            if self.free.borrow().is_empty() {
                if self.made.get() < self.max {
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
                    stalled += self.deliver_oldest(recorder, deliver)?;
                }
            }
            let slot = self.free.borrow_mut().pop().expect("a slot was freed above");
            recorder.record(|enc| enc.copy_buffer_to_buffer(src, src_offset + done, &slot.buffer, 0, n));
            slot.remap_after_submit(recorder, wgpu::MapMode::Read);
            self.busy.borrow_mut().push_back((slot, Job { tensor, offset: done, len: n }));
            recorder.staged(n);
            done += n;
        }
        Ok(stalled)
    }

    fn deliver_oldest(&self, recorder: &Recorder, deliver: &mut dyn FnMut(Job, &[u8]) -> Result<()>) -> Result<f64> {
        let Some((slot, job)) = self.busy.borrow_mut().pop_front() else {
            return Ok(0.0);
        };
        let waited = slot.wait_mapped(recorder)?;
        let result = {
            let view = slot
                .buffer
                .get_mapped_range(0..job.len)
                .map_err(|e| Error::Gpu { context: "readback ring".into(), msg: e.to_string() })?;
            deliver(job, &view)
        };
        slot.buffer.unmap();
        slot.state.store(IDLE, Ordering::Release);
        self.free.borrow_mut().push(slot);
        result.map(|_| waited)
    }

    /// Delivers every finished job; with `wait`, every job (submitting and blocking as needed).
    pub fn drain(
        &self,
        recorder: &Recorder,
        wait: bool,
        deliver: &mut dyn FnMut(Job, &[u8]) -> Result<()>,
    ) -> Result<f64> {
        let mut stalled = 0.0;
        if !wait {
            recorder.poll();
        }
        loop {
            let ready = match self.busy.borrow().front() {
                None => break,
                Some((slot, _)) => wait || slot.state() == MAPPED,
            };
            if !ready {
                break;
            }
            stalled += self.deliver_oldest(recorder, deliver)?;
        }
        Ok(stalled)
    }

    /// Delivers jobs oldest first until none for `tensor` is left (later ones stay in flight).
    pub fn deliver_through(
        &self,
        recorder: &Recorder,
        tensor: TensorId,
        deliver: &mut dyn FnMut(Job, &[u8]) -> Result<()>,
    ) -> Result<f64> {
        let mut stalled = 0.0;
        while self.has_jobs_for(tensor) {
            stalled += self.deliver_oldest(recorder, deliver)?;
        }
        Ok(stalled)
    }

    /// Whether a job for `tensor` is still on its way.
    pub fn has_jobs_for(&self, tensor: TensorId) -> bool {
        self.busy.borrow().iter().any(|(_, j)| j.tensor == tensor)
    }
}
