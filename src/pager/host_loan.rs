//! Host bytes changed in place: by the caller while it holds the pager (`Pager::update_host`), or
//! lent to another thread (`Pager::lend_host`) so the host optimizer's pass over a layer runs
//! while the main thread records and pages the layers before it. While lent, a tensor's host
//! bytes are the borrower's alone: the pager neither prefetches it nor lets anyone read, write,
//! upload or update it (those are errors naming it), and frees its bytes only once they are
//! given back.

use super::*;

/// Host bytes of some tensors, lent to whoever holds this (see [`Pager::lend_host`]). Give it
/// back with [`Pager::return_host`]; dropped without that, the tensors stay lent (an error at
/// their next use, not a race).
pub struct HostLoan {
    ids: Vec<TensorId>,
    written: Vec<TensorId>,
    /// (address, length) of each tensor's bytes, in `ids` order.
    bytes: Vec<(usize, usize)>,
}

// SAFETY: the loan is the only way to reach these bytes until it is returned: the pager refuses
// every access to a lent tensor, never moves a lent tensor's memory (its segment is pinned, or
// stays plain, before lending) and defers freeing it until the loan comes back.
unsafe impl Send for HostLoan {}

impl HostLoan {
    /// The lent bytes, each trimmed to its tensor's size, in the order the loan was asked for.
    pub fn slices(&mut self) -> Vec<&mut [u8]> {
        // SAFETY: see the `Send` impl; the ranges are pairwise disjoint (checked when lent) and
        // `&mut self` keeps the slices from being handed out twice at once.
        self.bytes.iter().map(|&(at, len)| unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len) }).collect()
    }
}

impl State {
    /// Makes the host bytes of `ids` hold their newest values for the host to change in place;
    /// returns their ranges, each trimmed to its tensor's size. `written` must be among `ids`.
    fn host_bytes_ready(
        &mut self,
        recorder: &Recorder,
        ids: &[TensorId],
        written: &[TensorId],
    ) -> Result<Vec<HostRange>> {
        if let Some(id) = written.iter().find(|id| !ids.contains(id)) {
            let name = self.entries.get(id).map_or(format!("#{id}"), |e| e.name.clone());
            return Err(Error::invalid("update_host", format!("`{name}` is written but not among the tensors given")));
        }
        // Direct copies reading or writing these host bytes finish first.
        for &id in ids {
            self.counters.stall_s += stall("host loan dma", self.dma.wait(recorder, Some(id))?);
        }
        let mut ranges = Vec::with_capacity(ids.len());
        for &id in ids {
            let e = self.entries.get(&id).ok_or_else(|| Error::invalid("tensor", format!("#{id} was released")))?;
            e.check_not_lent()?;
            if (e.dirty && e.gpu.is_some()) || self.readback.has_jobs_for(id) {
                return Err(Error::invalid("update_host", format!("`{}` has newer values on the GPU", e.name)));
            }
            e.check_lost()?;
            let mut r = e.host;
            r.len = e.bytes as usize;
            ranges.push(r);
        }
        self.upload.wait_fills_for(ids);
        Ok(ranges)
    }

    /// The host store's bytes of `ranges`, with tensors that are all zeros written as such.
    fn host_bytes(&mut self, ids: &[TensorId], ranges: &[HostRange]) -> Result<Vec<&mut [u8]>> {
        let zero: Vec<bool> = ids.iter().map(|id| self.entries[id].contents == Contents::Zero).collect();
        let mut slices = self.store.bytes_mut_many(ranges)?;
        for (s, z) in slices.iter_mut().zip(zero) {
            if z {
                s.fill(0);
            }
        }
        Ok(slices)
    }

    /// After the host changed the bytes of `ids` in place: they hold the newest values, and the
    /// GPU copies of `written` are stale. Tensors released meanwhile are skipped.
    fn host_bytes_changed(&mut self, recorder: &Recorder, ids: &[TensorId], written: &[TensorId]) -> Result<()> {
        for id in ids {
            if let Some(e) = self.entries.get_mut(id) {
                e.contents = Contents::Host;
                e.unread_writeback = 0;
                e.read_on_host = true;
            }
        }
        for id in written {
            if self.entries.contains_key(id) {
                self.host_changed(recorder, *id)?;
            }
        }
        Ok(())
    }
}

