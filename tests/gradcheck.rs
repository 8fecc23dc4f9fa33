//! Every op's backward, through the autograd tape, against central finite differences of its
//! CPU f64 forward (the loss is Σ out·w for a random w).

mod common;

use common::reference as r;
use common::{assert_close, ctx, dot, finite_diff, finite_diff_at, randn, to64};
use pagetrain::autograd::Grads;
use pagetrain::ops::{self, MatmulOpts};
use pagetrain::rng::Rng;
use pagetrain::{Context, Tensor};

type CpuForward<'a> = Box<dyn Fn(&[Vec<f64>]) -> Vec<f64> + 'a>;

/// Runs `gpu` on tensors made from `inputs`, compares its output with `cpu`, then compares each
/// input's gradient with finite differences of `cpu`.
fn check(
    ctx: &Context,
    name: &str,
    inputs: &[(Vec<f32>, Vec<usize>)],
    gpu: impl Fn(&Context, &[Tensor]) -> Tensor,
    cpu: CpuForward,
    tol: f64,
) {
    let tensors: Vec<Tensor> = inputs.iter().map(|(d, s)| ctx.from_f32(name, s, d, true).unwrap()).collect();
    let out = gpu(ctx, &tensors);
    let x64: Vec<Vec<f64>> = inputs.iter().map(|(d, _)| to64(d)).collect();
    let want = cpu(&x64);
    let got = pollster::block_on(ctx.to_f32(&out)).unwrap();
    assert_close(&format!("{name} forward"), &got, &want, tol, tol);

    let mut rng = Rng::new(99);
    let w = randn(&mut rng, out.len(), 1.0);
    let dout = ctx.from_f32("dout", out.shape(), &w, false).unwrap();
    let mut grads = Grads::new();
    ctx.backward_from(&out, &dout, &mut grads).unwrap();
    let w64 = to64(&w);
    for (i, t) in tensors.iter().enumerate() {
        let g = grads.get(t).unwrap_or_else(|| panic!("{name}: no gradient for input {i}"));
        let got = pollster::block_on(ctx.to_f32(&g)).unwrap();
        let fd = finite_diff(&x64[i], 1e-5, |xi| {
            let mut all = x64.clone();
            all[i] = xi.to_vec();
            dot(&cpu(&all), &w64)
        });
        assert_close(&format!("{name} d input {i}"), &got, &fd, tol * 10.0, tol * 10.0);
    }
}

#[test]
fn linear_and_matmul_backward_match_finite_differences() {
    let ctx = ctx();
    let mut rng = Rng::new(11);
    for &(b, t, k, n) in &[(1, 1, 1, 1), (2, 3, 17, 5), (3, 5, 3, 65)] {
        let x = randn(&mut rng, b * t * k, 1.0);
        let w = randn(&mut rng, k * n, 1.0);
        let bias = randn(&mut rng, n, 1.0);
        check(
            &ctx,
            "linear",
            &[(x, vec![b, t, k]), (w, vec![k, n]), (bias, vec![n])],
            |ctx, v| ops::linear(ctx, &v[0], &v[1], Some(&v[2])).unwrap(),
            Box::new(move |v| r::matmul_forward(&v[0], &v[1], Some(&v[2]), 1, b * t, n, k, false, false, true, 1.0)),
            1e-4,
        );
    }
    // every transpose combination, batched
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (batch, m, n, k) = (3, 5, 4, 7);
        let a = randn(&mut rng, batch * m * k, 1.0);
        let bm = randn(&mut rng, batch * k * n, 1.0);
        let a_shape = if ta { vec![batch, k, m] } else { vec![batch, m, k] };
        let b_shape = if tb { vec![batch, n, k] } else { vec![batch, k, n] };
        check(
            &ctx,
            &format!("matmul ta={ta} tb={tb}"),
            &[(a, a_shape), (bm, b_shape)],
            |ctx, v| ops::matmul(ctx, &v[0], &v[1], MatmulOpts { trans_a: ta, trans_b: tb, alpha: Some(0.5) }).unwrap(),
            Box::new(move |v| r::matmul_forward(&v[0], &v[1], None, batch, m, n, k, ta, tb, false, 0.5)),
            1e-4,
        );
    }
    // the tied output head: x (B,T,C) · wteᵀ with wte (V,C) shared
    let (b, t, c, v) = (2, 3, 5, 7);
    check(
        &ctx,
        "tied head",
        &[(randn(&mut rng, b * t * c, 1.0), vec![b, t, c]), (randn(&mut rng, v * c, 1.0), vec![v, c])],
        |ctx, x| ops::matmul(ctx, &x[0], &x[1], MatmulOpts { trans_b: true, ..Default::default() }).unwrap(),
        Box::new(move |x| r::matmul_forward(&x[0], &x[1], None, 1, b * t, v, c, false, true, true, 1.0)),
        1e-4,
    );
}

