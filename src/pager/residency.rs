//! The pager's state machine: where each tensor is, making one resident (filling it, writing
//! dirty victims back), delivering write-backs, prefetching. Which tensors leave to make room,
//! and where one goes: `eviction.rs`.

use super::pool::Taken;
use super::slabs::Region;
use super::staging::Job;
use super::*;

/// How many prefetch windows ahead the upload ring's slots are filled.
const PREFILL_LOOKAHEAD: usize = 2;

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

impl State {
    pub(super) fn drain(&mut self, recorder: &Recorder, wait: bool) -> Result<()> {
        let State { store, entries, readback, counters, .. } = self;
        counters.stall_s += stall(
            "drain readback",
            readback.drain(recorder, wait, &mut |job| host_target(store.as_mut(), entries, job))?,
        );
        if wait {
            counters.stall_s += stall("drain dma", self.dma.wait(recorder, None)?);
        }
        self.dma.reap();
        for r in self.dma.ready_frees() {
            self.store.free(r);
        }
        Ok(())
    }

    /// Delivers the write-backs of `id` still in flight (and the older ones before them), and
    /// waits for the direct copies of its host bytes: the CPU may then read or change them.
    pub(super) fn settle(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        self.settle_ring(recorder, id)?;
        let waited = self.dma.wait(recorder, Some(id))?;
        if waited > 0.0 {
            let name = self.entries.get(&id).map_or("?", |e| e.name.as_str());
            log::trace!("stall: settle dma of {name} {:.3} ms", waited * 1e3);
        }
        self.counters.stall_s += waited;
        Ok(())
    }

    /// Delivers the ring's write-backs of `id` (and older ones); direct copies stay in flight
    /// (what the GPU does next with the tensor's host bytes is ordered after them on the GPU).
    fn settle_ring(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        let State { store, entries, readback, counters, .. } = self;
        counters.stall_s += stall(
            "settle readback",
            readback.deliver_through(recorder, id, &mut |job| host_target(store.as_mut(), entries, job))?,
        );
        Ok(())
    }

    /// Where the GPU copies `host` by DMA (a pinned store), with the bytes to move (`len`,
    /// trimmed to the range).
    /// Pins its memory first if need be (once per segment), after the background copies into
    /// and out of the store, since pinning moves the bytes.
    fn direct(&mut self, host: &HostRange, len: u64) -> Option<(wgpu::Buffer, u64, u64)> {
        if self.store.dma(host).is_none() {
            if !self.store.is_pinned() {
                return None;
            }
            self.upload.wait_fills();
            self.readback.wait_deliveries();
            if !self.store.pin(host) {
                return None;
            }
        }
        let (buffer, offset) = self.store.dma(host)?;
        Some((buffer, offset, len.min(host.len as u64)))
    }

    /// Records the write-back of a dirty resident tensor (it stays resident, now clean).
    pub(super) fn write_back(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        let (gpu, host, len, bytes) = {
            let e = &self.entries[&id];
            (e.gpu.clone().expect("resident"), e.host, e.copy_len(), e.bytes)
        };
        // Fail before anything moves if the host cannot take the bytes: the GPU copy stays.
        self.store.bytes_mut(&host)?;
        if let Some((to, offset, n)) = self.direct(&host, len) {
            // A write-back of it still in the ring (from before its memory was pinned) lands
            // first: it would overwrite this one's bytes.
            if self.readback.has_jobs_for(id) {
                self.settle_ring(recorder, id)?;
            }
            self.dma.record(recorder, id, dma::Dir::Down, &gpu.buffer, gpu.offset, &to, offset, n);
        } else {
            let State { store, entries, readback, counters, .. } = self;
            counters.stall_s += stall(
                "write-back slot",
                readback.read(recorder, id, &gpu.buffer, gpu.offset, len, &mut |job| {
                    host_target(store.as_mut(), entries, job)
                })?,
            );
        }
        self.counters.writebacks += 1;
        self.counters.bytes_written_back += bytes;
        let e = self.entries.get_mut(&id).expect("exists");
        e.unread_writeback += bytes;
        e.dirty = false;
        e.contents = Contents::Host;
        Ok(())
    }

    /// Gives a freshly placed buffer the tensor's contents (nothing when the kernel will
    /// `overwrite` it all), and unmaps a zero-copy buffer so kernels can use it.
    pub(super) fn fill(&mut self, recorder: &Recorder, id: TensorId, taken: &Taken, overwrite: bool) -> Result<()> {
        // A direct upload is ordered after a direct write-back on the GPU: no wait for it here.
        if self.uploads_direct(id, taken.mapped) {
            self.settle_ring(recorder, id)?;
        } else {
            self.settle(recorder, id)?;
        }
        let e = self.entries.get_mut(&id).expect("exists");
        if overwrite {
            e.lost = None;
            e.lost_by_plan = false;
        } else if let Err(err) = e.check_lost() {
            if taken.mapped {
                taken.region.buffer.unmap();
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
                recorder.clear(&taken.region.buffer, taken.region.offset, len);
                Ok(())
            }
            (_, Contents::Host, mapped) => self.upload(recorder, id, &taken.region, mapped),
        };
        if taken.mapped {
            taken.region.buffer.unmap();
        }
        // Bytes filled ahead that this placement did not upload are not needed (or stale) now.
        self.upload.discard_prefill(id);
        result
    }

