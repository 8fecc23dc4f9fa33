//! The pager as the browser runs it, natively: no blocking waits (a map completes there only once
//! control returns to the event loop), so transfers are waited for only in futures — the loss
//! read-back and `Pager::settle` between steps. The web demo's own run (`web/demo.toml`) at its
//! budget must give a resident run's losses bit for bit while evicting and re-uploading tensors
//! every step, and budgets it cannot fit must be errors, never a hang.

use pagetrain::pager::{Counters, PagerOptions};
use pagetrain::train::{parse_bytes, RunFile, TrainConfig, Trainer};
use pagetrain::{Context, ContextOptions};

const DEMO: &str = include_str!("../web/demo.toml");
const STEPS: usize = 8;

fn demo() -> (TrainConfig, u64) {
    let file = RunFile::parse(DEMO).expect("web/demo.toml parses");
    let cfg = file.apply(TrainConfig::default()).expect("web/demo.toml is a valid run");
    let budget = parse_bytes(file.gpu_budget.as_deref().expect("web/demo.toml sets gpu_budget")).unwrap();
    (cfg, budget)
}

/// `STEPS` steps of the demo as the web page drives them: a step, then the transfers settled.
fn train(pager: PagerOptions) -> pagetrain::Result<(Vec<f32>, Counters, u64)> {
    let ctx = pollster::block_on(Context::new(&ContextOptions { pager, ..Default::default() }))?;
    let mut trainer = Trainer::new(&ctx, demo().0, None)?;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        losses.push(pollster::block_on(trainer.train_step(&ctx))?);
        pollster::block_on(ctx.pager.settle())?;
    }
    Ok((losses, ctx.pager.counters(), ctx.pager.live_bytes().1))
}

#[test]
fn demo_run_without_blocking_waits_pages_and_matches_a_resident_run() {
    let (_, budget) = demo();
    let (resident, resident_counters, footprint) = train(PagerOptions::default()).unwrap();
    let (paged, c, _) = train(PagerOptions::browser(Some(budget))).unwrap();
    eprintln!("footprint {footprint} B, budget {budget} B; resident {resident:?}; browser {paged:?}; {c:?}");
    assert!(budget < footprint * 9 / 10, "the demo's budget {budget} must be well below its footprint {footprint}");
    assert_eq!(resident_counters.evictions, 0, "the resident run evicted");
    assert_eq!(paged, resident, "paging without blocking waits changed the losses");
    assert!(paged[STEPS - 1] < paged[0] - 0.3, "the loss did not fall: {paged:?}");
    // Every step after the first two (whose plan is still being learnt) evicts and re-uploads.
    assert!(c.evictions >= STEPS as u64, "{} evictions in {STEPS} steps", c.evictions);
    assert!(c.writebacks > 0, "no dirty tensor was written back");
    assert!(
        c.uploads > resident_counters.uploads + STEPS as u64,
        "no re-uploads: {} vs {}",
        c.uploads,
        resident_counters.uploads
    );
}

#[test]
fn full_staging_rings_fall_back_without_waiting_and_change_nothing() {
    // One 4 KiB slot each way: most uploads go through `queue.write_buffer`, the readback ring
    // grows within each step; the numbers must not move.
    let (_, budget) = demo();
    let (resident, _, _) = train(PagerOptions::default()).unwrap();
    let tiny =
        PagerOptions { upload_slots: 1, readback_slots: 1, slot_bytes: 4096, ..PagerOptions::browser(Some(budget)) };
    let (paged, c, _) = train(tiny).unwrap();
    assert_eq!(paged, resident, "tiny staging rings changed the losses");
    assert!(c.evictions >= STEPS as u64 && c.writebacks > 0, "{c:?}");
}

#[test]
fn budgets_the_browser_cannot_fit_are_errors() {
    // Below the largest tensor: refused as the tensor is made.
    let err = train(PagerOptions::browser(Some(8 << 10))).unwrap_err();
    assert!(err.to_string().contains("budget"), "{err}");
    // Above every tensor but below what a step must keep on the GPU when dirty tensors can only
    // leave at its end: an error from the step (the trainer first halves its micro-batch).
    let err = train(PagerOptions::browser(Some(160 << 10))).unwrap_err();
    assert!(err.to_string().contains("budget"), "{err}");
}
