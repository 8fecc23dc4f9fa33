//! The host optimizer's passes on worker threads: the gradient norm is the same to the bit on
//! any number of threads and agrees with a plain f64 sum; the AdamW update matches the f64
//! reference on every element, whatever the thread count. No GPU needed.

mod common;

use common::{assert_close, randn, reference as r, to64};
use half::f16;
use pagetrain::optim::{
    adamw_update, adamw_update_from, sum_of_squares, AdamWConfig, AdamWSlices, AdamWStep, GradSlice, CHUNK,
};
use pagetrain::rng::Rng;

/// Lengths around the chunk size: shorter than one, one short of it, exact, just over, several.
fn awkward_lengths() -> Vec<usize> {
    vec![1, 3, 17, CHUNK - 1, CHUNK, CHUNK + 3, 2 * CHUNK + 17, 1000]
}

#[test]
fn gradient_norm_is_bit_identical_on_any_thread_count() {
    let mut rng = Rng::new(21);
    let grads: Vec<Vec<f32>> = awkward_lengths().into_iter().map(|n| randn(&mut rng, n, 2.0)).collect();
    let scale = 0.7f32;
    let plain = |gs: &[&[f32]]| -> f64 {
        gs.iter().flat_map(|g| g.iter()).map(|&g| ((g * scale) as f64) * ((g * scale) as f64)).sum()
    };
    // All tensors, then single tensors (one shorter than a chunk, one just over).
    let all: Vec<&[f32]> = grads.iter().map(|g| &g[..]).collect();
    for set in [all.clone(), vec![all[1]], vec![all[5]], vec![]] {
        let one = sum_of_squares(&set, scale, 1);
        for threads in [2, 3, 8] {
            let many = sum_of_squares(&set, scale, threads);
            assert_eq!(many.to_bits(), one.to_bits(), "{threads} threads: {many} vs {one} on 1");
        }
        let want = plain(&set);
        assert!((one - want).abs() <= 1e-12 * want.abs(), "chunked {one} vs plain {want}");
        assert!(set.is_empty() || one > 0.0);
    }
}

#[test]
fn host_adamw_update_matches_the_reference_on_any_thread_count() {
    let mut rng = Rng::new(22);
    let c = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, ..Default::default() };
    let step = AdamWStep { config: c, lr: 0.01, scale: 0.8, t: 3 };
    let lengths = awkward_lengths();
    let draw = |rng: &mut Rng, n: usize| {
        let (p, g, m) = (randn(rng, n, 1.0), randn(rng, n, 1.0), randn(rng, n, 0.1));
        let v: Vec<f32> = randn(rng, n, 0.1).iter().map(|x| x * x).collect();
        (p, m, v, g)
    };
    let inputs: Vec<_> = lengths.iter().map(|&n| draw(&mut rng, n)).collect();
    let decay = |i: usize| if i.is_multiple_of(2) { 0.1 } else { 0.0 };
    let mut results = Vec::new();
    for threads in [1, 4] {
        let mut state: Vec<_> = inputs.clone();
        let tensors = state
            .iter_mut()
            .enumerate()
            .map(|(i, (p, m, v, g))| AdamWSlices { p, m, v, g: g[..].into(), decay: decay(i), half: None })
            .collect();
        adamw_update(tensors, &step, threads).unwrap();
        for (i, ((p, m, v, g), (p1, m1, v1, _))) in inputs.iter().zip(&state).enumerate() {
            let n = p.len();
            let (wp, wm, wv) =
                r::adamw_update(&to64(p), &to64(g), &to64(m), &to64(v), 0.01, 0.9, 0.95, 1e-8, decay(i) as f64, 3, 0.8);
            assert_close(&format!("host adamw p {n}, {threads} threads"), p1, &wp, 1e-5, 1e-6);
            assert_close(&format!("host adamw m {n}, {threads} threads"), m1, &wm, 1e-5, 1e-7);
            assert_close(&format!("host adamw v {n}, {threads} threads"), v1, &wv, 1e-5, 1e-7);
        }
        results.push(state);
    }
    assert!(results[0] == results[1], "1 and 4 threads differ");
}

#[test]
fn host_adamw_rejects_slices_of_different_lengths() {
    let (mut p, mut m, mut v, g) = (vec![1.0f32; 5], vec![0.0f32; 5], vec![0.0f32; 4], vec![0.5f32; 5]);
    let c = AdamWConfig::default();
    let step = AdamWStep { config: c, lr: 0.01, scale: 1.0, t: 1 };
    let tensors = vec![AdamWSlices { p: &mut p, m: &mut m, v: &mut v, g: g[..].into(), decay: 0.0, half: None }];
    let err = adamw_update(tensors, &step, 2).unwrap_err();
    assert!(err.to_string().contains("differ in length"), "{err}");
    assert_eq!(p, vec![1.0; 5], "nothing was updated");
}