    /// Whether the host bytes of `id` go to a buffer (`mapped`: zero-copy) by DMA straight from
    /// the store: on the `Pinned` path, and on the ring's while a direct write-back of them is
    /// still in flight (the GPU orders the upload after it; the ring's memcpy would first wait
    /// for the GPU to finish everything submitted before the write-back).
    fn uploads_direct(&self, id: TensorId, mapped: bool) -> bool {
        if mapped {
            return false;
        }
        let host = &self.entries[&id].host;
        if self.direct_upload {
            return self.store.is_pinned() || self.store.dma(host).is_some();
        }
        self.reupload_in_flight && self.dma.busy(id, Some(dma::Dir::Down)) && self.store.dma(host).is_some()
    }

    /// The host bytes of `id` (`len` of `host`) into `region`, not mapped: by DMA straight from a
    /// pinned store on the `Pinned` path, else through the ring.
    fn upload_unmapped(
        &mut self,
        recorder: &Recorder,
        id: TensorId,
        host: HostRange,
        len: usize,
        region: &Region,
    ) -> Result<()> {
        if self.uploads_direct(id, false) {
            if let Some((from, offset, n)) = self.direct(&host, len as u64) {
                if !self.direct_upload {
                    self.counters.uploads_behind_writeback += 1;
                }
                self.dma.record(recorder, id, dma::Dir::Up, &from, offset, &region.buffer, region.offset, n);
                return Ok(());
            }
        }
        let src = &self.store.bytes(&host)?[..len];
        self.counters.stall_s +=
            stall("upload slot", self.upload.upload(recorder, Some(id), src, &region.buffer, region.offset)?);
        Ok(())
    }

    /// Host bytes of `id` into `region`: written in place when it is mapped, by DMA from a
    /// pinned store on the `Pinned` path, else through the ring.
    pub(super) fn upload(&mut self, recorder: &Recorder, id: TensorId, region: &Region, mapped: bool) -> Result<()> {
        let (host, len, bytes) = {
            let e = &self.entries[&id];
            (e.host, e.copy_len() as usize, e.bytes)
        };
        let start = Stopwatch::start();
        if mapped {
            let src = &self.store.bytes(&host)?[..len];
            let mut view = region
                .buffer
                .get_mapped_range_mut(region.offset..region.offset + len as u64)
                .map_err(|err| Error::Gpu { context: "zero-copy upload".into(), msg: err.to_string() })?;
            staging::fill_now(&self.copier, &mut view, src);
        } else {
            self.upload_unmapped(recorder, id, host, len, region)?;
        }
        self.counters.fill_s += start.seconds();
        self.counters.uploads += 1;
        self.counters.bytes_uploaded += bytes;
        let e = self.entries.get_mut(&id).expect("exists");
        e.uploads += 1;
        e.unread_writeback = 0;
        Ok(())
    }

    /// Frees `id`'s GPU buffer and host bytes, with no write-back.
    pub(super) fn release(&mut self, id: TensorId) {
        if let Some(e) = self.entries.remove(&id) {
            self.resident.remove(&id);
            // Background copies may still read or write its host bytes.
            self.readback.wait_deliveries_for(id);
            self.upload.wait_fills_for(&[id]);
            self.live_bytes -= e.bytes;
            self.counters.writeback_unread_bytes += e.unread_writeback;
            if self.in_step && matches!(e.key, Key::Step(_)) && !e.read_on_host {
                self.freed_unread.insert(e.key);
            }
            // A step's keys come back next step; a persistent tensor's never does.
            if matches!(e.key, Key::Persistent(_)) {
                self.last_place.remove(&e.key);
            }
            if let Some(buf) = e.gpu {
                self.pool.give(buf);
            }
            // A direct copy still using the bytes holds them back until it is done; a borrower
            // (`Pager::lend_host`) until it gives them back.
            if e.lent {
                self.released_while_lent.insert(id, e.host);
            } else if let Some(r) = self.dma.free_when_done(e.host, id) {
                self.store.free(r);
            }
        }
    }

