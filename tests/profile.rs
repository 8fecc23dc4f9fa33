//! `PAGETRAIN_PROFILE=1` (here `=shapes`, which also names products by shape) must not change
//! what the kernels compute. Where the adapter writes
//! timestamps inside compute passes, the profile reads them back (a submission and a wait) each
//! time its query set fills, in the middle of whatever the step is recording; a first version
//! did that between a dispatch's uniforms being stored and the dispatch being recorded, so that
//! dispatch ran with another one's parameters (GPT-2's f16 step on the H200 overflowed).
//!
//! `PAGETRAIN_PROFILE=timeline` must find the time the GPU spent waiting between dispatches.
//!
//! Its own test binary: the profile is switched on by the environment when the context is made
//! (each test sets it and makes its context under `ENV`).
//! Adapters without timestamps inside passes (OpenGL, browsers) profile by waiting for each
//! dispatch, which this test checks too; `PAGETRAIN_REQUIRE_TIMESTAMPS=1` (CI sets it for
//! lavapipe, which has them; set it on GPUs that do) fails the test where the read-back path
//! cannot run.

mod common;

use common::{ctx, Guarded};
use pagetrain::kernels::elementwise;
use pagetrain::pager::View;

/// Held while a test sets `PAGETRAIN_PROFILE` and makes its context.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn profiled_ctx(how: &str) -> pagetrain::context::Context {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("PAGETRAIN_PROFILE", how);
    ctx()
}

/// The profile times by timestamps here, or the adapter has none and a skip is allowed.
fn stamped_or_skip(ctx: &pagetrain::context::Context, what: &str) -> bool {
    let (method, _) = ctx.kernels.profile_method().expect("PAGETRAIN_PROFILE switches the profile on");
    if method != "timestamps" {
        let missing = format!("{} profiles by {method}", ctx.gpu.describe());
        common::skip_unless_required("PAGETRAIN_REQUIRE_TIMESTAMPS", &missing, what);
        return false;
    }
    true
}

/// More dispatches than the profile's query set holds pairs for (2048), so it is read back
/// while the loop records.
const DISPATCHES: usize = 2600;
/// f32s a dispatch fills: 256 bytes, the storage-binding offset alignment.
const SLOT: usize = 64;

#[test]
fn profiled_dispatches_each_run_with_their_own_parameters() {
    let ctx = profiled_ctx("shapes");
    stamped_or_skip(&ctx, "the read-back in mid-step");
    let out = Guarded::new(&ctx, DISPATCHES * SLOT, None);
    // Every dispatch its own value and length: a dispatch that read another's parameters
    // leaves a slot with the wrong value, or part of it NaN.
    let value = |i: usize| i as f32 * 0.25 - 300.0;
    let len = |i: usize| SLOT - i % 5;
    for i in 0..DISPATCHES {
        let bytes = (len(i) * 4) as u64;
        let slot = View { offset: (i * SLOT * 4) as u64, size: bytes, ..out.view() };
        elementwise::fill(&ctx.kernels, &slot, value(i), len(i)).expect("fill");
    }
    let got = out.read(&ctx);
    for i in 0..DISPATCHES {
        let s = &got[i * SLOT..(i + 1) * SLOT];
        for (j, &v) in s.iter().enumerate() {
            if j < len(i) {
                assert_eq!(v, value(i), "dispatch {i} of {DISPATCHES}, element {j}: another dispatch's parameters?");
            } else {
                assert!(v.is_nan(), "dispatch {i}, element {j} past its length {} was written: {v}", len(i));
            }
        }
    }
    // a product of the adapter's variant, named by its shape (=shapes)
    let (m, n, k) = (33, 17, 9);
    let (a, b, c) = (
        Guarded::new(&ctx, m * k, Some(&vec![0.5; m * k])),
        Guarded::new(&ctx, k * n, Some(&vec![0.25; k * n])),
        Guarded::new(&ctx, m * n, None),
    );
    let dummy = Guarded::new(&ctx, 4, Some(&[0.0; 4]));
    let g = pagetrain::kernels::matmul::Gemm::new(m, n, k);
    pagetrain::kernels::matmul::matmul(&ctx.kernels, &c.view(), &a.view(), &b.view(), None, &dummy.view(), g).unwrap();
    assert!(c.read(&ctx).iter().all(|&v| v == 0.5 * 0.25 * k as f32), "the profiled product");
    let profile = ctx.kernels.profile();
    let fills = profile.iter().find(|(entry, ..)| *entry == "fill").map_or(0, |e| e.1);
    assert_eq!(fills, DISPATCHES as u64, "the profile counted {fills} fill dispatches: {profile:?}");
    let products: Vec<_> = profile.iter().filter(|(entry, ..)| entry.starts_with("matmul")).collect();
    assert!(
        products.len() == 1 && products[0].0.contains("33x17x9 nn x1") && products[0].1 == 1,
        "one product named by its shape: {products:?}"
    );
}

/// Two marked steps of fills; in the first the host sleeps between its second and third
/// dispatch, so the GPU idles there.
#[test]
fn the_timeline_finds_where_the_gpu_waited_for_the_host() {
    let ctx = profiled_ctx("timeline");
    if !stamped_or_skip(&ctx, "the timeline") {
        assert!(ctx.kernels.profile_timeline().is_empty(), "no timeline without timestamps");
        return;
    }
    let out = Guarded::new(&ctx, 4 * SLOT, None);
    let fill = |i: usize| {
        let slot = View { offset: (i * SLOT * 4) as u64, size: SLOT as u64 * 4, ..out.view() };
        elementwise::fill(&ctx.kernels, &slot, i as f32 + 0.5, SLOT).expect("fill");
    };
    const SLEEP_MS: f64 = 40.0;
    ctx.kernels.profile_step();
    fill(0);
    fill(1);
    ctx.sync().expect("sync");
    std::thread::sleep(std::time::Duration::from_secs_f64(SLEEP_MS * 1e-3));
    fill(2);
    ctx.kernels.profile_step();
    fill(3);
    fill(0);
    let got = out.read(&ctx);
    assert!(got.chunks(SLOT).enumerate().all(|(i, s)| s.iter().all(|&v| v == i as f32 + 0.5)), "the fills ran");
    let steps = ctx.kernels.profile_timeline();
    assert_eq!(steps.len(), 2, "{steps:?}");
    let first = &steps[0];
    assert_eq!(first.dispatches, 3, "{first:?}");
    let longest = &first.gaps[0];
    assert_eq!((longest.after_index, longest.before, longest.after), (2, "fill", "fill"), "{first:?}");
    assert!(
        longest.ms >= SLEEP_MS * 0.9 && !longest.profiler_wait,
        "the GPU idled while the host slept {SLEEP_MS} ms: {first:?}"
    );
    assert!(first.kernel_ms > 0.0 && first.kernel_ms < first.span_ms - longest.ms, "{first:?}");
    assert!(first.between_ms() >= longest.ms, "{first:?}");
    assert_eq!(steps[1].dispatches, 2, "{steps:?}");
}