#[test]
fn host_adamw_writes_the_f16_copies_of_the_values_it_updates() {
    let mut rng = Rng::new(23);
    let c = AdamWConfig::default();
    let step = AdamWStep { config: c, lr: 0.01, scale: 0.5, t: 2 };
    let lengths = awkward_lengths();
    let inputs: Vec<_> = lengths
        .iter()
        .map(|&n| (randn(&mut rng, n, 1.0), randn(&mut rng, n, 0.1), vec![1e-3f32; n], randn(&mut rng, n, 1.0)))
        .collect();
    // The same update without copies: the values the copies must round.
    let mut plain = inputs.clone();
    let tensors =
        plain.iter_mut().map(|(p, m, v, g)| AdamWSlices { p, m, v, g: g[..].into(), decay: 0.1, half: None }).collect();
    adamw_update(tensors, &step, 1).unwrap();
    for threads in [1, 3] {
        let mut state = inputs.clone();
        // poisoned copies: every element must be written
        let mut halves: Vec<Vec<f16>> = lengths.iter().map(|&n| vec![f16::NAN; n]).collect();
        let tensors = state
            .iter_mut()
            .zip(halves.iter_mut())
            .enumerate()
            .map(|(i, ((p, m, v, g), h))| AdamWSlices {
                p,
                m,
                v,
                g: g[..].into(),
                decay: 0.1,
                half: (i % 3 != 1).then_some(&mut h[..]),
            })
            .collect();
        adamw_update(tensors, &step, threads).unwrap();
        for (i, ((state, plain), h)) in state.iter().zip(&plain).zip(&halves).enumerate() {
            assert!(state.0 == plain.0, "tensor {i}: the copy changed the update");
            if i % 3 == 1 {
                assert!(h.iter().all(|x| x.is_nan()), "tensor {i} has no copy, yet it was written");
                continue;
            }
            for (j, (&p, &x)) in plain.0.iter().zip(h).enumerate() {
                assert_eq!(x.to_bits(), f16::from_f32(p).to_bits(), "tensor {i} element {j}: {x} for {p}");
            }
        }
    }
    // a copy of another length is refused before anything is written
    let (mut p, mut m, mut v, g) = (vec![1.0f32; 5], vec![0.0f32; 5], vec![0.0f32; 5], vec![0.5f32; 5]);
    let mut h = vec![f16::ZERO; 4];
    let tensors =
        vec![AdamWSlices { p: &mut p, m: &mut m, v: &mut v, g: g[..].into(), decay: 0.0, half: Some(&mut h) }];
    let err = adamw_update(tensors, &step, 2).unwrap_err();
    assert!(err.to_string().contains("f16 copy 4"), "{err}");
    assert_eq!(p, vec![1.0; 5], "nothing was updated");
}

#[test]
fn host_adamw_on_scaled_f16_gradients_equals_the_update_on_their_f32_values() {
    let mut rng = Rng::new(23);
    let c = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, ..Default::default() };
    let step = AdamWStep { config: c, lr: 0.01, scale: 0.3, t: 4 };
    let lengths = awkward_lengths();
    // f16 gradients as the GPU sends them: large (scaled up by a power of two), unscaled by
    // 2^-12 here, 2^3 for another tensor.
    let unscale = |i: usize| if i.is_multiple_of(2) { 2f32.powi(-12) } else { 8.0 };
    let inputs: Vec<_> = lengths
        .iter()
        .map(|&n| {
            let (p, m) = (randn(&mut rng, n, 1.0), randn(&mut rng, n, 0.1));
            let v: Vec<f32> = randn(&mut rng, n, 0.1).iter().map(|x| x * x).collect();
            let g: Vec<f16> = randn(&mut rng, n, 3000.0).iter().map(|&x| f16::from_f32(x)).collect();
            (p, m, v, g)
        })
        .collect();
    // The reference: the same update on the f32 gradients the f16 ones stand for.
    let mut want = inputs.clone();
    let widened: Vec<Vec<f32>> =
        inputs.iter().enumerate().map(|(i, (.., g))| g.iter().map(|h| h.to_f32() * unscale(i)).collect()).collect();
    let tensors = want
        .iter_mut()
        .zip(&widened)
        .map(|((p, m, v, _), g)| AdamWSlices { p, m, v, g: g[..].into(), decay: 0.1, half: None })
        .collect();
    adamw_update(tensors, &step, 1).unwrap();
    // With and without the f16 copies (the paged f16 step writes them in the same pass: on
    // x86-64 with F16C one fused loop does both), poisoned first.
    for (threads, copies) in [(1, false), (3, false), (1, true), (3, true)] {
        let mut got = inputs.clone();
        let mut halves: Vec<Vec<f16>> = lengths.iter().map(|&n| vec![f16::NAN; n]).collect();
        let tensors = got
            .iter_mut()
            .zip(&mut halves)
            .enumerate()
            .map(|(i, ((p, m, v, g), h))| AdamWSlices {
                p,
                m,
                v,
                g: GradSlice::F16 { values: g, unscale: unscale(i) },
                decay: 0.1,
                half: copies.then_some(&mut h[..]),
            })
            .collect();
        adamw_update(tensors, &step, threads).unwrap();
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            let n = got.0.len();
            let at = format!("tensor {i} ({n}), {threads} threads, copies {copies}");
            assert!(got.0 == want.0 && got.1 == want.1 && got.2 == want.2, "{at}");
            assert!(got.0 != inputs[i].0, "{at} was not updated");
            if copies {
                let exact = halves[i].iter().zip(&want.0).all(|(h, &p)| h.to_bits() == f16::from_f32(p).to_bits());
                assert!(exact, "{at}: an f16 copy is not its value rounded to nearest even");
            } else {
                assert!(halves[i].iter().all(|h| h.is_nan()), "{at}: a copy was written though none was given");
            }
        }
    }
}