    pub(super) fn unpin_to(&mut self, depth: usize) {
        while self.pinned.len() > depth {
            let id = self.pinned.pop().expect("non-empty");
            if let Some(e) = self.entries.get_mut(&id) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// After the host bytes of `id` changed: its GPU copy is dropped, or, while an op in flight
    /// has it pinned, rewritten in place (recorded in program order, before the op's kernels).
    pub(super) fn host_changed(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
        let e = self.entries.get_mut(&id).expect("exists");
        e.contents = Contents::Host;
        e.dirty = false;
        e.lost = None;
        e.lost_by_plan = false;
        e.host_update_due = false;
        if e.pins == 0 {
            self.drop_gpu_copy(id);
        } else if let Some(region) = e.gpu.clone() {
            let (host, len) = (e.host, e.copy_len() as usize);
            self.upload_unmapped(recorder, id, host, len, &region)?;
        }
        Ok(())
    }

    /// The running totals, with the upload ring's waits for its fills and what it filled ahead.
    pub(super) fn counters(&self) -> Counters {
        let (prefilled_uploads, prefill_wasted_bytes) = self.upload.prefill_counts();
        Counters { fill_wait_s: self.upload.fill_waits_s(), prefilled_uploads, prefill_wasted_bytes, ..self.counters }
    }

    /// The accesses traced so far become the prediction for the next step.
    pub(super) fn new_step(&mut self) {
        if let Some((clock, before)) = self.step_start.take() {
            self.last_step = Some(StepTransfers::between(&before, &self.counters(), clock.seconds()));
        }
        self.step_start = Some((Stopwatch::start(), self.counters()));
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

    /// The tensor a key of the plan stands for in this step (`None`: not made yet).
    fn tensor_of(&self, key: Key) -> Option<TensorId> {
        match key {
            Key::Persistent(id) => Some(id),
            Key::Step(n) => self.step_ids.get(n as usize).copied(),
        }
    }

    /// Uploads tensors the next accesses will read while there is free room (no evictions),
    /// and asks the OS to read their host pages ahead.
    pub(super) fn prefetch(&mut self, device: &wgpu::Device, recorder: &Recorder) -> Result<()> {
        if self.diverged || self.prefetch_window == 0 {
            return Ok(());
        }
        let Some(future) = self.future.as_ref() else {
            return Ok(());
        };
        let cursor = self.trace.len();
        let wanted: Vec<TensorId> = (cursor..cursor + self.prefetch_window)
            .filter_map(|i| future.at(i))
            .filter_map(|key| self.tensor_of(key))
            .collect();
        for id in wanted {
            let Some(e) = self.entries.get(&id) else {
                continue;
            };
            let stale = e.host_update_due || e.lent;
            if e.gpu.is_some()
                || e.contents != Contents::Host
                || e.lost.is_some()
                || stale
                || self.readback.has_jobs_for(id)
            {
                continue;
            }
            if !self.pool.fits_without_eviction(e.bytes.max(4)) {
                break;
            }
            self.store.will_need(&e.host);
            let taken = self.take(device, id, true)?;
            self.fill(recorder, id, &taken, false)?;
            self.entries.get_mut(&id).expect("exists").gpu = Some(taken.region);
            self.resident.insert(id);
            self.counters.prefetches += 1;
        }
        Ok(())
    }

    /// Starts filling staging slots with the host bytes of tensors the next accesses will read
    /// and that are not resident (`UploadRing::prefill`): the ring's memcpy then runs ahead of
    /// the submissions instead of holding them up, without taking pool room the budget lacks.
    /// Looked at again at every access (a tensor resident now may be evicted before its use),
    /// up to the first one the ring has no slots to spare for.
    pub(super) fn prefill_ahead(&mut self) {
        if !self.prefill || self.diverged || self.prefetch_window == 0 || self.direct_upload || self.pool.zero_copy() {
            return;
        }
        let Some(future) = self.future.as_ref() else { return };
        if !self.upload.can_prefill() {
            return;
        }
        let cursor = self.trace.len();
        for i in cursor..(cursor + PREFILL_LOOKAHEAD * self.prefetch_window).min(future.len()) {
            let id = future.at(i).and_then(|key| self.tensor_of(key));
            let Some((id, e)) = id.and_then(|id| Some((id, self.entries.get(&id)?))) else { continue };
            let wanted = e.gpu.is_none()
                && e.contents == Contents::Host
                && e.lost.is_none()
                && !e.host_update_due
                && !e.lent
                && !self.upload.is_prefilled(id)
                && !self.readback.has_jobs_for(id)
                && !self.dma.busy(id, None);
            if wanted {
                let len = e.copy_len() as usize;
                let Ok(bytes) = self.store.bytes(&e.host) else { return };
                // A slot that fails to map fails again, with its error, at the upload itself.
                if !matches!(self.upload.prefill(id, &bytes[..len]), Ok(true)) {
                    return;
                }
            }
        }
    }
}
