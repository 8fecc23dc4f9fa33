//! Generation over a key/value cache: the decode kernels against CPU references, and decoding
//! one position at a time against the full forward pass over the same window.

mod common;

use common::reference as r;
use common::{assert_close, ctx, randn, to64, Guarded};
use pagetrain::kernels::decode as k;
use pagetrain::nn::{Gpt, GptConfig};
use pagetrain::rng::Rng;
use pagetrain::tensor::DType;
use pagetrain::train::generate::{generate, Sampling};
use pagetrain::Context;

#[test]
fn decode_kernels_match_references() {
    let ctx = ctx();
    let mut rng = Rng::new(11);
    // Heads of 5 and 1 channels, a cache longer than the filled part, positions at both ends.
    for (h, d, max_t, pos) in [(3usize, 5usize, 9usize, 6usize), (2, 1, 4, 0), (1, 17, 300, 299)] {
        let c = h * d;
        // The cache's rows 0..=pos hold keys and values; later rows are NaN, which must not be read.
        let rows: Vec<f32> = randn(&mut rng, (pos + 1) * 3 * c, 1.0);
        let mut cache = vec![f32::NAN; max_t * 2 * c];
        for j in 0..=pos {
            cache[j * 2 * c..(j + 1) * 2 * c].copy_from_slice(&rows[j * 3 * c + c..(j + 1) * 3 * c]);
        }
        let qkv = &rows[pos * 3 * c..];
        let (gcache, gqkv) = (Guarded::new(&ctx, cache.len(), Some(&cache)), Guarded::new(&ctx, 3 * c, Some(qkv)));
        let (out, scores) = (Guarded::new(&ctx, c, None), Guarded::new(&ctx, h * max_t, None));
        k::attention(&ctx.kernels, &out.view(), &scores.view(), &gqkv.view(), &gcache.view(), h, pos, c, max_t)
            .unwrap();
        // The last row of a causal window over rows 0..=pos is one decode step.
        let want = r::attention_forward(&to64(&rows), 1, pos + 1, c, h);
        assert_close(&format!("decode_attention h{h} d{d} pos{pos}"), &out.read(&ctx), &want[pos * c..], 1e-4, 1e-5);
        assert!(k::attention(
            &ctx.kernels,
            &out.view(),
            &scores.view(),
            &gqkv.view(),
            &gcache.view(),
            h,
            max_t,
            c,
            max_t
        )
        .is_err());

        // kv_append writes rows pos.. of the cache from qkv's keys and values, nothing else.
        let n_new = (max_t - pos).min(3);
        let fresh = randn(&mut rng, n_new * 3 * c, 1.0);
        let poison = vec![-3.5f32; max_t * 2 * c];
        let gcache = Guarded::new(&ctx, poison.len(), Some(&poison));
        let gnew = Guarded::new(&ctx, fresh.len(), Some(&fresh));
        k::kv_append(&ctx.kernels, &gcache.view(), &gnew.view(), n_new, pos, c).unwrap();
        let mut want = to64(&poison);
        for rr in 0..n_new {
            for j in 0..2 * c {
                want[(pos + rr) * 2 * c + j] = fresh[rr * 3 * c + c + j] as f64;
            }
        }
        assert_close(&format!("kv_append h{h} d{d} pos{pos}"), &gcache.read(&ctx), &want, 0.0, 0.0);

        // decode_embed: wte[token] + wpe[pos].
        let (vocab, token) = (7usize, 5u32);
        let (wte, wpe) = (randn(&mut rng, vocab * c, 1.0), randn(&mut rng, max_t * c, 1.0));
        let (gwte, gwpe, out) = (
            Guarded::new(&ctx, wte.len(), Some(&wte)),
            Guarded::new(&ctx, wpe.len(), Some(&wpe)),
            Guarded::new(&ctx, c, None),
        );
        k::embed(&ctx.kernels, &out.view(), &gwte.view(), &gwpe.view(), token, pos, c).unwrap();
        let want = r::embedding_forward(&[token], &to64(&wte), &to64(&wpe[pos * c..]), 1, c);
        assert_close("decode_embed", &out.read(&ctx), &want, 1e-6, 0.0);
    }
}