#[test]
fn host_adamw_out_of_place_writes_the_bits_of_the_update_in_place_into_aligned_or_unaligned_twins() {
    let mut rng = Rng::new(25);
    let c = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, ..Default::default() };
    let step = AdamWStep { config: c, lr: 0.01, scale: 0.6, t: 4 };
    let lengths = awkward_lengths();
    let inputs: Vec<_> = lengths
        .iter()
        .map(|&n| {
            let v: Vec<f32> = randn(&mut rng, n, 0.1).iter().map(|x| x * x).collect();
            let g: Vec<f16> = randn(&mut rng, n, 1.0).iter().map(|&x| f16::from_f32(x)).collect();
            (randn(&mut rng, n, 1.0), randn(&mut rng, n, 0.1), v, g)
        })
        .collect();
    let unscale = 0.25f32;
    // In place, with f16 copies: what the twins must hold.
    let mut want = inputs.clone();
    let mut want_halves: Vec<Vec<f16>> = lengths.iter().map(|&n| vec![f16::NAN; n]).collect();
    let tensors = want
        .iter_mut()
        .zip(want_halves.iter_mut())
        .map(|((p, m, v, g), h)| AdamWSlices {
            p,
            m,
            v,
            g: GradSlice::F16 { values: g, unscale },
            decay: 0.1,
            half: Some(&mut h[..]),
        })
        .collect();
    adamw_update(tensors, &step, 1).unwrap();
    // Twins 32-byte aligned (streaming stores) and off it by one or three (plain stores),
    // poisoned first.
    for (threads, skew) in [(1, 0), (3, 0), (2, 1), (1, 3)] {
        let mut twins: Vec<_> = lengths
            .iter()
            .map(|&n| (vec![f32::NAN; n + 16], vec![f32::NAN; n + 16], vec![f32::NAN; n + 16], vec![f16::NAN; n + 16]))
            .collect();
        let from: Vec<[&[f32]; 3]> = inputs.iter().map(|(p, m, v, _)| [&p[..], &m[..], &v[..]]).collect();
        let placed: Vec<_> = twins
            .iter()
            .zip(&lengths)
            .map(|((p, m, v, h), &n)| (place(p, skew, n), place(m, skew, n), place(v, skew, n), place(h, skew, n)))
            .collect();
        let into = twins
            .iter_mut()
            .zip(&inputs)
            .zip(&placed)
            .map(|(((p, m, v, h), (_, _, _, g)), (rp, rm, rv, rh))| AdamWSlices {
                p: &mut p[rp.clone()],
                m: &mut m[rm.clone()],
                v: &mut v[rv.clone()],
                g: GradSlice::F16 { values: g, unscale },
                decay: 0.1,
                half: Some(&mut h[rh.clone()]),
            })
            .collect();
        adamw_update_from(from, into, &step, threads).unwrap();
        let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (i, (((p, m, v, h), (rp, rm, rv, rh)), ((wp, wm, wv, _), wh))) in
            twins.iter().zip(&placed).zip(want.iter().zip(&want_halves)).enumerate()
        {
            let what = format!("tensor {i} ({} values), {threads} threads, skew {skew}", wp.len());
            assert_eq!(bits(&p[rp.clone()]), bits(wp), "{what}: values");
            assert_eq!(bits(&m[rm.clone()]), bits(wm), "{what}: first moments");
            assert_eq!(bits(&v[rv.clone()]), bits(wv), "{what}: second moments");
            let hb = |x: &[f16]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(hb(&h[rh.clone()]), hb(wh), "{what}: f16 copies");
            assert!(p[rp.end..].iter().all(|x| x.is_nan()), "{what}: written past its end");
        }
    }
    // (the update moved every tensor: the comparison above is not of copies)
    assert!(want.iter().zip(&inputs).all(|(w, x)| w.0 != x.0));
}

/// Where `n` elements of `x` start `skew` elements past its first 32-byte boundary.
fn place<T>(x: &[T], skew: usize, n: usize) -> std::ops::Range<usize> {
    let start = x.as_ptr().cast::<u8>().align_offset(32) / std::mem::size_of::<T>() + skew;
    start..start + n
}
