//! What the pager reports: counters for the whole run and a per-tensor residency snapshot, for
//! `--json`, benchmarks and the studio (which receives snapshots over a channel).

use std::sync::mpsc;

/// Where a tensor's current bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Location {
    /// In a GPU buffer (and maybe also on the host).
    Gpu,
    /// Only on the host, in RAM.
    HostRam,
    /// Only on the host, and mostly not in RAM: on disk (mincore).
    Disk,
    /// Logically zero or undefined: nothing stored anywhere yet.
    Nowhere,
    /// Let go until backward makes it again (`Pager::discard`): stored nowhere, by plan.
    Remade,
}

/// One tensor in a snapshot.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorInfo {
    pub id: u64,
    pub name: String,
    pub bytes: u64,
    pub location: Location,
    pub dirty: bool,
    /// A copy to or from the host is on its way (a staging fill or a write-back).
    pub in_flight: bool,
    /// Empty for tensors made by bytes, not by shape.
    pub shape: Vec<usize>,
    pub dtype: &'static str,
    pub uploads: u32,
    /// Access number of the last use.
    pub last_use: u64,
    /// Position in the step of the next predicted use (None: not predicted).
    pub next_use: Option<u32>,
}

/// Seconds the host waited at one of the pager's stall sites (`cause`), passed through; logged
/// at trace level, so a run's waits can be told apart (`RUST_LOG=pagetrain::pager=trace`).
pub(super) fn stall(cause: &'static str, seconds: f64) -> f64 {
    if seconds > 0.0 {
        log::trace!("stall: {cause} {:.3} ms", seconds * 1e3);
    }
    seconds
}

/// Running totals since the pager was made.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Counters {
    pub bytes_uploaded: u64,
    pub bytes_written_back: u64,
    pub uploads: u64,
    pub writebacks: u64,
    /// Accesses that found the tensor resident.
    pub hits: u64,
    /// Accesses that had to place it on the GPU.
    pub misses: u64,
    pub evictions: u64,
    /// Tensors moved between slabs inside GPU memory to open a range, instead of evicted, and
    /// their bytes.
    pub relocations: u64,
    pub bytes_relocated: u64,
    pub prefetches: u64,
    /// Seconds the host waited for GPU transfers (staging slots, readbacks).
    pub stall_s: f64,
    /// Seconds spent copying bytes into staging memory.
    pub fill_s: f64,
    /// Seconds the host spent in the pager's `access` (placing, evicting, recording copies,
    /// waiting: `stall_s` is part of it): recording time the GPU may wait on.
    pub access_s: f64,
    /// Seconds submissions waited for the copy threads to fill upload-ring slots (not in
    /// `stall_s`): where uploads through the ring are bound by that memcpy.
    pub fill_wait_s: f64,
    /// Uploads whose bytes were already in staging slots, filled ahead by the plan (their
    /// submission had no memcpy left to wait for), and bytes filled ahead but never used.
    pub prefilled_uploads: u64,
    pub prefill_wasted_bytes: u64,
    /// Uploads by DMA from a pinned store on the ring's path because the tensor's write-back
    /// into it was still in flight (instead of waiting for the GPU to finish it).
    pub uploads_behind_writeback: u64,
    /// Times the trainer halved its micro-batch because one did not fit.
    pub micro_batch_shrinks: u64,
    /// Bytes of activations that recompute (checkpointed blocks, or outputs made again in
    /// backward: `Pager::discard`) did not keep from forward to backward, summed over steps.
    pub recompute_dropped_bytes: u64,
    /// Bytes written back to the host and then freed before anyone read them there: bus
    /// traffic a better plan would not have spent.
    pub writeback_unread_bytes: u64,
    /// Bytes not written back because the previous step's trace showed the tensor freed
    /// before any further read (the plan's saving).
    pub writeback_skipped_bytes: u64,
}

/// The bus traffic of one training step (from one `begin_step` to the next): what the studio
/// plots and reports print.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StepTransfers {
    /// Host → GPU.
    pub bytes_up: u64,
    /// GPU → host (write-backs).
    pub bytes_down: u64,
    /// Wall time of the step.
    pub seconds: f64,
    /// Seconds the host waited for transfers (staging slots, write-backs): transfer time that
    /// compute did not hide.
    pub exposed_s: f64,
    /// Seconds spent copying host bytes into staging memory.
    pub fill_s: f64,
}

impl StepTransfers {
    /// The step's bytes in both directions over its wall time.
    pub fn bus_gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.bytes_up + self.bytes_down) as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }

    /// The difference of two counter readings taken `seconds` apart.
    pub fn between(before: &Counters, after: &Counters, seconds: f64) -> StepTransfers {
        StepTransfers {
            bytes_up: after.bytes_uploaded - before.bytes_uploaded,
            bytes_down: after.bytes_written_back - before.bytes_written_back,
            seconds,
            exposed_s: (after.stall_s - before.stall_s).max(0.0),
            fill_s: (after.fill_s - before.fill_s).max(0.0),
        }
    }
}

/// The pager at one moment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Snapshot {
    pub budget: u64,
    pub gpu_bytes: u64,
    pub peak_gpu_bytes: u64,
    pub host_bytes: u64,
    /// Staging buffers for uploads and write-backs, beside the pool (host-visible memory: in
    /// VRAM behind the BAR for a mapped upload ring on a discrete GPU, host RAM otherwise).
    pub staging_bytes: u64,
    /// The upload ring is pinned host memory (DMA uploads; it takes no GPU memory).
    pub staging_pinned: bool,
    pub counters: Counters,
    /// The last finished step's bus traffic (None before a step has ended).
    pub last_step: Option<StepTransfers>,
    pub tensors: Vec<TensorInfo>,
}

/// Subscribers to snapshots (the studio); senders whose receiver is gone are dropped.
#[derive(Default)]
pub struct Channel {
    senders: Vec<mpsc::Sender<Snapshot>>,
}

impl Channel {
    pub fn subscribe(&mut self) -> mpsc::Receiver<Snapshot> {
        let (tx, rx) = mpsc::channel();
        self.senders.push(tx);
        rx
    }

    pub fn has_subscribers(&self) -> bool {
        !self.senders.is_empty()
    }

    pub fn publish(&mut self, snap: &Snapshot) {
        self.senders.retain(|s| s.send(snap.clone()).is_ok());
    }
}
