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
    pub prefetches: u64,
    /// Seconds the host waited for GPU transfers (staging slots, readbacks).
    pub stall_s: f64,
    /// Seconds spent copying bytes into staging memory.
    pub fill_s: f64,
    /// Times the trainer halved its micro-batch because one did not fit.
    pub micro_batch_shrinks: u64,
    /// Bytes of activations that recompute (checkpointed blocks) did not keep from forward to
    /// backward, summed over blocks and steps.
    pub recompute_dropped_bytes: u64,
}

/// The pager at one moment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Snapshot {
    pub budget: u64,
    pub gpu_bytes: u64,
    pub peak_gpu_bytes: u64,
    pub host_bytes: u64,
    /// Staging buffers for uploads and write-backs (host-visible GPU memory beside the pool).
    pub staging_bytes: u64,
    pub counters: Counters,
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
