//! Text generation: after a prompt, tokens drawn one at a time from the model's next-token
//! distribution (temperature, top-k, top-p) over a key/value cache, so each new token costs one
//! position and only its logits come back from the GPU.

use super::data::Vocab;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::Gpt;
use crate::rng::Rng;

/// How the next token is drawn from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 takes the most likely token.
    pub temperature: f32,
    /// Draw only among the k most likely tokens (0: all).
    pub top_k: usize,
    /// Draw only among the most likely tokens whose probabilities sum to at least p (1: all).
    pub top_p: f32,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.8, top_k: 0, top_p: 1.0 }
    }
}

impl Sampling {
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::invalid("temperature", format!("{} (use 0 or more; 0 is greedy)", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::invalid("top_p", format!("{} (use a value in (0, 1])", self.top_p)));
        }
        Ok(())
    }

    /// A token index drawn from `logits` (non-finite logits count as impossible).
    pub fn pick(&self, logits: &[f32], rng: &mut Rng) -> u32 {
        let finite = |l: f32| if l.is_finite() { l } else { f32::NEG_INFINITY };
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| finite(logits[*b as usize]).total_cmp(&finite(logits[*a as usize]));
        if self.temperature <= 0.0 || self.top_k == 1 {
            return order.iter().copied().min_by(by_logit).unwrap_or(0);
        }
        if self.top_k > 0 && self.top_k < order.len() {
            order.select_nth_unstable_by(self.top_k - 1, by_logit);
            order.truncate(self.top_k);
        }
        if self.top_p < 1.0 {
            order.sort_unstable_by(by_logit);
        }
        let best = order.iter().map(|&i| finite(logits[i as usize])).fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> =
            order.iter().map(|&i| (((finite(logits[i as usize]) - best) / self.temperature) as f64).exp()).collect();
        let mut total: f64 = weights.iter().sum();
        let mut kept = weights.len();
        if self.top_p < 1.0 {
            // The smallest prefix of the sorted tokens holding at least top_p of the mass.
            let mut mass = 0.0;
            let last = weights.iter().position(|w| {
                mass += w;
                mass >= self.top_p as f64 * total
            });
            kept = last.map_or(weights.len(), |i| i + 1);
            total = weights[..kept].iter().sum();
        }
        if !(total > 0.0 && total.is_finite()) {
            return order[0];
        }
        let mut u = rng.uniform() as f64 * total;
        for (k, w) in weights[..kept].iter().enumerate() {
            u -= w;
            if u <= 0.0 {
                return order[k];
            }
        }
        order[kept - 1]
    }
}

/// The token a prompt-less generation starts from: GPT-2's `<|endoftext|>`, a newline in a
/// character vocabulary that has one, else token 0.
pub fn start_token(vocab: &Vocab) -> u32 {
    match vocab {
        Vocab::Gpt2 => (super::tokenizer::GPT2_VOCAB - 1) as u32,
        Vocab::Chars(chars) => chars.binary_search(&'\n').map_or(0, |i| i as u32),
        Vocab::Ids { .. } => 0,
    }
}

/// `n` tokens after `prompt` (which must not be empty), drawn among the first `vocab_size`
/// logits; `on_token` sees each as it is drawn. When the model's window fills, generation goes on
/// from the last half window of tokens (a fresh cache over them).
#[allow(clippy::too_many_arguments)]
pub async fn generate(
    ctx: &Context,
    model: &Gpt,
    prompt: &[u32],
    n: usize,
    vocab_size: usize,
    sampling: Sampling,
    seed: u64,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    sampling.validate()?;
    if prompt.is_empty() {
        return Err(Error::invalid("generate", "the prompt has no tokens"));
    }
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= model.config.vocab_size) {
        return Err(Error::invalid("generate", format!("prompt token {t} is outside the model's vocabulary")));
    }
    let window = model.config.block_size;
    let mut rng = Rng::new(seed);
    let mut tokens = prompt.to_vec();
    let mut cache = model.kv_cache(ctx)?;
    let mut feed = tokens[tokens.len().saturating_sub(window)..].to_vec();
    for _ in 0..n {
        if cache.len() + feed.len() > window {
            cache = model.kv_cache(ctx)?;
            feed = tokens[tokens.len().saturating_sub((window / 2).max(1))..].to_vec();
        }
        let logits = ctx.no_grad(|| model.decode(ctx, &mut cache, &feed))?;
        let logits = ctx.to_f32(&logits).await?;
        let next = sampling.pick(&logits[..vocab_size.clamp(1, logits.len())], &mut rng);
        tokens.push(next);
        on_token(next)?;
        feed = vec![next];
    }
    Ok(tokens.split_off(prompt.len()))
}

