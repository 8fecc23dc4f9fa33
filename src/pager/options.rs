//! How a pager is set up: its sizes and rules ([`PagerOptions`]), and the host store that
//! `--store memory` gets ([`memory_store`]).

use super::host::{HostStore, MemStore};
#[cfg(vulkan_hal)]
use super::pinned_store::PinnedStore;
use super::plan::Policy;
use super::pool::GpuPool;
use super::upload_path::UploadPath;

/// The host store for `--store memory`: pinned host memory where the adapter offers it (the
/// GPU copies to and from it by DMA, see `pinned_store.rs`), else ordinary memory.
/// `PAGETRAIN_PINNED_STORE=0` asks for ordinary memory.
pub fn memory_store(device: &wgpu::Device) -> Box<dyn HostStore> {
    #[cfg(vulkan_hal)]
    if std::env::var("PAGETRAIN_PINNED_STORE").map_or(true, |v| v != "0") {
        if let Ok(store) = PinnedStore::new(device) {
            return Box::new(store);
        }
    }
    let _ = device;
    Box::new(MemStore::new())
}

/// Sizes and rules of a pager.
#[derive(Clone, Debug)]
pub struct PagerOptions {
    /// GPU byte budget; `None`: from the device's memory ([`super::budget::auto_budget`]).
    pub budget: Option<u64>,
    pub policy: Policy,
    /// Most staging buffers for uploads and for write-backs, made as needed, each the size of
    /// the first chunk it carries (chunks of at most `slot_bytes`).
    /// A mapped upload ring on a discrete GPU (VRAM) stays within a quarter of the budget
    /// ([`super::budget::ring_slots`]).
    /// A tensor takes whole slots, so many small slots keep more tensors in flight: on an H200,
    /// GPT-2 (f16) at a quarter budget stepped in 1113 ms with 128 + 128 slots of 8 MiB, 1335 ms
    /// with 16 + 32 of 32 MiB, 1415 ms with 512 + 512 of 2 MiB.
    pub upload_slots: usize,
    pub readback_slots: usize,
    pub slot_bytes: u64,
    /// Accesses to look ahead for uploads.
    pub prefetch_window: usize,
    pub upload: UploadPath,
    /// Evict a dirty tensor without writing it back when the previous step freed it unread and
    /// it has no access left in this step (off: every dirty eviction is written back).
    pub drop_dead_writebacks: bool,
    /// Whether a synchronous call may block on the GPU (natively, yes). The browser cannot: a
    /// map completes only once control returns to it. Without blocking waits the pager waits
    /// only in its futures (`read`, `settle`), evicts a dirty tensor only when the step's plan
    /// says it is not used again before the step ends (its write-back lands at the next await),
    /// and a staging ring that is full grows or falls back to `queue.write_buffer`. Off natively
    /// for tests of the browser's behaviour.
    pub blocking_waits: bool,
    /// Buffers of their own for tensors, or ranges of shared slabs (`PAGETRAIN_GPU_POOL`).
    pub gpu_pool: GpuPool,
}

impl PagerOptions {
    /// For the browser: no blocking waits (see [`PagerOptions::blocking_waits`]) and staging
    /// slots of 64 KiB (a tensor takes whole slots; the demo's tensors are small).
    pub fn browser(budget: Option<u64>) -> PagerOptions {
        PagerOptions {
            budget,
            upload_slots: 32,
            readback_slots: 32,
            slot_bytes: 64 << 10,
            blocking_waits: false,
            // Browsers refuse a writable binding that shares a buffer with another binding.
            gpu_pool: GpuPool::Buffers,
            ..PagerOptions::default()
        }
    }
}

impl Default for PagerOptions {
    fn default() -> Self {
        PagerOptions {
            budget: None,
            policy: Policy::Belady,
            upload_slots: 128,
            readback_slots: 128,
            slot_bytes: 8 << 20,
            prefetch_window: 32,
            upload: UploadPath::Auto,
            drop_dead_writebacks: true,
            blocking_waits: !cfg!(target_arch = "wasm32"),
            gpu_pool: GpuPool::from_env(),
        }
    }
}
