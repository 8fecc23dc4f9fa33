//! Staging rings (`upload_ring.rs`, `readback_ring.rs`): reused mapped buffers that carry bytes between host memory and GPU buffers.
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
//!
//! This file holds what both rings share: a slot and its states, and the wait for its map.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;

use super::copier::Copier;
use crate::clock::Stopwatch;
use crate::error::{Error, Result};
use crate::recorder::Recorder;
#[cfg(vulkan_hal)]
use crate::vulkan_hal::{PinnedAllocator, PinnedBuffer};

pub use super::readback_ring::{Job, ReadbackRing};
pub use super::upload_ring::UploadRing;

/// Slot states (in an atomic: map callbacks may run on another thread).
pub(super) const IDLE: u8 = 0; // mapped and free (upload) / unmapped and free (readback)
pub(super) const RECORDED: u8 = 1; // used by a copy that is not yet submitted
pub(super) const MAPPING: u8 = 2; // map_async issued, not yet done
pub(super) const MAPPED: u8 = 3; // map done: ready to fill (upload) / to deliver (readback)
pub(super) const FAILED: u8 = 4;

/// Bytes of a slot made for a chunk of `n` bytes in a ring whose chunks are at most `largest`:
/// the next power of two, at least 1/128 of `largest` (64 KiB of 8 MiB) and 256 B. A ring of
/// `largest`-sized slots for a model of small tensors held up to 1 GiB each way.
pub(super) fn slot_bytes_for(n: u64, largest: u64) -> u64 {
    n.next_power_of_two().max((largest / 128).max(256)).min(largest).max(n)
}

/// The smallest of `slots` that is free (mapped, for uploads) and holds `n` bytes.
pub(super) fn smallest_free(slots: &[Rc<Slot>], n: u64, free: impl Fn(&Slot) -> bool) -> Option<usize> {
    (0..slots.len()).filter(|&i| free(&slots[i]) && slots[i].buffer.size() >= n).min_by_key(|&i| slots[i].buffer.size())
}

pub(super) struct Slot {
    pub(super) buffer: wgpu::Buffer,
    /// Pinned host memory (Vulkan): mapped for the slot's whole life, never by wgpu; it is free
    /// again when the GPU has finished the submission that read it, instead of when re-mapped.
    #[cfg(vulkan_hal)]
    pinned: Option<PinnedBuffer>,
    pub(super) state: Arc<AtomicU8>,
    submission: RefCell<Option<wgpu::SubmissionIndex>>,
    /// Woken when a map completes (what a [`MapWait`] waits on in the browser).
    waker: Arc<AtomicWaker>,
}

impl Slot {
    /// A slot in pinned host memory, ready to fill.
    #[cfg(vulkan_hal)]
    pub(super) fn pinned(alloc: &PinnedAllocator, label: &str, bytes: u64) -> Result<Rc<Slot>> {
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
    pub(super) fn pinned_ptr(&self) -> Option<*mut u8> {
        #[cfg(vulkan_hal)]
        return self.pinned.as_ref().map(|p| p.as_ptr());
        #[cfg(not(vulkan_hal))]
        None
    }

    pub(super) fn new(
        device: &wgpu::Device,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Rc<Slot> {
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

    pub(super) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// After the submission carrying this slot's copy: map it again in `mode`.
    pub(super) fn remap_after_submit(self: &Rc<Self>, recorder: &Recorder, mode: wgpu::MapMode) {
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
    pub(super) fn wait_mapped(&self, recorder: &Recorder, may_block: bool) -> Result<f64> {
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
    pub(super) fn pending(&self) -> bool {
        matches!(self.state(), RECORDED | MAPPING)
    }
}

/// A future that resolves when a staging slot's map is done (submitting its copy first if it is
/// still being recorded). Natively it blocks in `poll`, as the synchronous waits do; in the
/// browser it returns to the event loop until the map callback wakes it.
pub struct MapWait {
    pub(super) slot: Rc<Slot>,
    pub(super) recorder: Rc<Recorder>,
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