/// A checkpoint's model (f32) and vocabulary, ready to generate: the vocabulary is the
/// checkpoint's characters, GPT-2's BPE (`tokenizer` gpt2, or auto for GPT-2's vocabulary size),
/// or bare ids.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_model(ctx: &Context, dir: &std::path::Path, tokenizer: super::Tokenizer) -> Result<(Gpt, Vocab)> {
    let ckpt = super::checkpoint::load(dir)?;
    let vocab =
        super::run_setup::checkpoint_vocab(tokenizer, &ckpt).unwrap_or(Vocab::Ids { size: ckpt.config.vocab_size });
    if vocab.size() > ckpt.config.vocab_size {
        return Err(Error::invalid(
            "tokenizer",
            format!("{} tokens in the vocabulary, the checkpoint's model has {}", vocab.size(), ckpt.config.vocab_size),
        ));
    }
    let model = Gpt::new(ctx, ckpt.config, 0)?;
    super::checkpoint::load_weights(ctx, &model, &ckpt.weights)?;
    Ok((model, vocab))
}

/// Text of tokens as they are generated: each push returns what is new, holding back a
/// character whose bytes are not all there yet (a BPE token can end inside one).
pub struct TextStream<'a> {
    vocab: &'a Vocab,
    /// Tokens drawn since the text last ended on a whole character: only they are decoded again.
    pending: Vec<u32>,
}

impl<'a> TextStream<'a> {
    pub fn new(vocab: &'a Vocab) -> Self {
        TextStream { vocab, pending: Vec::new() }
    }

    pub fn push(&mut self, token: u32) -> String {
        self.pending.push(token);
        let text = self.vocab.decode(&self.pending);
        if text.ends_with('\u{fffd}') {
            return String::new();
        }
        self.pending.clear();
        text
    }

    /// What is still held back at the end (an incomplete character shows as U+FFFD).
    pub fn finish(self) -> String {
        self.vocab.decode(&self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(s: Sampling, logits: &[f32], n: usize) -> Vec<usize> {
        let mut rng = Rng::new(7);
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            counts[s.pick(logits, &mut rng) as usize] += 1;
        }
        counts
    }

    #[test]
    fn temperature_one_follows_the_softmax() {
        let logits = [0.5f32, -1.0, 2.0, 0.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let n = 40_000;
        let counts = draws(Sampling { temperature: 1.0, top_k: 0, top_p: 1.0 }, &logits, n);
        for (i, &c) in counts.iter().enumerate() {
            let want = (logits[i] as f64).exp() / z;
            assert!((c as f64 / n as f64 - want).abs() < 0.01, "token {i}: {c} of {n}, want {want:.3}");
        }
    }

    #[test]
    fn greedy_top_k_and_top_p_restrict_the_draw() {
        let logits = [0.1f32, 3.0, 2.9, -5.0, f32::NAN, 2.0];
        assert_eq!(draws(Sampling { temperature: 0.0, ..Default::default() }, &logits, 50)[1], 50);
        let k2 = draws(Sampling { temperature: 1.0, top_k: 2, top_p: 1.0 }, &logits, 2000);
        assert_eq!(k2[1] + k2[2], 2000, "only the two best: {k2:?}");
        assert!(k2[1] > 800 && k2[2] > 800, "both drawn: {k2:?}");
        // p(1) ≈ 0.42 of the finite mass: top_p 0.3 keeps token 1 alone, 0.6 adds token 2.
        assert_eq!(draws(Sampling { temperature: 1.0, top_k: 0, top_p: 0.3 }, &logits, 500)[1], 500);
        let p6 = draws(Sampling { temperature: 1.0, top_k: 0, top_p: 0.6 }, &logits, 2000);
        assert_eq!(p6[1] + p6[2], 2000, "{p6:?}");
        assert_eq!(p6[4], 0, "NaN is never drawn");
    }

    #[test]
    fn streamed_text_holds_back_split_characters() {
        let vocab = Vocab::Gpt2;
        let text = "naïve café — 東京";
        let ids = super::super::tokenizer::gpt2_encode(text);
        let mut stream = TextStream::new(&vocab);
        let mut shown = String::new();
        for &t in &ids {
            let piece = stream.push(t);
            assert!(!piece.contains('\u{fffd}'), "{piece:?}");
            shown.push_str(&piece);
        }
        assert_eq!(shown, text);
        assert!(ids.len() > text.split(' ').count(), "some character spans several tokens");
    }

    #[test]
    fn bad_settings_are_refused() {
        for s in [
            Sampling { temperature: -1.0, ..Default::default() },
            Sampling { temperature: f32::NAN, ..Default::default() },
            Sampling { top_p: 0.0, ..Default::default() },
            Sampling { top_p: 1.5, ..Default::default() },
        ] {
            assert!(s.validate().is_err(), "{s:?}");
        }
    }
}
