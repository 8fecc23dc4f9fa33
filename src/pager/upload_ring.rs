//! The upload ring: `MAP_WRITE | COPY_SRC` buffers (or pinned host memory) filled on the copy
//! threads and copied into GPU buffers (see `staging.rs`).
//!
//! Slots may also be filled ahead ([`UploadRing::prefill`]): the plan names the tensors the next
//! accesses will read, and their bytes are copied into free slots before any pool buffer is
//! taken for them. When the access comes, only the GPU copy is recorded: the submission no
//! longer waits for a memcpy that started just before it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use super::copier::{Copier, Ticket};
use super::staging::{slot_bytes_for, smallest_free, MapWait, Slot, MAPPED};
use crate::clock::Stopwatch;
use crate::error::{Error, Result};
use crate::recorder::Recorder;
use crate::tensor::TensorId;
#[cfg(vulkan_hal)]
use crate::vulkan_hal::PinnedAllocator;

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
    /// The largest chunk; a slot is made the size of the first chunk it carries
    /// ([`slot_bytes_for`]).
    slot_bytes: u64,
    next: Cell<usize>,
    /// New slots come from pinned host memory (DMA uploads) instead of `MAP_WRITE` buffers.
    #[cfg(vulkan_hal)]
    pinned: Option<Rc<PinnedAllocator>>,
    /// False in the browser: no slot mapped means `queue.write_buffer`, not a wait.
    may_block: bool,
    /// Seconds submissions waited for the copy threads to finish filling slots (the fills'
    /// memcpy is then the bound: the GPU cannot start on the copies before it).
    fill_waits: Rc<Cell<f64>>,
    /// Slots filled ahead with a tensor's host bytes, waiting for its upload. They are out of
    /// `slots` meanwhile (nothing else fills or waits for them); `reserved` counts them.
    prefilled: RefCell<HashMap<TensorId, Vec<Filled>>>,
    reserved: Cell<usize>,
    /// Uploads served from slots filled ahead, and bytes filled ahead that were never used.
    prefill_hits: Cell<u64>,
    prefill_wasted: Cell<u64>,
}