/// A small model with awkward sizes whose weights are random (not the initialisation's zero
/// biases and unit gains, which would hide a wrong parameter).
fn random_model(ctx: &Context, seed: u64) -> Gpt {
    let config = GptConfig { n_layer: 2, n_head: 3, n_embd: 24, block_size: 13, vocab_size: 37 };
    let model = Gpt::new(ctx, config, seed).unwrap();
    let mut rng = Rng::new(seed + 1);
    for p in pagetrain::nn::Module::params(&model) {
        ctx.write_f32(&p.value, &randn(&mut rng, p.value.len(), 0.3)).unwrap();
    }
    model
}

/// The logits after `window`, from the full causal forward pass.
fn forward_logits(ctx: &Context, model: &Gpt, window: &[u32]) -> Vec<f32> {
    let all = ctx
        .no_grad(|| {
            let x = ctx.from_u32("window", &[1, window.len()], window)?;
            model.forward(ctx, &x)
        })
        .unwrap();
    let all = pollster::block_on(ctx.to_f32(&all)).unwrap();
    all[all.len() - model.config.vocab_size..].to_vec()
}

fn decode_matches_forward(ctx: &Context, model: &Gpt, rtol: f64, atol: f64) {
    let v = model.config.vocab_size;
    let tokens: Vec<u32> = (0..model.config.block_size as u32).map(|i| (i * 7 + 3) % v as u32).collect();
    let mut cache = model.kv_cache(ctx).unwrap();
    // A 5-token prompt in one causal pass, then one position at a time to the end of the window.
    let mut fed = 5;
    loop {
        let new = if cache.is_empty() { &tokens[..fed] } else { &tokens[fed - 1..fed] };
        let logits = ctx.no_grad(|| model.decode(ctx, &mut cache, new)).unwrap();
        let got = pollster::block_on(ctx.to_f32(&logits)).unwrap();
        let want = forward_logits(ctx, model, &tokens[..fed]);
        assert_close(
            &format!("logits after {fed} tokens ({:?})", model.activation_dtype()),
            &got,
            &to64(&want),
            rtol,
            atol,
        );
        assert_eq!(cache.len(), fed);
        if fed == tokens.len() {
            break;
        }
        fed += 1;
    }
    let err = ctx.no_grad(|| model.decode(ctx, &mut cache, &[1])).err().expect("a full cache refuses more");
    assert!(err.to_string().contains("exceed"), "{err}");
    assert!(model.decode(ctx, &mut model.kv_cache(ctx).unwrap(), &[1]).is_err(), "decoding with gradients on");
}

#[test]
fn decoding_one_position_at_a_time_equals_the_full_forward() {
    let ctx = ctx();
    decode_matches_forward(&ctx, &random_model(&ctx, 5), 2e-4, 2e-4);
}

#[test]
fn decoding_in_f16_equals_the_f16_forward() {
    let ctx = ctx();
    if !common::has_f16(&ctx) {
        return;
    }
    let model = random_model(&ctx, 6).to_half(&ctx).unwrap();
    assert_eq!(model.activation_dtype(), DType::F16);
    // Both paths round activations to f16 at the same points, but sum in different orders.
    decode_matches_forward(&ctx, &model, 2e-2, 2e-2);
}

#[test]
fn greedy_generation_past_the_window_follows_the_forward_pass() {
    let ctx = ctx();
    let model = random_model(&ctx, 9);
    let prompt = [4u32, 17, 2];
    let n = 30; // past block_size 13: the cache restarts over the last half window
    let mut seen = Vec::new();
    let greedy = Sampling { temperature: 0.0, ..Default::default() };
    let got = pollster::block_on(generate(&ctx, &model, &prompt, n, 37, greedy, 1, &mut |t| {
        seen.push(t);
        Ok(())
    }))
    .unwrap();
    assert_eq!(got, seen);
    // The same rule by hand: the argmax of the forward pass over the tokens the cache holds.
    let (block, half) = (13usize, 6usize);
    let mut tokens = prompt.to_vec();
    let mut start = 0;
    for &next in &got {
        if tokens.len() - start > block {
            start = tokens.len() - half;
        }
        let logits = forward_logits(&ctx, &model, &tokens[start..]);
        let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
        assert_eq!(next, best, "token {} of {got:?}", tokens.len() - prompt.len());
        tokens.push(next);
    }
    let bad = pollster::block_on(generate(&ctx, &model, &[99], 1, 37, greedy, 1, &mut |_| Ok(())));
    assert!(bad.unwrap_err().to_string().contains("vocabulary"));
}