impl Entry {
    /// An error naming the tensor while its host bytes are lent (`Pager::lend_host`).
    pub(super) fn check_not_lent(&self) -> Result<()> {
        if self.lent {
            return Err(Error::invalid(
                "tensor",
                format!("`{}` is lent to a host job (Pager::lend_host): give it back first", self.name),
            ));
        }
        Ok(())
    }
}

impl Pager {
    /// Runs `f` on the host bytes of `ids` (each trimmed to its tensor's size), which must hold
    /// their newest values (call `sync_to_host` first). Tensors in `written` (some of `ids`) are
    /// taken to be changed: their GPU copies are dropped, or rewritten when an op has them pinned.
    /// `f` runs while the pager is held: it must not call it (handles it drops are released, and
    /// op scopes it ends unpinned, at the pager's next use).
    pub fn update_host<R>(
        &self,
        ids: &[TensorId],
        written: &[TensorId],
        f: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> Result<R> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        let ranges = st.host_bytes_ready(recorder, ids, written)?;
        let mut slices = st.host_bytes(ids, &ranges)?;
        let out = f(&mut slices);
        drop(slices);
        st.host_bytes_changed(recorder, ids, written)?;
        Ok(out)
    }

    /// [`Pager::update_host`] on another thread: the host bytes of `ids` (newest values, as
    /// there) go to the returned loan, which may cross threads, until [`Pager::return_host`]
    /// takes it back and marks `written` changed. Meanwhile the pager keeps away from them.
    pub fn lend_host(&self, ids: &[TensorId], written: &[TensorId]) -> Result<HostLoan> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        let ranges = st.host_bytes_ready(recorder, ids, written)?;
        // A segment pinned later would move its bytes under the borrower: pin it now (or learn
        // that it stays ordinary memory, which does not move either).
        for r in &ranges {
            st.store.pin(r);
        }
        let bytes = st.host_bytes(ids, &ranges)?.into_iter().map(|s| (s.as_mut_ptr() as usize, s.len())).collect();
        for id in ids {
            st.entries.get_mut(id).expect("checked").lent = true;
        }
        Ok(HostLoan { ids: ids.to_vec(), written: written.to_vec(), bytes })
    }

    /// Exchanges the host bytes of two tensors of one size, each holding its newest values on
    /// the host (call `sync_to_host` first): O(1), no byte moves. Their GPU copies are dropped.
    /// For double buffers: the delayed host optimizer (`optim::delayed_update`) writes the next
    /// weights beside the ones the GPU reads, then swaps them in, and takes the step's gradients
    /// aside the same way while the next backward writes new ones.
    pub fn swap_host(&self, a: TensorId, b: TensorId) -> Result<()> {
        let recorder = &*self.recorder;
        let mut st = self.state();
        st.host_bytes_ready(recorder, &[a, b], &[a, b])?;
        let (ea, eb) = (&st.entries[&a], &st.entries[&b]);
        if ea.bytes != eb.bytes {
            return Err(Error::invalid(
                "swap_host",
                format!(
                    "`{}` holds {} bytes and `{}` {}: only tensors of one size swap",
                    ea.name, ea.bytes, eb.name, eb.bytes
                ),
            ));
        }
        if let Some(e) = [ea, eb].into_iter().find(|e| e.pins > 0) {
            return Err(Error::invalid("swap_host", format!("`{}` is held by an op", e.name)));
        }
        let (host_a, contents_a) = (ea.host, ea.contents);
        let (host_b, contents_b) = (eb.host, eb.contents);
        for (id, host, contents) in [(a, host_b, contents_b), (b, host_a, contents_a)] {
            let e = st.entries.get_mut(&id).expect("checked");
            e.host = host;
            e.unread_writeback = 0;
            st.host_changed(recorder, id)?;
            // (`host_changed` says the host bytes are the values; a zero tensor stays zero)
            st.entries.get_mut(&id).expect("checked").contents = contents;
        }
        Ok(())
    }

    /// Takes back a loan from [`Pager::lend_host`]: its tensors hold the newest values on the
    /// host, `written` ones' GPU copies are dropped, and the bytes of tensors released while lent
    /// are freed now.
    pub fn return_host(&self, loan: HostLoan) -> Result<()> {
        let mut st = self.state();
        for id in &loan.ids {
            if let Some(e) = st.entries.get_mut(id) {
                e.lent = false;
            } else if let Some(r) = st.released_while_lent.remove(id) {
                st.store.free(r);
            }
        }
        st.host_bytes_changed(&self.recorder, &loan.ids, &loan.written)
    }
}