#[test]
fn int8_linear_backward_matches_finite_differences() {
    let ctx = ctx();
    let mut rng = Rng::new(18);
    let (rows, k, n) = (5, 7, 9);
    let w = randn(&mut rng, k * n, 0.5);
    let q = ops::QWeight::quantize(&ctx, "w", &w, k, n).unwrap();
    let deq = pollster::block_on(q.dequantize(&ctx)).unwrap();
    let deq64 = to64(&deq);
    check(
        &ctx,
        "linear_q8",
        &[(randn(&mut rng, rows * k, 1.0), vec![rows, k]), (randn(&mut rng, n, 1.0), vec![n])],
        |ctx, v| ops::linear_q8(ctx, &v[0], &q, Some(&v[1])).unwrap(),
        Box::new(move |v| r::matmul_forward(&v[0], &deq64, Some(&v[1]), 1, rows, n, k, false, false, true, 1.0)),
        1e-4,
    );
}

#[test]
fn mixed_precision_linear_backward_matches_finite_differences() {
    // The products read f16 copies of the weight: forward and dx carry f16 rounding (~5e-4
    // relative), dW and dbias are f32. f16 tensors need shader-f16.
    let ctx = ctx();
    if !common::has_f16(&ctx) {
        return;
    }
    let mut rng = Rng::new(19);
    let (rows, k, n) = (5, 7, 9);
    check(
        &ctx,
        "linear_mixed",
        &[
            (randn(&mut rng, rows * k, 1.0), vec![rows, k]),
            (randn(&mut rng, k * n, 0.5), vec![k, n]),
            (randn(&mut rng, n, 1.0), vec![n]),
        ],
        |ctx, v| {
            let half = ctx.empty("w16", &[k, n], pagetrain::DType::F16, false).unwrap();
            ops::refresh_half(ctx, &half, &v[1]).unwrap();
            ops::linear_mixed(ctx, &v[0], &v[1], &half, Some(&v[2])).unwrap()
        },
        Box::new(move |v| r::matmul_forward(&v[0], &v[1], Some(&v[2]), 1, rows, n, k, false, false, true, 1.0)),
        3e-3,
    );
}

#[test]
fn elementwise_ops_backward_match_finite_differences() {
    let ctx = ctx();
    let mut rng = Rng::new(12);
    for &n in &[1usize, 3, 17, 65] {
        let (a, b) = (randn(&mut rng, n, 1.0), randn(&mut rng, n, 1.0));
        check(
            &ctx,
            "add",
            &[(a.clone(), vec![n]), (b, vec![n])],
            |ctx, v| ops::add(ctx, &v[0], &v[1]).unwrap(),
            Box::new(|v| v[0].iter().zip(&v[1]).map(|(x, y)| x + y).collect()),
            1e-5,
        );
        check(
            &ctx,
            "scale",
            &[(a.clone(), vec![n])],
            |ctx, v| ops::scale(ctx, &v[0], -0.7).unwrap(),
            Box::new(|v| v[0].iter().map(|x| -0.7 * x).collect()),
            1e-5,
        );
        check(
            &ctx,
            "sum",
            &[(a.clone(), vec![n])],
            |ctx, v| ops::sum(ctx, &v[0]).unwrap(),
            Box::new(|v| vec![v[0].iter().sum()]),
            1e-5,
        );
        check(
            &ctx,
            "mean",
            &[(a.clone(), vec![n])],
            |ctx, v| ops::mean(ctx, &v[0]).unwrap(),
            Box::new(|v| vec![v[0].iter().sum::<f64>() / v[0].len() as f64]),
            1e-5,
        );
        // keep inputs away from the kinks, where finite differences are meaningless
        let away: Vec<f32> = a.iter().map(|x| if x.abs() < 0.05 { x + 0.2 } else { *x }).collect();
        check(
            &ctx,
            "gelu",
            &[(away.clone(), vec![n])],
            |ctx, v| ops::gelu(ctx, &v[0]).unwrap(),
            Box::new(|v| r::gelu_forward(&v[0])),
            1e-5,
        );
        check(
            &ctx,
            "relu",
            &[(away, vec![n])],
            |ctx, v| ops::relu(ctx, &v[0]).unwrap(),
            Box::new(|v| r::relu_forward(&v[0])),
            1e-5,
        );
    }
}

