//! Making room on the GPU: where a tensor goes (the pool's region, at its last place in the
//! slabs when that is free), which tensors leave for it (the plan's victim; in slabs, victims
//! until the neighbours in one range can move to the other slabs' gaps, `window.rs`), and what
//! leaving costs (a write-back, none where the plan knows the values are dead).

use super::pool::Taken;
use super::slabs::Slabs;
use super::window::{self, Placed};
use super::*;

impl State {
    pub(super) fn evict(&mut self, recorder: &Recorder, id: TensorId) -> Result<()> {
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
        self.drop_gpu_copy(id);
        self.counters.evictions += 1;
        Ok(())
    }

    /// Where a tensor of `bytes` goes to a slab and none has a range for it: opens one without
    /// bus traffic where the other slabs have room, moving the run's tensors into their gaps
    /// (compaction) except those that may leave for free (clean, not needed again this step).
    /// The run chosen moves the fewest bytes. False where no run can be cleared so.
    fn open_by_moving(&mut self, recorder: &Recorder, bytes: u64) -> Result<bool> {
        let len = Slabs::footprint(bytes);
        let mut by_slab: Vec<(wgpu::Buffer, Vec<(Placed, TensorId)>)> =
            self.pool.slabs_for(bytes).into_iter().map(|slab| (slab, Vec::new())).collect();
        for &id in &self.resident {
            let Some(region) = &self.entries[&id].gpu else { continue };
            if let Some((_, placed)) = by_slab.iter_mut().find(|(slab, _)| *slab == region.buffer) {
                placed.push((Placed { offset: region.offset, size: region.size }, id));
            }
        }
        let mut best: Option<(Vec<TensorId>, u64)> = None;
        for (slab, mut placed) in by_slab {
            placed.sort_by_key(|(p, _)| p.offset);
            let ranges: Vec<Placed> = placed.iter().map(|(p, _)| *p).collect();
            // Anything unpinned may move: its views are not in a dispatch being recorded.
            let costs: Vec<Option<u64>> = placed
                .iter()
                .map(|(p, id)| {
                    let e = &self.entries[id];
                    (e.pins == 0).then_some(if self.leaves_for_free(e) { 0 } else { p.size })
                })
                .collect();
            let Some((run, moved)) = window::cheapest_run(&ranges, slab.size(), len, |i| costs[i]) else { continue };
            if moved <= self.pool.free_outside(&slab) && best.as_ref().is_none_or(|(_, b)| moved < *b) {
                best = Some((placed[run].iter().map(|(_, id)| *id).collect(), moved));
            }
        }
        let Some((run, _)) = best else { return Ok(false) };
        for id in run {
            // (clean: its eviction writes nothing back)
            if self.leaves_for_free(&self.entries[&id]) {
                self.evict(recorder, id)?;
            } else if !self.relocate(recorder, id) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether `e` may leave the GPU at no cost: clean (its host bytes are current) and not
    /// needed again this step.
    fn leaves_for_free(&self, e: &Entry) -> bool {
        !e.kept && !e.dirty && self.next_use(e.key).is_none()
    }

    /// Moves `id` into a gap of a slab other than its own (a GPU copy cannot stay within one
    /// buffer), by a copy inside GPU memory: far cheaper than a write-back and a second upload
    /// over the bus. False where no gap fits it.
    fn relocate(&mut self, recorder: &Recorder, id: TensorId) -> bool {
        let e = &self.entries[&id];
        let (Some(from), len, key) = (e.gpu.clone(), e.copy_len(), e.key) else { return false };
        let Some(to) = self.pool.take_away_from(&from) else { return false };
        recorder.record(|enc| enc.copy_buffer_to_buffer(&from.buffer, from.offset, &to.buffer, to.offset, len));
        if let Some(place) = self.pool.place_of(&to) {
            self.last_place.insert(key, place);
        }
        self.entries.get_mut(&id).expect("exists").gpu = Some(to);
        self.pool.give(from);
        self.counters.relocations += 1;
        self.counters.bytes_relocated += len;
        true
    }

    /// Gives `id`'s GPU buffer back to the pool: its values are on the host, or not wanted.
    pub(super) fn drop_gpu_copy(&mut self, id: TensorId) {
        if let Some(buf) = self.entries.get_mut(&id).and_then(|e| e.gpu.take()) {
            self.pool.give(buf);
        }
        self.resident.remove(&id);
    }

    /// Whether `id`'s values will never be read again, by the plan: it was made during the step,
    /// the previous step freed its counterpart without reading it on the host, the trace has
    /// matched so far, and no access to it is left in the step.
    pub(super) fn dead_by_plan(&self, id: TensorId) -> bool {
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
    pub(super) fn done_this_step(&self, key: Key) -> bool {
        let Some(future) = self.future.as_ref().filter(|_| self.in_step) else { return false };
        if self.diverged {
            matches!(key, Key::Persistent(_)) && future.next_use(key, 0) == u32::MAX && future.at(0) != Some(key)
        } else {
            self.next_use(key).is_none()
        }
    }

    /// What eviction goes by now: the previous step's trace where this step has matched it so
    /// far, and the position of the latest access in it.
    fn plan_now(&self) -> (Option<&plan::Future>, usize) {
        let future = if self.diverged { None } else { self.future.as_ref() };
        (future, self.trace.len().saturating_sub(1))
    }

    pub(super) fn next_use(&self, key: Key) -> Option<u32> {
        let f = self.future.as_ref()?;
        let cursor = self.trace.len().saturating_sub(1);
        Some(f.next_use(key, cursor)).filter(|&n| n != u32::MAX)
    }

    /// A region from the pool for `id`, where it was last placed if that is free; remembered
    /// for the next time.
    pub(super) fn take(&mut self, device: &wgpu::Device, id: TensorId, mapped: bool) -> Result<Taken> {
        let e = &self.entries[&id];
        let key = e.key;
        let taken = self.pool.take(device, &e.name, e.bytes.max(4), mapped, self.last_place.get(&key).copied())?;
        match self.pool.place_of(&taken.region) {
            Some(place) => self.last_place.insert(key, place),
            None => self.last_place.remove(&key),
        };
        Ok(taken)
    }

    /// A GPU buffer for `id`, evicting by the policy until the pool has room.
    pub(super) fn place(
        &mut self,
        device: &wgpu::Device,
        recorder: &Recorder,
        id: TensorId,
        mapped: bool,
    ) -> Result<Taken> {
        let (name, bytes) = {
            let e = &self.entries[&id];
            (e.name.clone(), e.bytes)
        };
        loop {
            let oom = match self.take(device, id, mapped) {
                Ok(buf) => return Ok(buf),
                Err(Error::BudgetTooSmall { .. }) => None,
                Err(e @ Error::OutOfMemory { .. }) => {
                    // Cached free buffers hold driver memory the budget thought was there.
                    self.pool.trim();
                    Some(e)
                }
                Err(e) => return Err(e),
            };
            if self.open_by_moving(recorder, bytes)? {
                continue;
            }
            if let Some(id) = self.slab_victim(bytes) {
                self.evict(recorder, id)?;
                continue;
            }
            match self.victim() {
                Some(id) => self.evict(recorder, id)?,
                None if oom.is_some() => return Err(oom.expect("checked")),
                None => {
                    let held: Vec<u64> =
                        self.entries.values().filter(|e| e.pins > 0 && e.gpu.is_some()).map(|e| e.bytes).collect();
                    if self.pool.slabs_held().is_some() {
                        let needed: u64 = held.iter().chain([&bytes]).map(|&b| Slabs::footprint(b)).sum();
                        if needed <= self.pool.budget() {
                            return Err(Error::SlabsFragmented { tensor: name, bytes, budget: self.pool.budget() });
                        }
                    }
                    let pinned: u64 = held.iter().map(|&b| size_class(b)).sum();
                    return Err(Error::BudgetTooSmall {
                        tensor: name,
                        needed: pinned + size_class(bytes),
                        budget: self.pool.budget(),
                    });
                }
            }
        }
    }

    /// What the policy weighs of a resident tensor, if it may be evicted now: unpinned, not kept
    /// (and a dirty one only where it may leave).
    fn candidate(&self, e: &Entry) -> Option<plan::Candidate> {
        let may_leave = e.gpu.is_some()
            && e.pins == 0
            && !e.kept
            && (self.blocking_waits || !e.dirty || self.done_this_step(e.key));
        may_leave.then_some(plan::Candidate { key: e.key, bytes: e.bytes, last_use: e.last_use, dirty: e.dirty })
    }

    /// Where a tensor of `bytes` goes to a slab: the tensor in a slab the policy would evict now.
    fn slab_victim(&self, bytes: u64) -> Option<TensorId> {
        let slabs = self.pool.slabs_for(bytes);
        let in_slab = |e: &Entry| e.gpu.as_ref().is_some_and(|r| slabs.contains(&r.buffer));
        self.victim_where(in_slab)
    }

    /// The tensor the policy would evict now: an unpinned resident one (a dirty one only where it
    /// may leave).
    fn victim(&self) -> Option<TensorId> {
        self.victim_where(|_| true)
    }

    /// [`State::victim`] among the tensors `among` accepts.
    fn victim_where(&self, among: impl Fn(&Entry) -> bool) -> Option<TensorId> {
        let candidates: Vec<(TensorId, plan::Candidate)> = self
            .resident
            .iter()
            .filter(|&i| among(&self.entries[i]))
            .filter_map(|&i| Some((i, self.candidate(&self.entries[&i])?)))
            .collect();
        let cands: Vec<plan::Candidate> = candidates.iter().map(|c| c.1).collect();
        let (future, cursor) = self.plan_now();
        plan::choose_victim(self.policy, future, cursor, &cands).map(|v| candidates[v].0)
    }
}