/// A slot whose fill has started: the copy recorded from it must wait for `ticket`.
struct Filled {
    slot: Rc<Slot>,
    /// The slot's mapped range while it is being filled (`None`: pinned, always mapped).
    view: Option<wgpu::BufferViewMut>,
    ticket: Ticket,
    len: u64,
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
            fill_waits: Rc::new(Cell::new(0.0)),
            prefilled: RefCell::new(HashMap::new()),
            reserved: Cell::new(0),
            prefill_hits: Cell::new(0),
            prefill_wasted: Cell::new(0),
        }
    }

    /// Uploads served from slots filled ahead, and bytes filled ahead but never used (their
    /// tensor changed, was freed or was overwritten first).
    pub fn prefill_counts(&self) -> (u64, u64) {
        (self.prefill_hits.get(), self.prefill_wasted.get())
    }

    /// Seconds submissions have waited for slot fills so far.
    pub fn fill_waits_s(&self) -> f64 {
        self.fill_waits.get()
    }

    /// Makes the ring's slots pinned host memory from `alloc` (`None`: `MAP_WRITE` buffers).
    /// Every slot made so far is let go: the caller has submitted and waited for their copies.
    #[cfg(vulkan_hal)]
    pub fn set_pinned(&mut self, alloc: Option<Rc<PinnedAllocator>>) {
        self.discard_all_prefills();
        self.wait_fills();
        self.slots.borrow_mut().clear();
        self.next.set(0);
        self.pinned = alloc;
    }

    /// Lets the ring grow to `max` slots (fewer: the extra ones are let go; the caller has
    /// submitted and waited for their copies).
    pub fn set_max(&mut self, max: usize) {
        self.discard_all_prefills();
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

    /// A new slot for a chunk of `n` bytes, ready to fill.
    fn new_slot(&self, index: usize, n: u64) -> Result<Rc<Slot>> {
        let label = format!("upload ring {index}");
        let bytes = slot_bytes_for(n, self.slot_bytes);
        #[cfg(vulkan_hal)]
        if let Some(alloc) = &self.pinned {
            return Slot::pinned(alloc, &label, bytes);
        }
        let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
        Ok(Slot::new(&self.device, &label, bytes, usage, true))
    }

    /// A slot ready to fill with `n` bytes: the smallest mapped one that holds them, else a new
    /// one while below `max`, else a new one in place of a mapped one too small, else the next in
    /// turn (waited for, and remade larger if too small; `None` where the ring may not block).
    /// Returns it and the seconds waited.
    fn acquire(&self, recorder: &Recorder, n: u64) -> Result<Option<(Rc<Slot>, f64)>> {
        recorder.poll();
        let mut slots = self.slots.borrow_mut();
        if let Some(i) = smallest_free(&slots, n, |s| s.state() == MAPPED) {
            return Ok(Some((slots[i].clone(), 0.0)));
        }
        if slots.len() + self.reserved.get() < self.max {
            let slot = self.new_slot(slots.len() + self.reserved.get(), n)?;
            slots.push(slot.clone());
            return Ok(Some((slot, 0.0)));
        }
        if let Some(i) = slots.iter().position(|s| s.state() == MAPPED) {
            slots[i] = self.new_slot(i, n)?;
            return Ok(Some((slots[i].clone(), 0.0)));
        }
        if !self.may_block || slots.is_empty() {
            return Ok(None);
        }
        let i = self.next.get() % slots.len();
        let slot = slots[i].clone();
        self.next.set((i + 1) % slots.len());
        drop(slots);
        let waited = slot.wait_mapped(recorder, true)?;
        if slot.buffer.size() < n {
            let mut slots = self.slots.borrow_mut();
            slots[i] = self.new_slot(i, n)?;
            return Ok(Some((slots[i].clone(), waited)));
        }
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
        if let Some(filled) = owner.and_then(|o| self.prefilled.borrow_mut().remove(&o)) {
            if filled.iter().map(|f| f.len).sum::<u64>() == src.len() as u64 {
                self.prefill_hits.set(self.prefill_hits.get() + 1);
                for (i, f) in filled.into_iter().enumerate() {
                    self.reserved.set(self.reserved.get() - 1);
                    self.slots.borrow_mut().push(f.slot.clone());
                    self.record_copy(recorder, f, dst, dst_offset + i as u64 * self.slot_bytes);
                }
                return Ok(0.0);
            }
            self.give_back(filled);
        }
        let mut stalled = 0.0;
        for (i, chunk) in src.chunks(self.slot_bytes as usize).enumerate() {
            let offset = dst_offset + i as u64 * self.slot_bytes;
            let Some((slot, waited)) = self.acquire(recorder, chunk.len() as u64)? else {
                // The browser, every slot in flight: the queue's own staging. Its writes land
                // before the next submission, so what is recorded so far is submitted first.
                recorder.flush();
                recorder.gpu().queue.write_buffer(dst, offset, chunk);
                continue;
            };
            stalled += waited;
            let filled = self.start_fill(slot, owner, chunk)?;
            self.record_copy(recorder, filled, dst, offset);
        }
        Ok(stalled)
    }

    /// Starts copying `chunk` (host bytes of `owner`) into `slot`, which is mapped and free.
    fn start_fill(&self, slot: Rc<Slot>, owner: Option<TensorId>, chunk: &[u8]) -> Result<Filled> {
        let len = chunk.len() as u64;
        let (to, view) = match slot.pinned_ptr() {
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
        // held by `Filled`) stays mapped until the ticket has been waited for, and the slot is
        // not filled again before the GPU has read it (state MAPPED only then, and a slot filled
        // ahead is out of the ring until used); `chunk` is host-store memory that the pager
        // neither changes nor frees while fills are pending (it calls `wait_fills_for` first).
        let ticket = unsafe { self.copier.copy(to, chunk.as_ptr(), chunk.len()) };
        self.pending.borrow_mut().push((owner, ticket.clone()));
        Ok(Filled { slot, view, ticket, len })
    }

    /// Records the copy of a filled slot into `dst` at `offset`: the submission carrying it
    /// waits for the fill and unmaps the slot, and the slot is mapped again after it.
    fn record_copy(&self, recorder: &Recorder, filled: Filled, dst: &wgpu::Buffer, offset: u64) {
        let Filled { slot, mut view, ticket, len } = filled;
        recorder.record(|enc| enc.copy_buffer_to_buffer(&slot.buffer, 0, dst, offset, len));
        let (done, waits) = (slot.clone(), self.fill_waits.clone());
        recorder.before_submit(move || {
            let start = Stopwatch::start();
            ticket.wait();
            waits.set(waits.get() + start.seconds());
            if let Some(view) = view.take() {
                drop(view);
                done.buffer.unmap();
            }
        });
        slot.remap_after_submit(recorder, wgpu::MapMode::Write);
        recorder.staged(len);
    }

    /// Starts filling free slots with `src` (the host bytes of `owner`, length a multiple of 4),
    /// to be used by its next [`UploadRing::upload`]. Never waits, makes no slots and never takes
    /// more than half the ring, so uploads needed now always find slots; false when it did not
    /// fill (already filled, too few slots free, or a ring that may not block: the browser's).
    /// The host bytes must stay as they are until then, or be announced with
    /// [`UploadRing::wait_fills_for`].
    pub fn prefill(&self, owner: TensorId, src: &[u8]) -> Result<bool> {
        let chunks: Vec<&[u8]> = match src.len() {
            0 => vec![src],
            _ => src.chunks(self.slot_bytes as usize).collect(),
        };
        if !self.may_block || self.prefilled.borrow().contains_key(&owner) {
            return Ok(false);
        }
        if self.reserved.get() + chunks.len() > self.max / 2 {
            return Ok(false);
        }
        // Only slots that are free now and hold their chunk: the ring grows for uploads needed
        // now, not for these.
        let mut slots = self.slots.borrow_mut();
        let mut taken: Vec<Rc<Slot>> = Vec::with_capacity(chunks.len());
        for chunk in &chunks {
            let unused = |s: &Slot| s.state() == MAPPED && !taken.iter().any(|t| std::ptr::eq(&**t, s));
            let Some(i) = smallest_free(&slots, chunk.len() as u64, unused) else {
                return Ok(false);
            };
            taken.push(slots[i].clone());
        }
        slots.retain(|s| !taken.iter().any(|t| Rc::ptr_eq(t, s)));
        drop(slots);
        self.reserved.set(self.reserved.get() + taken.len());
        let mut filled = Vec::with_capacity(chunks.len());
        for (i, (slot, chunk)) in taken.iter().zip(&chunks).enumerate() {
            match self.start_fill(slot.clone(), Some(owner), chunk) {
                Ok(f) => filled.push(f),
                Err(e) => {
                    // The slots go back as they are (a failed one's map is the next user's error).
                    self.give_back(filled);
                    self.reserved.set(self.reserved.get() - (taken.len() - i));
                    self.slots.borrow_mut().extend(taken.into_iter().skip(i));
                    return Err(e);
                }
            }
        }
        self.prefilled.borrow_mut().insert(owner, filled);
        Ok(true)
    }

    /// Whether a slot may be filled ahead now (fewer than half the ring's are).
    pub fn can_prefill(&self) -> bool {
        self.may_block && self.reserved.get() < self.max / 2
    }

    /// Whether `owner`'s bytes are in slots filled ahead.
    pub fn is_prefilled(&self, owner: TensorId) -> bool {
        self.prefilled.borrow().contains_key(&owner)
    }

    /// Drops what was filled ahead for `owner` (its host bytes are about to change, or it was
    /// placed without them): the slots go back to the ring, still mapped.
    pub fn discard_prefill(&self, owner: TensorId) {
        let filled = self.prefilled.borrow_mut().remove(&owner);
        if let Some(filled) = filled {
            self.give_back(filled);
        }
    }

    fn discard_all_prefills(&self) {
        let all: Vec<_> = self.prefilled.borrow_mut().drain().collect();
        for (_, filled) in all {
            self.give_back(filled);
        }
    }

    /// Slots filled ahead and not used go back to the ring, mapped and free.
    fn give_back(&self, filled: Vec<Filled>) {
        for f in filled {
            f.ticket.wait();
            drop(f.view);
            self.prefill_wasted.set(self.prefill_wasted.get() + f.len);
            self.reserved.set(self.reserved.get() - 1);
            self.slots.borrow_mut().push(f.slot);
        }
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
        let prefilled = self.prefilled.borrow();
        let reserved = prefilled.values().flatten().map(|f| &f.slot);
        self.slots.borrow().iter().chain(reserved).map(|s| s.buffer.size()).sum()
    }

    /// Waits for the background fills reading the host bytes of `ids` (before they change or are
    /// freed), and drops what was filled ahead from them; others go on.
    pub fn wait_fills_for(&self, ids: &[TensorId]) {
        for &id in ids {
            self.discard_prefill(id);
        }
        for (_, t) in self.pending.borrow().iter().filter(|(owner, _)| owner.is_some_and(|o| ids.contains(&o))) {
            t.wait();
        }
    }
}
