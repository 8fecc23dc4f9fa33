//! Recompute switched during a paged run, by hand and by the trial that measures it
//! (`TrainConfig::auto_recompute`): the losses stay those of the resident run.

use super::{cfg, context, losses, remade_bytes_per_step, tmpdir, to64};
use crate::common::assert_close;
use pagetrain::train::{TrainConfig, Trainer};

#[test]
fn recompute_switched_on_and_off_in_a_paged_run_gives_the_resident_losses() {
    let out = tmpdir("recompute-switch");
    let fixed = TrainConfig { auto_recompute: false, ..cfg(&out) };
    let resident = context(None);
    let (full, _) = losses(&resident, fixed.clone(), 8);
    let paged = context(Some(resident.pager.live_bytes().1 / 4));
    let mut t = Trainer::new(&paged, fixed, None).unwrap();
    // Each change makes a step unlike the last: a tensor the last step freed unread may be read
    // in this one, so its write-back must not be dropped by the last step's plan.
    let mut l = Vec::new();
    for on in [false, true, true, false, false, true, false, true] {
        t.set_recompute(on);
        l.push(pollster::block_on(t.train_step(&paged)).unwrap());
    }
    assert!(paged.pager.counters().evictions > 0, "the run did not page");
    assert!(t.model.recomputes());
    assert_close("paged, recompute switched", &l, &to64(&full), 0.0, 1e-6);
}

#[test]
fn a_paged_run_times_steps_with_and_without_recompute_and_keeps_the_faster() {
    let out = tmpdir("recompute-trial");
    let steps = 14;
    let resident = context(None);
    let (full, t) = losses(&resident, cfg(&out), steps);
    assert!(t.recompute_decision().is_none() && !t.model.recomputes(), "a resident run has nothing to measure");
    let budget = resident.pager.live_bytes().1 / 4;

    let paged = context(Some(budget));
    let (l, t) = losses(&paged, cfg(&out), steps);
    let why = t.recompute_decision().expect("a paged run measured recompute").to_string();
    println!("{why}");
    assert!(!t.trials_running());
    assert_eq!(t.model.recomputes(), why.starts_with("recompute on"), "{why}");
    assert!(why.contains("ms a step recomputed") && why.contains("ms kept from forward"), "{why}");
    assert_close("paged with the recompute trial", &l, &to64(&full), 0.0, 1e-6);

    let off = context(Some(budget));
    let (_, t) = losses(&off, TrainConfig { auto_recompute: false, ..cfg(&out) }, steps);
    assert!(t.recompute_decision().is_none() && !t.model.recomputes(), "auto_recompute off measured anyway");
    // Remaking alone from the second step (LayerNorm and MLP outputs); a step with whole blocks
    // recomputed would drop more.
    let remade = remade_bytes_per_step(&t, &out, 10);
    assert_eq!(off.pager.counters().recompute_dropped_bytes, remade * (steps as u64 - 1), "blocks recomputed");
}
