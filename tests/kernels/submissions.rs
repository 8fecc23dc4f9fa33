//! How recorded dispatches reach the GPU: in submissions of 96 commands, except right after the
//! host waited for everything, when the GPU is idle and the first submissions are small.

use super::*;

#[test]
fn after_a_full_wait_submissions_start_small_and_double() {
    let ctx = ctx();
    let n = 1000;
    let x = Guarded::new(&ctx, n, Some(&randn(&mut Rng::new(3), n, 1.0)));
    let out = Guarded::new(&ctx, n, None);
    let dispatch = |count: usize| {
        for i in 0..count {
            kernels::elementwise::scale_forward(&ctx.kernels, &out.view(), &x.view(), 1.0 + i as f32, n).unwrap();
        }
    };
    let submitted = || ctx.recorder.submissions();
    ctx.sync().unwrap();
    let start = submitted();
    // 4 + 8 + 16 + 32 + 64 commands: five submissions (96 at a time would have made one)
    dispatch(124);
    assert_eq!(submitted() - start, 5, "after the wait: submissions of 4, 8, 16, 32 and 64 commands");
    // and from then on 96 at a time
    dispatch(96);
    assert_eq!(submitted() - start, 6, "the next 96 commands go in one submission");
    dispatch(95);
    assert_eq!(submitted() - start, 6, "95 commands stay recorded");
    // a wait for one submission, not for everything, changes nothing
    ctx.recorder.wait(ctx.recorder.flush()).unwrap();
    let partial = submitted();
    dispatch(95);
    assert_eq!(submitted(), partial);
    ctx.sync().unwrap();
    assert_close(
        "the last scale",
        &out.read(&ctx),
        &to64(&x.read(&ctx)).iter().map(|v| v * 95.0).collect::<Vec<_>>(),
        1e-6,
        0.0,
    );
}
