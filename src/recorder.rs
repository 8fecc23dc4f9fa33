//! The pending command encoder that kernels and the pager record into, in one order: copies the
//! pager issues for a kernel land before it, and write-backs after the kernels that wrote the
//! tensor. `flush` runs the hooks that must come before a submission (background fills of
//! staging slots are waited for, the slots unmapped), submits everything, and then runs the hooks
//! waiting for a submission (the staging rings re-map their buffers there).
//!
//! Consecutive dispatches go into one compute pass (wgpu still puts the barriers each needs
//! between them); a copy or clear ends it, and the next dispatch opens another. A pass per
//! dispatch cost the small models more CPU time than their kernels took on the GPU.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::clock::Stopwatch;
use crate::device::Gpu;

/// Bytes of each kernel's uniform slot in the arena (also the bound size of the uniform).
pub const UNIFORM_SLOT: u64 = 256;
const ARENA_SLOTS: u64 = 4096;
/// Recorded commands after which work is submitted, so the GPU starts while the CPU records on.
const SUBMIT_EVERY: u64 = 96;
/// After the host waited for the GPU to finish everything (a step's end reading the norm), the
/// GPU is idle: the first submission then goes after this many commands, and each next one after
/// twice as many as the last, up to [`SUBMIT_EVERY`]. Each submission's kernels then cover the
/// recording of the next, instead of the GPU waiting for 96 to be recorded (at a step's end: the
/// optimizer's update and the next forward's first layers, with host work between).
const SUBMIT_FIRST_AFTER_DRAIN: u64 = 4;
/// Staged transfer bytes after which work is submitted: a staging ring many times this size then
/// never waits for the submission still being recorded (which would drain the GPU), only for
/// older ones.
const SUBMIT_BYTES: u64 = 64 << 20;
/// Bytes of direct copies (DMA from or to a pinned store: no staging slot to recycle) after which
/// work is submitted, so the GPU starts on them; `PAGETRAIN_DMA_SUBMIT_MIB` sets it, for measuring.
fn direct_submit_bytes() -> u64 {
    std::env::var("PAGETRAIN_DMA_SUBMIT_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(SUBMIT_BYTES, |m| m.max(1) << 20)
}

/// Records a clear as a dispatch in the open compute pass (`kernels::fill`); false when it cannot
/// bind the range (the recorder then records `clear_buffer`).
pub trait Clearer {
    fn clear(&self, recorder: &Recorder, buffer: &wgpu::Buffer, offset: u64, len: u64) -> bool;
}

type Hook = Box<dyn FnOnce(&wgpu::SubmissionIndex)>;
type PreHook = Box<dyn FnOnce()>;
type PassCommand = Box<dyn FnOnce(&mut wgpu::ComputePass<'static>)>;

pub struct Recorder {
    gpu: Rc<Gpu>,
    /// The open compute pass over `encoder` (which is locked while it lives: `record` ends it).
    /// Declared first so that it is dropped before the encoder.
    pass: RefCell<Option<wgpu::ComputePass<'static>>>,
    encoder: RefCell<Option<wgpu::CommandEncoder>>,
    passes: Cell<u64>,
    /// Dispatches waiting for a pipeline still compiling on a worker, and every dispatch after
    /// them (order is kept): encoded when the pass ends, so a step's new pipelines compile in
    /// parallel instead of one after the other.
    deferred: RefCell<Vec<PassCommand>>,
    deferred_count: Cell<u64>,
    clearer: RefCell<Option<Rc<dyn Clearer>>>,
    uniforms: RefCell<Vec<u8>>,
    arena: wgpu::Buffer,
    before_submit: RefCell<Vec<PreHook>>,
    /// Host seconds in submissions (their hooks included: the waits for fills) and in polls of
    /// the device, for the `bench --budget` breakdown.
    submit_s: Cell<f64>,
    poll_s: Cell<f64>,
    after_submit: RefCell<Vec<Hook>>,
    commands: Cell<u64>,
    /// Commands after which `maybe_submit` submits now ([`SUBMIT_FIRST_AFTER_DRAIN`]).
    submit_after: Cell<u64>,
    staged_bytes: Cell<u64>,
    direct_bytes: Cell<u64>,
    direct_submit_bytes: u64,
    submissions: Cell<u64>,
    /// Pool buffers dropped so far (kept bind groups holding them are let go: `kernels::bindings`).
    retired: Rc<Cell<u64>>,
    /// The pool's tensors share buffers (`pager/slabs.rs`).
    tensors_share_buffers: Cell<bool>,
}

impl Recorder {
    pub fn new(gpu: Rc<Gpu>) -> Self {
        let arena = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("uniform arena"),
            size: UNIFORM_SLOT * ARENA_SLOTS,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Recorder {
            gpu,
            encoder: RefCell::new(None),
            pass: RefCell::new(None),
            passes: Cell::new(0),
            deferred: RefCell::new(Vec::new()),
            deferred_count: Cell::new(0),
            clearer: RefCell::new(None),
            uniforms: RefCell::new(Vec::new()),
            arena,
            before_submit: RefCell::new(Vec::new()),
            submit_s: Cell::new(0.0),
            poll_s: Cell::new(0.0),
            after_submit: RefCell::new(Vec::new()),
            commands: Cell::new(0),
            submit_after: Cell::new(SUBMIT_EVERY),
            staged_bytes: Cell::new(0),
            direct_bytes: Cell::new(0),
            direct_submit_bytes: direct_submit_bytes(),
            submissions: Cell::new(0),
            retired: Rc::new(Cell::new(0)),
            tensors_share_buffers: Cell::new(false),
        }
    }

    pub fn gpu(&self) -> &Rc<Gpu> {
        &self.gpu
    }

    /// Runs `f` on the pending encoder (ending the open compute pass first).
    pub fn record<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
        self.end_pass();
        let mut enc = self.encoder.borrow_mut();
        let device = &self.gpu.device;
        let encoder = enc.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("pagetrain") })
        });
        self.commands.set(self.commands.get() + 1);
        f(encoder)
    }

    /// Runs `f` on the open compute pass, opening one after the last copy or clear if needed
    /// (later, in order, while an earlier dispatch is deferred).
    pub fn dispatch(&self, f: impl FnOnce(&mut wgpu::ComputePass<'static>) + 'static) {
        self.commands.set(self.commands.get() + 1);
        let mut deferred = self.deferred.borrow_mut();
        if deferred.is_empty() {
            drop(deferred);
            self.with_pass(f);
        } else {
            deferred.push(Box::new(f));
        }
    }

    /// Records `f` into the pass when the pass ends (`f` may wait there for a pipeline compiling
    /// on a worker); dispatches after it follow it.
    pub fn dispatch_deferred(&self, f: impl FnOnce(&mut wgpu::ComputePass<'static>) + 'static) {
        self.commands.set(self.commands.get() + 1);
        self.deferred_count.set(self.deferred_count.get() + 1);
        self.deferred.borrow_mut().push(Box::new(f));
    }

    fn with_pass(&self, f: impl FnOnce(&mut wgpu::ComputePass<'static>)) {
        let mut pass = self.pass.borrow_mut();
        if pass.is_none() {
            let mut enc = self.encoder.borrow_mut();
            let device = &self.gpu.device;
            let encoder = enc.get_or_insert_with(|| {
                device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("pagetrain") })
            });
            let p = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            *pass = Some(p.forget_lifetime());
            self.passes.set(self.passes.get() + 1);
        }
        f(pass.as_mut().expect("opened above"))
    }

    /// Sets what records clears inside the compute pass (the kernels do, when they are made).
    pub fn set_clearer(&self, clearer: Rc<dyn Clearer>) {
        *self.clearer.borrow_mut() = Some(clearer);
    }

    /// Zeroes `len` bytes of `buffer` from `offset`, in order with everything recorded: a fill
    /// dispatch in the open pass where the clearer can bind the range, else `clear_buffer`.
    pub fn clear(&self, buffer: &wgpu::Buffer, offset: u64, len: u64) {
        let clearer = self.clearer.borrow().clone();
        if clearer.is_some_and(|c| c.clear(self, buffer, offset, len)) {
            return;
        }
        self.record(|enc| enc.clear_buffer(buffer, offset, Some(len)));
    }

    /// Ends the open compute pass (its commands, deferred ones included, go into the encoder).
    fn end_pass(&self) {
        let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
        for f in deferred {
            self.with_pass(f);
        }
        drop(self.pass.borrow_mut().take());
    }

    /// Stores a dispatch's uniforms in the arena and records it with their offset (`f`'s second
    /// argument), nothing between: each submission rewrites the arena from its start, so an
    /// offset is only good until the next one. `wait_for_pipeline`: record it as
    /// [`Recorder::dispatch_deferred`] does, else as [`Recorder::dispatch`].
    pub fn dispatch_with_uniforms(
        &self,
        bytes: &[u8],
        wait_for_pipeline: bool,
        f: impl FnOnce(&mut wgpu::ComputePass<'static>, u32) + 'static,
    ) {
        let offset = self.uniform(bytes) as u32;
        let record = move |pass: &mut wgpu::ComputePass<'static>| f(pass, offset);
        if wait_for_pipeline {
            self.dispatch_deferred(record);
        } else {
            self.dispatch(record);
        }
    }

    /// Stores a kernel's uniforms for the next submission; returns their offset in the arena.
    /// Submits first when the arena is full.
    fn uniform(&self, bytes: &[u8]) -> u64 {
        debug_assert!(bytes.len() as u64 <= UNIFORM_SLOT);
        if self.uniforms.borrow().len() as u64 >= UNIFORM_SLOT * ARENA_SLOTS {
            self.flush();
        }
        let mut u = self.uniforms.borrow_mut();
        let offset = u.len() as u64;
        u.extend_from_slice(bytes);
        u.resize((offset + UNIFORM_SLOT) as usize, 0);
        offset
    }

    /// Runs `hook` just before the commands recorded so far are submitted (a staging slot still
    /// being filled in the background is waited for and unmapped there).
    pub fn before_submit(&self, hook: impl FnOnce() + 'static) {
        self.before_submit.borrow_mut().push(Box::new(hook));
    }

    /// Runs `hook` with the index of the submission that carries the commands recorded so far.
    pub fn after_submit(&self, hook: impl FnOnce(&wgpu::SubmissionIndex) + 'static) {
        self.after_submit.borrow_mut().push(Box::new(hook));
    }

    /// Submits when enough commands are pending that the GPU should start on them.
    pub fn maybe_submit(&self) {
        if self.commands.get() >= self.submit_after.get() {
            self.flush();
        }
    }

    /// The host has just waited for everything submitted (nothing is recorded since): the GPU
    /// is idle, and the next submissions start small ([`SUBMIT_FIRST_AFTER_DRAIN`]).
    pub fn drained(&self) {
        if self.commands.get() == 0 {
            self.submit_after.set(SUBMIT_FIRST_AFTER_DRAIN);
        }
    }

    /// Counts `bytes` of staged copies just recorded; submits once enough are pending.
    pub fn staged(&self, bytes: u64) {
        self.staged_bytes.set(self.staged_bytes.get() + bytes);
        if self.staged_bytes.get() >= SUBMIT_BYTES {
            self.flush();
        }
    }

    /// Counts `bytes` of direct copies just recorded; submits once enough are pending.
    pub fn copied_direct(&self, bytes: u64) {
        self.direct_bytes.set(self.direct_bytes.get() + bytes);
        if self.direct_bytes.get() >= self.direct_submit_bytes {
            self.flush();
        }
    }

    /// Submits everything recorded so far (and runs the after-submit hooks).
    pub fn flush(&self) -> Option<wgpu::SubmissionIndex> {
        let start = Stopwatch::start();
        self.end_pass();
        let encoder = self.encoder.borrow_mut().take();
        for hook in std::mem::take(&mut *self.before_submit.borrow_mut()) {
            hook();
        }
        let index = encoder.map(|encoder| {
            let mut u = self.uniforms.borrow_mut();
            if !u.is_empty() {
                // Queue writes land before the submission below and after every earlier one,
                // so reusing the arena per submission is safe.
                self.gpu.queue.write_buffer(&self.arena, 0, &u);
                u.clear();
            }
            self.submissions.set(self.submissions.get() + 1);
            self.gpu.queue.submit([encoder.finish()])
        });
        if self.commands.get() > 0 {
            self.submit_after.set((self.submit_after.get() * 2).min(SUBMIT_EVERY));
        }
        self.commands.set(0);
        self.staged_bytes.set(0);
        self.direct_bytes.set(0);
        let hooks = std::mem::take(&mut *self.after_submit.borrow_mut());
        if let Some(index) = &index {
            for hook in hooks {
                hook(index);
            }
        } else {
            debug_assert!(hooks.is_empty(), "hooks without recorded commands");
        }
        self.submit_s.set(self.submit_s.get() + start.seconds());
        index
    }

    /// Blocks (native) until `index` — or everything, for `None` — is done on the GPU.
    pub fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> crate::Result<()> {
        let everything = index.is_none();
        self.gpu.wait(index)?;
        // (the browser's wait is a no-op: only a native wait leaves the GPU idle)
        if everything && cfg!(not(target_arch = "wasm32")) {
            self.drained();
        }
        Ok(())
    }

    /// Runs ready callbacks (map_async) without blocking.
    pub fn poll(&self) {
        let start = Stopwatch::start();
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.gpu.device.poll(wgpu::PollType::Poll);
        self.poll_s.set(self.poll_s.get() + start.seconds());
    }

    /// Host seconds so far in submissions (with their hooks: the waits for fills) and in polls.
    pub fn host_seconds(&self) -> (f64, f64) {
        (self.submit_s.get(), self.poll_s.get())
    }

    pub fn submissions(&self) -> u64 {
        self.submissions.get()
    }

    /// The uniform arena (one buffer for the recorder's life: bind groups are kept over it).
    pub fn arena(&self) -> wgpu::Buffer {
        self.arena.clone()
    }

    /// The counter the buffer pool adds to when it drops a buffer.
    pub fn retired_counter(&self) -> Rc<Cell<u64>> {
        self.retired.clone()
    }

    /// Pool buffers dropped so far.
    pub fn retired(&self) -> u64 {
        self.retired.get()
    }

    /// From now on, one buffer may hold a kernel's inputs and its outputs (the GPU pool's slabs):
    /// dispatches that bind it so run pipelines whose storage bindings are all read-write
    /// (`Kernels::dispatch_detailed`).
    pub fn set_tensors_share_buffers(&self) {
        self.tensors_share_buffers.set(true);
    }

    pub fn tensors_share_buffers(&self) -> bool {
        self.tensors_share_buffers.get()
    }

    /// Dispatches that waited for their pipeline's worker so far.
    pub fn deferred_dispatches(&self) -> u64 {
        self.deferred_count.get()
    }

    /// Compute passes opened so far.
    pub fn passes(&self) -> u64 {
        self.passes.get()
    }
}
