//! The upload path switched during a paged run, by hand and by the trial that measures it
//! (`train::upload_trial`): the losses stay those of the resident run.

use super::{cfg, context, losses, tmpdir, to64};
use crate::common::assert_close;
use pagetrain::pager::UploadPath;
use pagetrain::train::{TrainConfig, Trainer};

/// Losses of 8 steps at `paged`'s budget with the upload path switched every two steps (ring,
/// DMA, DMA, ring), and how many uploads went each way.
fn switched_losses(paged: &pagetrain::Context, config: TrainConfig) -> (Vec<f32>, [u64; 2]) {
    let mut t = Trainer::new(paged, config, None).unwrap();
    let mut l = Vec::new();
    let mut uploads_each_way = [0, 0];
    for path in [UploadPath::Ring, UploadPath::Pinned, UploadPath::Pinned, UploadPath::Ring] {
        paged.pager.try_upload_path(path);
        assert_eq!(paged.pager.upload_path_kind(), path);
        let what = if path == UploadPath::Pinned { "pinned host memory (on trial" } else { "staging ring (on trial" };
        assert!(paged.pager.upload_path().starts_with(what), "{path:?}: {}", paged.pager.upload_path());
        let before = paged.pager.counters().uploads;
        for _ in 0..2 {
            l.push(pollster::block_on(t.train_step(paged)).unwrap());
        }
        uploads_each_way[usize::from(path == UploadPath::Pinned)] += paged.pager.counters().uploads - before;
    }
    assert!(paged.pager.counters().evictions > 0, "the run did not page");
    (l, uploads_each_way)
}

#[test]
fn uploads_switched_between_the_ring_and_pinned_memory_mid_run_give_the_resident_losses() {
    let out = tmpdir("upload-switch");
    let fixed = TrainConfig { auto_recompute: false, ..cfg(&out) };
    let resident = context(None);
    let (full, _) = losses(&resident, fixed.clone(), 8);
    let budget = resident.pager.live_bytes().1 / 4;
    // The host store in files or memory: DMA goes through a staging ring in pinned memory.
    let paged = context(Some(budget));
    let pinned = paged.pager.offer_upload_trial();
    println!("pinned memory offered: {pinned} ({})", paged.gpu.describe());
    let (l, uploads) = switched_losses(&paged, fixed.clone());
    assert!(uploads.iter().all(|&u| u > 0), "uploads each way: {uploads:?}");
    assert_close("paged, upload path switched", &l, &to64(&full), 0.0, 1e-6);
    // The host store in pinned memory (Vulkan): DMA straight from it, no staging.
    let gpu = pollster::block_on(pagetrain::device::Gpu::new(&Default::default())).expect("a GPU adapter");
    if gpu.info.backend != wgpu::Backend::Vulkan {
        return;
    }
    let store = pagetrain::pager::PinnedStore::new(&gpu.device).expect("pinned memory on Vulkan");
    let opts = pagetrain::pager::PagerOptions { budget: Some(budget), slot_bytes: 64 << 10, ..Default::default() };
    let paged = pagetrain::Context::with_store(gpu, Box::new(store), &opts);
    assert!(paged.pager.describe_store().starts_with("pinned"), "{}", paged.pager.describe_store());
    let (l, uploads) = switched_losses(&paged, fixed);
    assert!(uploads.iter().all(|&u| u > 0), "pinned store, uploads each way: {uploads:?}");
    assert_close("paged from a pinned store, upload path switched", &l, &to64(&full), 0.0, 1e-6);
}

#[test]
fn a_paged_run_times_steps_through_the_ring_and_by_dma_and_keeps_the_faster() {
    let out = tmpdir("upload-trial");
    let steps = 14;
    let quick = TrainConfig { auto_recompute: false, ..cfg(&out) };
    let resident = context(None);
    let (full, t) = losses(&resident, quick.clone(), steps);
    assert!(t.upload_decision().is_none(), "a resident run has nothing to measure");
    let budget = resident.pager.live_bytes().1 / 4;

    let paged = context(Some(budget));
    if !paged.pager.offer_upload_trial() {
        // (GL: no pinned memory; CI runs this suite on lavapipe, whose Vulkan has it)
        assert_ne!(paged.gpu.info.backend, wgpu::Backend::Vulkan, "Vulkan offers pinned memory");
        return;
    }
    let (l, t) = losses(&paged, quick.clone(), steps);
    let decided = t.upload_decision().expect("a paged run measured its uploads");
    let why = paged.pager.upload_path();
    println!("{why}");
    assert!(!t.trials_running());
    assert_eq!(why, decided.to_string(), "the pager says what the trial kept");
    let kept = if decided.pinned { UploadPath::Pinned } else { UploadPath::Ring };
    assert_eq!(paged.pager.upload_path_kind(), kept, "{why}");
    assert!(why.contains("ms a step by DMA") && why.contains("through the staging ring"), "{why}");
    assert!(!paged.pager.upload_trial_offered(), "offered again after deciding");
    assert_close("paged with the upload trial", &l, &to64(&full), 0.0, 1e-6);

    // Asked for a path (or `auto` measuring it at start-up, on unified memory): no trial.
    let asked = context(Some(budget));
    let (_, t) = losses(&asked, quick, steps);
    assert!(t.upload_decision().is_none(), "measured without the offer: {}", asked.pager.upload_path());
}
