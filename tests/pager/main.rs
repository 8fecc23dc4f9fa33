//! The pager's invariants: contents always equal a plain in-memory model, resident bytes never
//! exceed the budget, flushed files hold every value, a paged run computes exactly what a
//! resident one does, and faults are errors that lose nothing. One test binary; the helpers
//! shared by its parts are here.

mod faults;
mod model;
mod state;
mod training;

use std::collections::HashMap;
use std::path::PathBuf;

use pagetrain::autograd::Grads;
use pagetrain::device::Gpu;
use pagetrain::kernels::elementwise;
use pagetrain::nn::{Gpt, GptConfig, Module};
use pagetrain::optim::{AdamW, AdamWConfig};
use pagetrain::pager::plan::{self, Key, Policy};
use pagetrain::pager::{GpuPool, HostRange, HostStore, MemStore, MmapStore, PagerOptions, UploadPath};
use pagetrain::{Context, Error, Tensor};
use proptest::prelude::*;

fn gpu() -> Gpu {
    pollster::block_on(Gpu::new(&Default::default())).expect("a GPU adapter")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-pager-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Small rings so that even small tests wrap around them.
fn opts(budget: u64, policy: Policy) -> PagerOptions {
    PagerOptions {
        budget: Some(budget),
        policy,
        upload_slots: 2,
        readback_slots: 2,
        slot_bytes: 8192,
        prefetch_window: 8,
        upload: UploadPath::Ring,
        drop_dead_writebacks: true,
        blocking_waits: true,
        gpu_pool: GpuPool::Buffers,
    }
}

/// Whether this adapter offers `path`: pinned memory on every Vulkan adapter, zero-copy where
/// memory is unified, the ring everywhere.
fn offers(ctx: &Context, path: UploadPath) -> bool {
    match path {
        UploadPath::Pinned => ctx.gpu.info.backend == wgpu::Backend::Vulkan,
        UploadPath::ZeroCopy => ctx.gpu.unified_memory(),
        _ => true,
    }
}

/// A GPU and a host store in its pinned memory, on Vulkan (where it must be offered); `None`
/// elsewhere.
fn pinned_store() -> Option<(Gpu, pagetrain::pager::PinnedStore)> {
    let gpu = gpu();
    if gpu.info.backend != wgpu::Backend::Vulkan {
        return None;
    }
    let store = pagetrain::pager::PinnedStore::new(&gpu.device).expect("pinned memory on a Vulkan adapter");
    Some((gpu, store))
}

/// A path the adapter offers is the one taken (so its test cannot pass on the ring instead);
/// one it does not offer falls back to the ring and says why.
fn assert_offered_path_taken(ctx: &Context, path: UploadPath) {
    let why = ctx.pager.upload_path();
    if offers(ctx, path) {
        assert_eq!(ctx.pager.upload_path_kind(), path, "{} offers {path:?}, but: {why}", ctx.gpu.describe());
    } else {
        assert_eq!(ctx.pager.upload_path_kind(), UploadPath::Ring, "{why}");
        assert!(why.starts_with("staging ring (no "), "the fallback says why: {why}");
    }
}

fn read(ctx: &Context, t: &Tensor) -> Vec<f32> {
    pollster::block_on(ctx.to_f32(t)).unwrap()
}

/// Bitwise equality, reporting the first difference rather than both vectors.
fn assert_same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: first difference at {i}: got {} want {}", got[i], want[i]);
    }
}

/// Tensor sizes come from a few values so that ops find operands of equal length.
fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((seed as usize).wrapping_mul(31).wrapping_add(i * 7) % 1001) as f32 * 0.25 - 100.0).collect()
}

fn location(ctx: &Context, t: &Tensor) -> pagetrain::pager::Location {
    ctx.pager.snapshot().tensors.iter().find(|i| i.id == t.id()).expect("a live tensor").location
}
