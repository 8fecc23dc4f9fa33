//! `PAGETRAIN_PROFILE=1` (here `=shapes`, which also names products by shape) must not change
//! what the kernels compute. Where the adapter writes
//! timestamps inside compute passes, the profile reads them back (a submission and a wait) each
//! time its query set fills, in the middle of whatever the step is recording; a first version
//! did that between a dispatch's uniforms being stored and the dispatch being recorded, so that
//! dispatch ran with another one's parameters (GPT-2's f16 step on the H200 overflowed).
//!
//! Its own test binary: the profile is switched on by the environment when the context is made.
//! Adapters without timestamps inside passes (OpenGL, browsers) profile by waiting for each
//! dispatch, which this test checks too; `PAGETRAIN_REQUIRE_TIMESTAMPS=1` (CI sets it for
//! lavapipe, which has them; set it on GPUs that do) fails the test where the read-back path
//! cannot run.

mod common;

use common::{ctx, Guarded};
use pagetrain::kernels::elementwise;
use pagetrain::pager::View;

/// More dispatches than the profile's query set holds pairs for (2048), so it is read back
/// while the loop records.
const DISPATCHES: usize = 2600;
/// f32s a dispatch fills: 256 bytes, the storage-binding offset alignment.
const SLOT: usize = 64;

#[test]
fn profiled_dispatches_each_run_with_their_own_parameters() {
    std::env::set_var("PAGETRAIN_PROFILE", "shapes");
    let ctx = ctx();
    let (method, _) = ctx.kernels.profile_method().expect("PAGETRAIN_PROFILE=1 switches the profile on");
    if method != "timestamps" {
        let missing = format!("{} profiles by {method}", ctx.gpu.describe());
        common::skip_unless_required("PAGETRAIN_REQUIRE_TIMESTAMPS", &missing, "the read-back in mid-step");
    }
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
