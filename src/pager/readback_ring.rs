//! The readback ring: `MAP_READ | COPY_DST` buffers the GPU copies tensors into, delivered to
//! the host store on the copy threads once mapped (see `staging.rs`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::copier::{Copier, Ticket};
use super::staging::{slot_bytes_for, smallest_free, MapWait, Slot, IDLE, MAPPED};
use crate::clock::Stopwatch;
use crate::error::{Error, Result};
use crate::recorder::Recorder;
use crate::tensor::TensorId;

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
    /// The largest chunk; a slot is made the size of the first chunk it carries
    /// ([`slot_bytes_for`]).
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
            let slot = self.slot_for(n, recorder, target, &mut stalled)?;
            recorder.record(|enc| enc.copy_buffer_to_buffer(src, src_offset + done, &slot.buffer, 0, n));
            slot.remap_after_submit(recorder, wgpu::MapMode::Read);
            self.busy.borrow_mut().push_back(Busy { slot, job: Job { tensor, offset: done, len: n }, delivery: None });
            recorder.staged(n);
            done += n;
        }
        Ok(stalled)
    }

    /// A free slot of at least `n` bytes: one already free, else a new one while below `max` (or
    /// where the ring may not block), else one made in place of a free slot too small, else the
    /// oldest job's slot once it is finished (the seconds waited go to `stalled`).
    fn slot_for(&self, n: u64, recorder: &Recorder, target: Target, stalled: &mut f64) -> Result<Rc<Slot>> {
        loop {
            if let Some(slot) = self.take_free(n) {
                return Ok(slot);
            }
            self.reap()?;
            if let Some(slot) = self.take_free(n) {
                return Ok(slot);
            }
            if self.made.get() < self.max || !self.may_block {
                return Ok(self.new_slot(n));
            }
            // At its count: a free slot too small gives way to one that fits.
            if self.free.borrow_mut().pop().is_some() {
                self.made.set(self.made.get() - 1);
                return Ok(self.new_slot(n));
            }
            *stalled += self.finish_oldest(recorder, target)?;
        }
    }

    /// The smallest free slot that holds `n` bytes.
    fn take_free(&self, n: u64) -> Option<Rc<Slot>> {
        let mut free = self.free.borrow_mut();
        let i = smallest_free(&free, n, |_| true)?;
        Some(free.swap_remove(i))
    }

    fn new_slot(&self, n: u64) -> Rc<Slot> {
        let bytes = slot_bytes_for(n, self.slot_bytes);
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let slot = Slot::new(&self.device, &format!("readback ring {}", self.made.get()), bytes, usage, false);
        self.made.set(self.made.get() + 1);
        slot
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
        let busy = self.busy.borrow();
        self.free.borrow().iter().chain(busy.iter().map(|b| &b.slot)).map(|s| s.buffer.size()).sum()
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
