//! Moving a tensor's bytes between the host and the GPU when the caller asks: overwriting or
//! zeroing it, reading it back, and flushing or settling the copies in flight (changing its host
//! bytes in place: `host_loan.rs`).

use super::*;

impl Pager {
    /// Overwrites a tensor's values from the host (any GPU copy is dropped).
    pub fn write(&self, id: TensorId, data: &[u8]) -> Result<()> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        st.settle(recorder, id)?;
        st.upload.wait_fills_for(&[id]);
        let (host, bytes) = {
            let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
            e.check_not_lent()?;
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

    /// Gives `id` to the host: its write-back starts now if the GPU holds newer values (recorded,
    /// not waited for: it overlaps the GPU's work until the host reads it with `sync_to_host`)
    /// and its GPU buffer goes back to the pool. For a tensor only the host reads next (an f16
    /// gradient on its way to the host optimizer); not counted as an eviction.
    pub fn hand_to_host(&self, id: TensorId) -> Result<()> {
        let mut st = self.state();
        let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
        if e.gpu.is_none() || e.pins > 0 {
            return Ok(());
        }
        if e.dirty {
            st.write_back(&self.recorder, id)?;
        }
        st.drop_gpu_copy(id);
        Ok(())
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
        if let Some(region) = &e.gpu {
            let len = e.copy_len();
            recorder.clear(&region.buffer, region.offset, len);
        }
        e.contents = Contents::Zero;
        e.host_update_due = false;
        e.dirty = false;
        e.lost = None;
        e.lost_by_plan = false;
        Ok(())
    }

    /// Says no one will read `id` until it is written whole again (an activation that its one
    /// reader makes again in backward from a kept input, `autograd::remake_for_backward`): its
    /// GPU buffer goes back to the pool now and it is never written back, so it costs neither
    /// budget nor bus until then. A read before that rewrite is an error naming the tensor.
    /// Returns the bytes let go (0 while an op has it pinned: then it stays as it is).
    pub fn discard(&self, id: TensorId) -> Result<u64> {
        self.let_go(id, DISCARDED)
    }

    /// Says the values of `id` are used up and no one will read it until it is written whole
    /// again (an f32 gradient once sent to the host in f16, the f16 copy once the host read it):
    /// as [`Pager::discard`], but shown as nowhere, not as made again in backward.
    pub fn forget(&self, id: TensorId) -> Result<u64> {
        self.let_go(id, FORGOTTEN)
    }

    fn let_go(&self, id: TensorId, why: &str) -> Result<u64> {
        let mut st = self.state();
        let e = st.entries.get_mut(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
        if e.pins > 0 {
            return Ok(0);
        }
        e.dirty = false;
        e.contents = Contents::Undefined;
        e.lost = Some(why.into());
        e.lost_by_plan = true;
        let bytes = e.bytes;
        st.drop_gpu_copy(id);
        Ok(bytes)
    }

    /// Says the host bytes of `ids` will be rewritten (`update_host`, `write`) before they are
    /// next read — a deferred host optimizer's parameters — so prefetching them would upload
    /// values about to be replaced: the prefetcher leaves them alone until their bytes change.
    /// Reads are unaffected (a read before the rewrite gets the bytes as they are).
    pub fn expect_host_update(&self, ids: &[TensorId]) {
        let mut st = self.state();
        for id in ids {
            if let Some(e) = st.entries.get_mut(id) {
                e.host_update_due = true;
            }
        }
    }

    /// Keeps `ids` on the GPU once placed: eviction never picks them (slab compaction may still
    /// move them within GPU memory). For what a run reads every step and moves nowhere else — a
    /// split optimizer's GPU share (`optim::SplitAdamW`) — whose bytes the budget holds for it.
    pub fn keep_on_gpu(&self, ids: &[TensorId]) {
        let mut st = self.state();
        for id in ids {
            if let Some(e) = st.entries.get_mut(id) {
                e.kept = true;
            }
        }
    }

    /// Bytes of the tensors kept on the GPU (`keep_on_gpu`), placed there or not.
    pub fn kept_bytes(&self) -> u64 {
        self.state().entries.values().filter(|e| e.kept).map(|e| e.bytes).sum()
    }

    /// A tensor's values when the host holds the newest copy (an error if the GPU does; use
    /// `read` then). For set-up code that runs before any kernel touched the tensor.
    pub fn read_now(&self, id: TensorId) -> Result<Vec<u8>> {
        let mut st = self.state();
        st.counters.stall_s += stall("read dma", st.dma.wait(&self.recorder, Some(id))?);
        if let Some(e) = st.entries.get_mut(&id) {
            e.unread_writeback = 0;
            e.read_on_host = true;
        }
        let e = st.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
        e.check_not_lent()?;
        if (e.dirty && e.gpu.is_some()) || st.readback.has_jobs_for(id) {
            return Err(Error::invalid("read_now", format!("`{}` has newer values on the GPU", e.name)));
        }
        e.check_lost()?;
        if e.contents == Contents::Zero {
            return Ok(vec![0; e.bytes as usize]);
        }
        Ok(st.store.bytes(&e.host)?[..e.bytes as usize].to_vec())
    }

    /// Whether the host store holds the newest bytes of every one of `ids` with no copy of them
    /// in flight (write-backs delivered by the last [`Pager::poll`]): the host may read them now
    /// without waiting. False for a tensor lent or released.
    pub fn landed(&self, ids: &[TensorId]) -> bool {
        let st = self.state();
        ids.iter().all(|id| {
            let newer_on_gpu = |e: &Entry| e.dirty && e.gpu.is_some();
            let settled = st.entries.get(id).is_some_and(|e| !e.lent && !newer_on_gpu(e));
            settled && !st.readback.has_jobs_for(*id) && !st.dma.busy(*id, None)
        })
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
            any |= dirty || st.readback.has_jobs_for(id) || st.dma.busy(id, None);
        }
        if any {
            recorder.flush();
            // Only these: write-backs recorded after them (a forward's evictions) stay in flight.
            for &id in ids {
                st.settle(recorder, id)?;
            }
            st.drain(recorder, false)?;
            // (everything up to these write-backs is done; the GPU waits for what comes next)
            recorder.drained();
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
            e.check_not_lent()?;
            let (dirty, contents, bytes) = (e.dirty && e.gpu.is_some(), e.contents, e.bytes as usize);
            if dirty {
                st.write_back(recorder, id)?;
            }
            (dirty, contents, bytes, st.readback.map_waits(&self.recorder, Some(id)))
        };
        // The browser returns to its event loop here until the maps are done (natively these
        // block, as `settle` below would). No borrow of the state lives across the awaits.
        let start = Stopwatch::start();
        // (a write-back recorded here is the last command: once it is read, the GPU is idle)
        let drains = dirty && !waits.is_empty();
        for wait in waits {
            wait.await?;
        }
        if drains {
            self.recorder.drained();
        }
        let mut st = self.state();
        st.counters.stall_s += stall("read maps", start.seconds());
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
        st.counters.stall_s += stall("sync maps", start.seconds());
        st.drain(&self.recorder, true)?;
        drop(st);
        self.gpu.check("settling transfers")
    }

    /// Delivers finished write-backs without waiting.
    pub fn poll(&self) -> Result<()> {
        self.state().drain(&self.recorder, false)
    }
}