#[test]
fn layernorm_and_softmax_backward_match_finite_differences() {
    let ctx = ctx();
    let mut rng = Rng::new(13);
    for &(rows, c) in &[(1, 3), (3, 17), (5, 64)] {
        let x = randn(&mut rng, rows * c, 1.0);
        let w = randn(&mut rng, c, 1.0);
        let b = randn(&mut rng, c, 1.0);
        check(
            &ctx,
            "layernorm",
            &[(x.clone(), vec![rows, c]), (w, vec![c]), (b, vec![c])],
            |ctx, v| ops::layernorm(ctx, &v[0], &v[1], &v[2], 1e-5).unwrap(),
            Box::new(move |v| r::layernorm_forward(&v[0], &v[1], &v[2], rows, c, 1e-5).0),
            2e-4,
        );
        check(
            &ctx,
            "softmax",
            &[(x, vec![rows, c])],
            |ctx, v| ops::softmax(ctx, &v[0]).unwrap(),
            Box::new(move |v| r::softmax_forward(&v[0], rows, c, 0, 1.0)),
            1e-5,
        );
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    let ctx = ctx();
    let mut rng = Rng::new(14);
    for &(b, t, c, h) in &[(1, 1, 4, 1), (2, 5, 6, 2), (1, 17, 12, 3)] {
        let qkv = randn(&mut rng, b * t * 3 * c, 1.0);
        check(
            &ctx,
            &format!("attention b{b} t{t} c{c} h{h}"),
            &[(qkv, vec![b, t, 3 * c])],
            |ctx, v| ops::causal_self_attention(ctx, &v[0], h).unwrap(),
            Box::new(move |v| r::attention_forward(&v[0], b, t, c, h)),
            1e-4,
        );
    }
}

#[test]
fn the_reference_attention_backward_matches_finite_differences() {
    // tests/kernels/attention.rs checks every attention kernel's backward against this CPU reference
    let mut rng = Rng::new(42);
    let (b, t, c, h) = (2, 6, 6, 2);
    let qkv = to64(&randn(&mut rng, b * t * 3 * c, 1.0));
    let w = to64(&randn(&mut rng, b * t * c, 1.0));
    let fd = finite_diff(&qkv, 1e-5, |x| dot(&r::attention_forward(x, b, t, c, h), &w));
    let got: Vec<f32> = r::attention_backward(&qkv, &w, b, t, c, h).iter().map(|&g| g as f32).collect();
    assert_close("reference attention backward", &got, &fd, 1e-5, 1e-6);
}

#[test]
fn attention_across_row_blocks_and_tiles_matches_finite_differences() {
    // T = 70: two row blocks of 64 queries (keys) and three key (query) tiles of 32, the last ragged.
    let ctx = ctx();
    let mut rng = Rng::new(16);
    let (b, t, c, h) = (2, 70, 4, 2);
    let qkv = randn(&mut rng, b * t * 3 * c, 1.0);
    check(
        &ctx,
        "attention over tiles",
        &[(qkv, vec![b, t, 3 * c])],
        |ctx, v| ops::causal_self_attention(ctx, &v[0], h).unwrap(),
        Box::new(move |v| r::attention_forward(&v[0], b, t, c, h)),
        1e-4,
    );
}

#[test]
fn attention_in_f32_at_head_size_64_over_several_tiles_matches_finite_differences() {
    // GPT-2's head size, in f32: at d = 64 the kernels take T = 70 as two row blocks of 64 and
    // three key (query) tiles of 32 (nine of 8 on OpenGL), the last ragged; two heads. Every
    // coordinate would take 54k CPU forwards, so finite differences run at a sample that covers
    // q, k and v of both heads, rows at the edges of blocks and tiles, and three channels.
    let ctx = ctx();
    let mut rng = Rng::new(23);
    let (b, t, h, d) = (1, 70, 2, 64);
    let c = h * d;
    let qkv = randn(&mut rng, b * t * 3 * c, 1.0);
    let x = ctx.from_f32("qkv", &[b, t, 3 * c], &qkv, true).unwrap();
    let out = ops::causal_self_attention(&ctx, &x, h).unwrap();
    let x64 = to64(&qkv);
    let cpu = |x: &[f64]| r::attention_forward(x, b, t, c, h);
    let got = pollster::block_on(ctx.to_f32(&out)).unwrap();
    assert_close("attention d64 forward", &got, &cpu(&x64), 1e-4, 1e-4);

    let w = randn(&mut rng, out.len(), 1.0);
    let dout = ctx.from_f32("dout", out.shape(), &w, false).unwrap();
    let mut grads = Grads::new();
    ctx.backward_from(&out, &dout, &mut grads).unwrap();
    let grad = pollster::block_on(ctx.to_f32(&grads.get(&x).expect("a gradient for qkv"))).unwrap();
    let mut at = Vec::new();
    for row in [0, 1, 31, 32, 33, 63, 64, 65, 69] {
        for part in 0..3 {
            for head in 0..h {
                for ch in [0, 31, 63] {
                    at.push(row * 3 * c + part * c + head * d + ch);
                }
            }
        }
    }
    let w64 = to64(&w);
    let fd = finite_diff_at(&x64, &at, 1e-5, |xi| dot(&cpu(xi), &w64));
    let sampled: Vec<f32> = at.iter().map(|&i| grad[i]).collect();
    assert_close("attention d64 d qkv (sampled)", &sampled, &fd, 1e-3, 1e-3);
}

#[test]
fn fused_head_and_loss_matches_finite_differences_whole_and_in_chunks() {
    let mut rng = Rng::new(17);
    let (n, c, v) = (20, 5, 37);
    let targets: Vec<u32> = (0..n).map(|i| if i == 4 { u32::MAX } else { rng.below(v) as u32 }).collect();
    // With the device's budget the head keeps its logits for backward; an 8 KiB budget makes them
    // in two chunks of 10 rows (a quarter of the budget holds 13) and again in backward.
    for budget in [None, Some(8u64 << 10)] {
        let ctx =
            common::paged_ctx(&pagetrain::pager::PagerOptions { budget, slot_bytes: 16 << 10, ..Default::default() });
        assert_eq!(ops::head_keeps_logits(&ctx, n, v, pagetrain::DType::F32), budget.is_none(), "budget {budget:?}");
        let tg = targets.clone();
        check(
            &ctx,
            &format!("lm_head_loss budget {budget:?}"),
            &[(randn(&mut rng, n * c, 1.0), vec![n, c]), (randn(&mut rng, v * c, 1.0), vec![v, c])],
            |ctx, x| ops::lm_head_loss(ctx, &x[0], &x[1], &targets, Some(u32::MAX)).unwrap(),
            Box::new(move |x| {
                let logits = r::matmul_forward(&x[0], &x[1], None, 1, n, v, c, false, true, true, 1.0);
                vec![r::cross_entropy_forward(&logits, &tg, v, u32::MAX).1]
            }),
            1e-5,
        );
    }
}

/// Where the head's gradients are made: in backward, or in forward for a backward with this
/// d loss, wte's aside or added to its gradient at once.
#[derive(Clone, Copy)]
enum Made {
    InBackward,
    Aside(f32),
    Added(f32),
}

/// Loss and gradients (x, wte) of the head, its gradients made as `made` says, by a backward from
/// the loss with d loss = `seed`, wte's added to `wte_grad` where given (a parameter's
/// accumulating gradient); and the kernels that backward dispatched.
struct HeadRun {
    loss: Vec<f32>,
    dx: Vec<f32>,
    dwte: Vec<f32>,
    backward_dispatches: u64,
}

fn head_run(
    ctx: &Context,
    x: &[f32],
    w: &[f32],
    targets: &[u32],
    made: Made,
    seed: f32,
    wte_grad: Option<&[f32]>,
) -> pagetrain::Result<HeadRun> {
    let (n, v) = (targets.len(), w.len() / (x.len() / targets.len()));
    let c = x.len() / n;
    let xt = ctx.from_f32("x", &[n, c], x, true).unwrap();
    let wt = ctx.from_f32("wte", &[v, c], w, true).unwrap();
    let mut grads = Grads::new();
    let g = ctx.from_f32("wte grad", &[v, c], wte_grad.unwrap_or(&vec![0.0; v * c]), false).unwrap();
    if wte_grad.is_some() || matches!(made, Made::Added(_)) {
        grads.insert_persistent(&wt, g.clone());
    }
    let loss = match made {
        Made::InBackward => ops::lm_head_loss(ctx, &xt, &wt, targets, Some(u32::MAX)).unwrap(),
        Made::Aside(seed) | Made::Added(seed) => {
            let wte_grad = matches!(made, Made::Added(_)).then_some(&g);
            let backward = ops::LossBackward { seed, wte_grad };
            ops::lm_head_loss_for_backward(ctx, &xt, &wt, targets, Some(u32::MAX), backward).unwrap()
        }
    };
    let before = ctx.kernels.dispatch_count();
    ctx.backward(&loss, &mut grads, seed)?;
    let backward_dispatches = ctx.kernels.dispatch_count() - before;
    let read = |t: &Tensor| pollster::block_on(ctx.to_f32(&grads.get(t).expect("a gradient"))).unwrap();
    Ok(HeadRun {
        loss: pollster::block_on(ctx.to_f32(&loss)).unwrap(),
        dx: read(&xt),
        dwte: read(&wt),
        backward_dispatches,
    })
}

#[test]
fn head_gradients_made_in_forward_are_those_backward_makes() {
    let mut rng = Rng::new(23);
    let (n, c, v) = (20, 5, 37);
    let targets: Vec<u32> = (0..n).map(|i| if i == 4 { u32::MAX } else { rng.below(v) as u32 }).collect();
    let (x, w) = (randn(&mut rng, n * c, 1.0), randn(&mut rng, v * c, 1.0));
    let (x64, w64) = (to64(&x), to64(&w));
    let loss_of = |x: &[f64], w: &[f64]| {
        let logits = r::matmul_forward(x, w, None, 1, n, v, c, false, true, true, 1.0);
        r::cross_entropy_forward(&logits, &targets, v, u32::MAX).1
    };
    let seed = 0.75;
    let scaled = |fd: Vec<f64>| fd.iter().map(|g| g * seed as f64).collect::<Vec<_>>();
    let fd_x = scaled(finite_diff(&x64, 1e-5, |xi| loss_of(xi, &w64)));
    let fd_w = scaled(finite_diff(&w64, 1e-5, |wi| loss_of(&x64, wi)));
    // the device's budget keeps the logits for backward; 8 KiB makes them in two chunks of 10
    // rows (a quarter of the budget holds 13), and again in backward
    for budget in [None, Some(8u64 << 10)] {
        let ctx =
            common::paged_ctx(&pagetrain::pager::PagerOptions { budget, slot_bytes: 16 << 10, ..Default::default() });
        let made = head_run(&ctx, &x, &w, &targets, Made::Aside(seed), seed, None).unwrap();
        let again = head_run(&ctx, &x, &w, &targets, Made::InBackward, seed, None).unwrap();
        assert_close(&format!("loss, budget {budget:?}"), &made.loss, &[loss_of(&x64, &w64)], 1e-5, 1e-5);
        assert_close(&format!("dx made in forward, budget {budget:?}"), &made.dx, &fd_x, 1e-4, 1e-4);
        assert_close(&format!("dwte made in forward, budget {budget:?}"), &made.dwte, &fd_w, 1e-4, 1e-4);
        // the same kernels on the same chunks, in the same order: the same bits
        assert_eq!((&made.loss, &made.dx, &made.dwte), (&again.loss, &again.dx, &again.dwte), "budget {budget:?}");
        // backward only filled d loss: the forward made the gradients, and they became x's and wte's
        assert_eq!(made.backward_dispatches, 1, "budget {budget:?}");
        assert!(again.backward_dispatches > 3, "budget {budget:?}: {}", again.backward_dispatches);

        // a parameter's gradient that holds something already is added to: aside, then in
        // backward; or at once in forward, chunk by chunk as backward would (the same bits)
        let g0 = randn(&mut rng, v * c, 1.0);
        let want: Vec<f64> = g0.iter().zip(&fd_w).map(|(&a, &b)| a as f64 + b).collect();
        let onto = head_run(&ctx, &x, &w, &targets, Made::Aside(seed), seed, Some(&g0)).unwrap();
        assert_close(&format!("dwte added to a gradient, budget {budget:?}"), &onto.dwte, &want, 1e-4, 1e-4);
        assert_eq!(onto.dx, made.dx);
        let added = head_run(&ctx, &x, &w, &targets, Made::Added(seed), seed, Some(&g0)).unwrap();
        let plain = head_run(&ctx, &x, &w, &targets, Made::InBackward, seed, Some(&g0)).unwrap();
        assert_close(&format!("dwte added in forward, budget {budget:?}"), &added.dwte, &want, 1e-4, 1e-4);
        assert_eq!((&added.dx, &added.dwte), (&plain.dx, &plain.dwte), "budget {budget:?}");
        assert_eq!(added.backward_dispatches, 1, "budget {budget:?}");

        // a backward with another d loss than the forward assumed makes the gradients again,
        // or, where forward added to wte's gradient already, fails
        let err = head_run(&ctx, &x, &w, &targets, Made::Added(seed), 2.0, Some(&g0)).err().expect("an error");
        assert!(err.to_string().contains("forward added to wte's gradient"), "{err}");
        let other = head_run(&ctx, &x, &w, &targets, Made::Aside(seed), 2.0, None).unwrap();
        let plain = head_run(&ctx, &x, &w, &targets, Made::InBackward, 2.0, None).unwrap();
        assert_eq!((&other.dx, &other.dwte), (&plain.dx, &plain.dwte), "budget {budget:?}");
        assert!(other.backward_dispatches > 3);
        assert_close(
            "dx for d loss 2",
            &other.dx,
            &fd_x.iter().map(|g| g / seed as f64 * 2.0).collect::<Vec<_>>(),
            1e-4,
            1e-4,
        );
    }
}

#[test]
fn embedding_and_cross_entropy_backward_match_finite_differences() {
    let ctx = ctx();
    let mut rng = Rng::new(15);
    let (b, t, c, v, max_t) = (2, 5, 3, 7, 6);
    let tokens: Vec<u32> = (0..b * t).map(|i| [0, 3, 3, 6, 1][i % 5]).collect();
    let tok = ctx.from_u32("tokens", &[b, t], &tokens).unwrap();
    let toks = tokens.clone();
    check(
        &ctx,
        "embedding",
        &[(randn(&mut rng, v * c, 1.0), vec![v, c]), (randn(&mut rng, max_t * c, 1.0), vec![max_t, c])],
        |ctx, x| ops::embedding(ctx, &tok, &x[0], &x[1]).unwrap(),
        Box::new(move |x| r::embedding_forward(&toks, &x[0], &x[1], t, c)),
        1e-5,
    );
    for &(rows, classes) in &[(1, 1), (3, 17), (9, 5)] {
        let targets: Vec<u32> =
            (0..rows).map(|i| if i % 3 == 2 { u32::MAX } else { rng.below(classes) as u32 }).collect();
        let tg = targets.clone();
        check(
            &ctx,
            &format!("cross_entropy {rows}x{classes}"),
            &[(randn(&mut rng, rows * classes, 2.0), vec![rows, classes])],
            |ctx, x| ops::cross_entropy(ctx, &x[0], &targets, Some(u32::MAX)).unwrap(),
            Box::new(move |x| vec![r::cross_entropy_forward(&x[0], &tg, classes, u32::MAX).1]),
            1e-5,
        );
    }
}

#[test]
fn head_loss_chunks_fit_the_storage_binding_limit() {
    // 2048 rows of 20000 logits (164 MB) exceed a 128 MiB storage binding (lavapipe, WebGPU's
    // default): the head must make them in chunks that fit, and, at a 2 GiB budget, keep every
    // chunk for backward.
    let ctx = common::paged_ctx(&pagetrain::pager::PagerOptions { budget: Some(2 << 30), ..Default::default() });
    let mut rng = Rng::new(18);
    let (n, c, v) = (2048, 4, 20000);
    let (x, w) = (randn(&mut rng, n * c, 1.0), randn(&mut rng, v * c, 1.0));
    let targets: Vec<u32> = (0..n).map(|_| rng.below(v) as u32).collect();
    assert!(ops::head_keeps_logits(&ctx, n, v, pagetrain::DType::F32));
    let (xt, wt) = (ctx.from_f32("x", &[n, c], &x, true).unwrap(), ctx.from_f32("wte", &[v, c], &w, true).unwrap());
    let loss = ops::lm_head_loss(&ctx, &xt, &wt, &targets, None).unwrap();
    let mut grads = Grads::new();
    ctx.backward(&loss, &mut grads, 1.0).unwrap();
    // reference, a row at a time: loss = mean(lse − logit[target]), dx[r] = Σ_j (p_j − [j = t]) w_j / n
    let (mut want, mut dx0) = (0.0, vec![0.0; c]);
    for r in 0..n {
        let logits: Vec<f64> =
            (0..v).map(|j| (0..c).map(|k| x[r * c + k] as f64 * w[j * c + k] as f64).sum()).collect();
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        want += (m + sum.ln() - logits[targets[r] as usize]) / n as f64;
        if r == 0 {
            for (j, l) in logits.iter().enumerate() {
                let g = (l - m).exp() / sum - (j == targets[0] as usize) as u8 as f64;
                (0..c).for_each(|k| dx0[k] += g * w[j * c + k] as f64 / n as f64);
            }
        }
    }
    let got = pollster::block_on(ctx.to_f32(&loss)).unwrap();
    assert_close("head loss over the binding limit", &got, &[want], 1e-4, 1e-5);
    let dx = pollster::block_on(ctx.to_f32(&grads.get(&xt).unwrap())).unwrap();
    assert_close("head dx row 0 over the binding limit", &dx[..c], &dx0, 1e-3, 1e-6);
}

#[test]
fn gradients_are_written_where_new_and_added_to_where_not() {
    // x reaches the output through a product with itself (its dA written new, its dB added to),
    // a residual add and a product (the add's gradient first, then the product's dA added), and
    // GELU beside a residual (GELU's dx added to what the add wrote): every op that writes a new
    // input gradient meets one that already holds values, in both orders.
    let ctx = ctx();
    let mut rng = Rng::new(29);
    let n = 5;
    check(
        &ctx,
        "written and added gradients",
        &[(randn(&mut rng, n * n, 1.0), vec![n, n]), (randn(&mut rng, n * n, 1.0), vec![n, n])],
        |ctx, v| {
            let (x, w) = (&v[0], &v[1]);
            let p = ops::matmul(ctx, x, x, MatmulOpts { trans_b: true, ..Default::default() }).unwrap();
            let q = ops::add(ctx, x, &ops::matmul(ctx, x, w, MatmulOpts::default()).unwrap()).unwrap();
            let r = ops::add(ctx, &ops::gelu(ctx, x).unwrap(), x).unwrap();
            ops::add(ctx, &ops::add(ctx, &p, &q).unwrap(), &r).unwrap()
        },
        Box::new(move |v| {
            let (x, w) = (&v[0], &v[1]);
            let p = r::matmul_forward(x, x, None, 1, n, n, n, false, true, false, 1.0);
            let xw = r::matmul_forward(x, w, None, 1, n, n, n, false, false, false, 1.0);
            let g = r::gelu_forward(x);
            (0..n * n).map(|i| p[i] + x[i] + xw[i] + g[i] + x[i]).collect()
        }),
        1e-4,
    );
}

#[test]
fn gradients_passed_on_unchanged_are_copied_before_they_are_added_to() {
    // An add (and a scale by 1) hands its output's gradient to its inputs as it is, no copy, so
    // one tensor is the gradient of several: here each of them gets more gradient later (a and b
    // used twice, x + x the same tensor on both sides), which must go to a copy of its own.
    let ctx = ctx();
    let mut rng = Rng::new(31);
    let n = 6;
    check(
        &ctx,
        "passed-on gradients",
        &[(randn(&mut rng, n * n, 1.0), vec![n, n]), (randn(&mut rng, n * n, 1.0), vec![n, n])],
        |ctx, v| {
            let (x, w) = (&v[0], &v[1]);
            let a = ops::gelu(ctx, x).unwrap();
            let b = ops::matmul(ctx, x, w, MatmulOpts::default()).unwrap();
            let y = ops::add(ctx, &a, &b).unwrap();
            let z = ops::add(ctx, &y, &ops::add(ctx, &a, &b).unwrap()).unwrap();
            let d = ops::scale(ctx, &ops::add(ctx, x, x).unwrap(), 1.0).unwrap();
            ops::add(ctx, &z, &d).unwrap()
        },
        Box::new(move |v| {
            let (x, w) = (&v[0], &v[1]);
            let xw = r::matmul_forward(x, w, None, 1, n, n, n, false, false, false, 1.0);
            let g = r::gelu_forward(x);
            (0..n * n).map(|i| 2.0 * (g[i] + xw[i]) + 2.0 * x[i]).collect()
        }),
        1e-4,
    );
}
