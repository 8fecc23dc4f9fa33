//! What the pager reports about itself: memory counters, transfer counters and the last step's
//! bus traffic, and residency snapshots for `--json`, benchmarks and the studio.

use super::telemetry::{Counters, Location, Snapshot, StepTransfers, TensorInfo};
use super::{Contents, Pager, DISCARDED};

/// Memory counters, read by telemetry and `--json`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStats {
    pub tensors: usize,
    pub bytes_in_use: u64,
    pub bytes_held: u64,
    pub peak_bytes: u64,
    pub budget: u64,
}

impl Pager {
    pub fn stats(&self) -> MemoryStats {
        let st = self.state();
        MemoryStats {
            tensors: st.entries.len(),
            bytes_in_use: st.pool.in_use(),
            bytes_held: st.pool.held(),
            peak_bytes: st.pool.peak(),
            budget: st.pool.budget(),
        }
    }

    /// Counts a micro-batch shrink (out-of-memory recovery) in the telemetry.
    pub fn note_shrink(&self) {
        self.state().counters.micro_batch_shrinks += 1;
    }

    /// Counts activation bytes a checkpointed block did not keep (recompute) in the telemetry.
    pub fn note_recompute(&self, bytes: u64) {
        self.state().counters.recompute_dropped_bytes += bytes;
    }

    /// Bytes of all live tensors now, and at most so far (the footprint a fully resident run needs).
    pub fn live_bytes(&self) -> (u64, u64) {
        let st = self.state();
        (st.live_bytes, st.peak_live_bytes)
    }

    pub fn counters(&self) -> Counters {
        self.state().counters()
    }

    /// The bus traffic of the last finished step (steps are marked by `begin_step`/`end_step`).
    pub fn last_step(&self) -> Option<StepTransfers> {
        self.state().last_step
    }

    /// GPU buffers the pool has created so far (driver allocations: under a tight budget a
    /// pool that destroys buffers of one size to make another shows here).
    pub fn pool_buffers_created(&self) -> u64 {
        self.state().pool.created()
    }

    pub fn budget(&self) -> u64 {
        self.state().pool.budget()
    }

    /// How tensors get GPU memory now: `buffers` (one each), or `slabs of S bytes (n held)`.
    pub fn gpu_pool(&self) -> String {
        let st = self.state();
        match (st.pool.slabs_held(), st.pool.zero_copy()) {
            (Some(n), _) => format!("slabs of {} bytes ({n} held)", st.pool.slab_bytes()),
            (None, true) if self.recorder.tensors_share_buffers() => {
                "buffers (slabs were asked for, but zero-copy maps each buffer on its own)".into()
            }
            (None, _) => "buffers".into(),
        }
    }

    /// Whether a transfer may be waited for inside a step (not in the browser, see
    /// [`super::PagerOptions::blocking_waits`]).
    pub fn waits_may_block(&self) -> bool {
        self.state().blocking_waits
    }

    /// How the budget was set: asked for, or what `auto` found on the device.
    pub fn budget_source(&self) -> &str {
        &self.budget_source
    }

    /// Bytes of staging buffers made so far (uploads, write-backs), and whether the upload ring
    /// is pinned host memory (then it takes no GPU memory).
    pub fn staging_bytes(&self) -> (u64, u64, bool) {
        let st = self.state();
        (st.upload.held_bytes(), st.readback.held_bytes(), st.upload.is_pinned())
    }

    /// Every tensor and the counters, now.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.state();
        let tensors = st
            .entries
            .iter()
            .map(|(&id, e)| TensorInfo {
                id,
                name: e.name.clone(),
                bytes: e.bytes,
                location: if e.gpu.is_some() {
                    Location::Gpu
                } else if e.lost.as_deref() == Some(DISCARDED) {
                    Location::Remade
                } else if e.contents != Contents::Host {
                    Location::Nowhere
                } else if st.store.ram_fraction(&e.host) < 0.5 {
                    Location::Disk
                } else {
                    Location::HostRam
                },
                dirty: e.dirty,
                in_flight: st.readback.in_flight_for(id) || st.upload.has_fills_for(id) || st.dma.busy(id, None),
                shape: e.layout.as_ref().map(|(s, _)| s.to_vec()).unwrap_or_default(),
                dtype: e.layout.as_ref().map(|(_, d)| d.name()).unwrap_or("bytes"),
                uploads: e.uploads,
                last_use: e.last_use,
                next_use: st.next_use(e.key),
            })
            .collect();
        Snapshot {
            budget: st.pool.budget(),
            gpu_bytes: st.pool.held(),
            peak_gpu_bytes: st.pool.peak(),
            host_bytes: st.store.capacity() as u64,
            staging_bytes: st.upload.held_bytes() + st.readback.held_bytes(),
            staging_pinned: st.upload.is_pinned(),
            counters: st.counters(),
            last_step: st.last_step,
            tensors,
        }
    }

    /// Snapshots published by [`Pager::publish`] arrive here.
    pub fn subscribe(&self) -> std::sync::mpsc::Receiver<Snapshot> {
        self.state().channel.subscribe()
    }

    /// Sends a snapshot to every subscriber (cheap when there are none).
    pub fn publish(&self) {
        if !self.state().channel.has_subscribers() {
            return;
        }
        let snap = self.snapshot();
        self.state().channel.publish(&snap);
    }
}
