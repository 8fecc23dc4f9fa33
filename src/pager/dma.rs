//! Copies between a pinned host store and GPU buffers with no staging: the GPU moves the bytes by
//! DMA inside the command stream (`copy_buffer_to_buffer` from or into the store's own buffer),
//! so no copy thread touches them. The host bytes such a copy reads or writes belong to the GPU
//! until the submission carrying it is done: this keeps, per tensor, the copies not yet known to
//! be done, for the pager to wait on before the CPU reads or changes those bytes, and holds back
//! the freeing of a host range until the copies using it are done.
//!
//! GPU-side order needs no waits: wgpu orders copies and kernels touching the same buffers.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::host::HostRange;
use crate::clock::Stopwatch;
use crate::error::Result;
use crate::recorder::Recorder;
use crate::tensor::TensorId;

/// The copies recorded for one submission: done when the GPU has finished it.
struct Batch {
    done: Arc<AtomicBool>,
    submission: RefCell<Option<wgpu::SubmissionIndex>>,
}

impl Batch {
    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Submits (if still being recorded) and blocks until the GPU is done with it.
    fn wait(&self, recorder: &Recorder) -> Result<()> {
        if self.is_done() {
            return Ok(());
        }
        if self.submission.borrow().is_none() {
            recorder.flush();
        }
        let index = self.submission.borrow().clone();
        recorder.wait(index)?;
        // The done callback runs in the poll after the submission is done.
        while !self.is_done() {
            recorder.wait(None)?;
        }
        Ok(())
    }
}

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Host store → GPU buffer (the store's bytes are read).
    Up,
    /// GPU buffer → host store (the store's bytes are written).
    Down,
}

struct Copy {
    dir: Dir,
    batch: Rc<Batch>,
}

/// Direct copies in flight, and host ranges waiting for theirs to finish before they are freed.
#[derive(Default)]
pub struct DmaCopies {
    /// Per tensor, so the pager's per-access checks look at that tensor's copies only (a list of
    /// every copy was the pager's top symbol on lavapipe, zero-copy, where every upload is one).
    copies: RefCell<HashMap<TensorId, Vec<Copy>>>,
    /// The batch of the submission being recorded (taken by its after-submit hook).
    recording: Rc<RefCell<Option<Rc<Batch>>>>,
    frees: RefCell<Vec<(HostRange, Vec<Rc<Batch>>)>>,
}

impl DmaCopies {
    /// Records a copy of `len` bytes for `tensor` (offsets and length multiples of 4).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        recorder: &Recorder,
        tensor: TensorId,
        dir: Dir,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        len: u64,
    ) {
        recorder.record(|enc| enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, len));
        let batch = self.recording.borrow().clone();
        let batch = batch.unwrap_or_else(|| {
            let batch = Rc::new(Batch { done: Arc::new(AtomicBool::new(false)), submission: RefCell::new(None) });
            *self.recording.borrow_mut() = Some(batch.clone());
            let (recording, b) = (self.recording.clone(), batch.clone());
            let queue = recorder.gpu().queue.clone();
            recorder.after_submit(move |index| {
                recording.borrow_mut().take();
                *b.submission.borrow_mut() = Some(index.clone());
                let done = b.done.clone();
                queue.on_submitted_work_done(move || done.store(true, Ordering::Release));
            });
            batch
        });
        self.copies.borrow_mut().entry(tensor).or_default().push(Copy { dir, batch });
        // Submits once enough bytes are pending, so the GPU starts on them while we record on.
        recorder.copied_direct(len);
    }

    /// Forgets the copies known to be done.
    pub fn reap(&self) {
        self.copies.borrow_mut().retain(|_, copies| {
            copies.retain(|c| !c.batch.is_done());
            !copies.is_empty()
        });
    }

    /// Whether a copy of `tensor`'s host bytes may still be under way (in `dir`, or either way).
    pub fn busy(&self, tensor: TensorId, dir: Option<Dir>) -> bool {
        let copies = self.copies.borrow();
        let Some(copies) = copies.get(&tensor) else { return false };
        copies.iter().any(|c| dir.is_none_or(|d| d == c.dir) && !c.batch.is_done())
    }

    /// Blocks until the copies of `tensor` (every copy, for `None`) are done; returns seconds
    /// waited.
    pub fn wait(&self, recorder: &Recorder, tensor: Option<TensorId>) -> Result<f64> {
        let batches: Vec<Rc<Batch>> = match tensor {
            Some(t) => self.pending_batches(t),
            None => self
                .copies
                .borrow()
                .values()
                .flatten()
                .filter(|c| !c.batch.is_done())
                .map(|c| c.batch.clone())
                .collect(),
        };
        if batches.is_empty() {
            return Ok(0.0);
        }
        let start = Stopwatch::start();
        for b in batches {
            b.wait(recorder)?;
        }
        self.reap();
        Ok(start.seconds())
    }

    /// `range` (the host bytes of `tensor`, released) if no copy uses it any more; else it is
    /// held back until they are done (see [`DmaCopies::ready_frees`]) and `None` returned.
    pub fn free_when_done(&self, range: HostRange, tensor: TensorId) -> Option<HostRange> {
        let batches = self.pending_batches(tensor);
        if batches.is_empty() {
            return Some(range);
        }
        self.frees.borrow_mut().push((range, batches));
        None
    }

    /// The batches of `tensor`'s copies not known to be done.
    fn pending_batches(&self, tensor: TensorId) -> Vec<Rc<Batch>> {
        let copies = self.copies.borrow();
        let Some(copies) = copies.get(&tensor) else { return Vec::new() };
        copies.iter().filter(|c| !c.batch.is_done()).map(|c| c.batch.clone()).collect()
    }

    /// Host ranges held back whose copies are done by now: free to reuse.
    pub fn ready_frees(&self) -> Vec<HostRange> {
        let mut frees = self.frees.borrow_mut();
        let mut ready = Vec::new();
        frees.retain(|(range, batches)| {
            let done = batches.iter().all(|b| b.is_done());
            if done {
                ready.push(*range);
            }
            !done
        });
        ready
    }
}
