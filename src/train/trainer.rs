//! The training loop: batches from the data, forward, backward, AdamW, evaluation, sampling,
//! checkpoints. Progress goes to a [`Reporter`] (the CLI's progress bar; later the studio).

use super::checkpoint::{self, TrainState};
use super::config::TrainConfig;
use super::data::{Dataset, Split, Vocab};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::{Gpt, GptConfig, Module};
use crate::optim::{AdamW, AdamWConfig};
use crate::rng::Rng;

/// One finished optimizer step.
#[derive(Clone, Copy, Debug)]
pub struct StepReport {
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub tokens_per_s: f64,
}

/// Receives progress; every method has a do-nothing default.
pub trait Reporter {
    fn on_start(&mut self, _trainer: &Trainer) {}
    fn on_step(&mut self, _r: &StepReport) {}
    fn on_eval(&mut self, _step: u64, _val_loss: f32) {}
    fn on_message(&mut self, _msg: &str) {}
}

/// A reporter that stays silent.
pub struct Quiet;
impl Reporter for Quiet {}

/// What a finished run reports (the CLI's `--json` line).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    pub final_train_loss: f32,
    pub final_val_loss: f32,
    pub baseline_loss: f32,
    pub tokens_per_s: f64,
    pub steps: u64,
    pub params: usize,
    pub losses: Vec<f32>,
    pub sample: String,
    pub adapter: String,
    pub peak_gpu_bytes: u64,
}

pub struct Trainer {
    pub cfg: TrainConfig,
    pub model: Gpt,
    pub opt: AdamW,
    pub data: Dataset,
    pub step: u64,
    data_rng: Rng,
}

impl Trainer {
    /// Sets up a run from `cfg`: data, model (fresh, `--init-from` or `--resume`), optimizer.
    pub fn new(ctx: &Context, cfg: TrainConfig, data: Option<Dataset>) -> Result<Trainer> {
        cfg.validate()?;
        let ckpt = match cfg.resume.as_deref().or(cfg.init_from.as_deref()) {
            Some(dir) => Some(checkpoint::load(dir)?),
            None => None,
        };
        let resumed_state = if cfg.resume.is_some() {
            let c = ckpt.as_ref().expect("loaded above");
            Some(c.state.clone().ok_or_else(|| Error::Checkpoint {
                path: checkpoint::model_path(cfg.resume.as_deref().expect("resume")),
                msg: "has no pagetrain training state (use --init-from to start from foreign weights)".into(),
            })?)
        } else {
            None
        };
        let ckpt_vocab = ckpt.as_ref().and_then(|c| c.state.as_ref()).and_then(|s| s.vocab.clone()).map(Vocab::Chars);
        let data = match data {
            Some(d) => d,
            None => open_data(&cfg, ckpt_vocab.clone())?,
        };
        if let (Some(v), Vocab::Chars(_)) = (&ckpt_vocab, &data.vocab) {
            if *v != data.vocab {
                return Err(Error::invalid("data", "the checkpoint's character vocabulary differs from this data's"));
            }
        }
        let config = match &ckpt {
            Some(c) => c.config,
            None => GptConfig::preset(&cfg.model, data.vocab.size())?,
        };
        if data.vocab.size() > config.vocab_size {
            return Err(Error::invalid(
                "data",
                format!("{} tokens in the vocabulary, the model has {}", data.vocab.size(), config.vocab_size),
            ));
        }
        if cfg.seq_len > config.block_size {
            return Err(Error::invalid(
                "hyperparameter",
                format!("--seq-len {} exceeds the model's block size {}", cfg.seq_len, config.block_size),
            ));
        }
        data.check_fits(cfg.seq_len)?;

        let model = Gpt::new(ctx, config, cfg.seed)?;
        let opt_cfg = AdamWConfig {
            lr: cfg.lr,
            weight_decay: cfg.weight_decay,
            max_grad_norm: cfg.grad_clip,
            ..Default::default()
        };
        let mut opt = AdamW::new(ctx, &model, opt_cfg)?;
        let mut step = 0;
        let mut data_rng = Rng::new(cfg.seed.wrapping_add(1));
        if let Some(c) = &ckpt {
            let dir = cfg.resume.as_deref().or(cfg.init_from.as_deref()).expect("a checkpoint dir");
            checkpoint::load_weights(ctx, dir, &model, &c.weights)?;
            if let Some(state) = &resumed_state {
                let (moments, t) = c.optimizer.as_ref().ok_or_else(|| Error::Checkpoint {
                    path: dir.join(checkpoint::OPTIMIZER_FILE),
                    msg: "missing: cannot resume without the optimizer state".into(),
                })?;
                checkpoint::load_optimizer(ctx, dir, &model, &mut opt, moments, *t)?;
                step = state.step;
                data_rng = Rng::from_state(state.data_rng);
            }
        }
        Ok(Trainer { cfg, model, opt, data, step, data_rng })
    }

    /// One optimizer step on a fresh training batch; returns the loss before the update.
    pub async fn train_step(&mut self, ctx: &Context) -> Result<f32> {
        ctx.pager.begin_step();
        let (b, t) = (self.cfg.batch_size, self.cfg.seq_len);
        let (x, y) = self.data.batch(Split::Train, &mut self.data_rng, b, t);
        let tokens = ctx.from_u32("tokens", &[b, t], &x)?;
        let loss = self.model.loss(ctx, &tokens, &y)?;
        let mut grads = self.model.grads();
        ctx.backward(&loss, &mut grads, 1.0)?;
        let lr = self.cfg.lr_at(self.step);
        self.opt.step_lr(ctx, &self.model.params(), lr, 1.0)?;
        self.model.zero_grad(ctx)?;
        let value = ctx.to_f32(&loss).await?[0];
        if !value.is_finite() {
            return Err(Error::invalid("training", format!("loss became {value} at step {}", self.step)));
        }
        self.step += 1;
        Ok(value)
    }

    /// Mean loss over `cfg.eval_batches` validation batches (a fixed sample, so evaluations compare).
    pub async fn evaluate(&self, ctx: &Context) -> Result<f32> {
        let mut rng = Rng::new(self.cfg.seed ^ 0xE7A1);
        let (b, t) = (self.cfg.batch_size, self.cfg.seq_len);
        let mut total = 0.0;
        for _ in 0..self.cfg.eval_batches {
            let (x, y) = self.data.batch(Split::Val, &mut rng, b, t);
            let loss = ctx.no_grad(|| -> Result<_> {
                let tokens = ctx.from_u32("tokens", &[b, t], &x)?;
                self.model.loss(ctx, &tokens, &y)
            })?;
            total += ctx.to_f32(&loss).await?[0];
        }
        Ok(total / self.cfg.eval_batches as f32)
    }

    /// `n` tokens sampled after `prompt` at `temperature`, decoded.
    pub async fn sample(&self, ctx: &Context, prompt: &[u32], n: usize, temperature: f32, seed: u64) -> Result<String> {
        let mut rng = Rng::new(seed);
        let mut tokens = prompt.to_vec();
        let block = self.model.config.block_size.min(self.cfg.seq_len.max(1));
        for _ in 0..n {
            let window = &tokens[tokens.len().saturating_sub(block)..];
            let logits = ctx.no_grad(|| -> Result<_> {
                let x = ctx.from_u32("prompt", &[1, window.len()], window)?;
                self.model.forward(ctx, &x)
            })?;
            let all = ctx.to_f32(&logits).await?;
            let v = self.model.config.vocab_size;
            let last = &all[all.len() - v..];
            tokens.push(sample_logits(&last[..self.data.vocab.size()], temperature, &mut rng));
        }
        Ok(self.data.vocab.decode(&tokens[prompt.len()..]))
    }

    pub fn state(&self) -> TrainState {
        TrainState {
            step: self.step,
            data_rng: self.data_rng.state(),
            vocab: match &self.data.vocab {
                Vocab::Chars(c) => Some(c.clone()),
                Vocab::Ids { .. } => None,
            },
            config: self.model.config,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub async fn save(&self, ctx: &Context, dir: &std::path::Path) -> Result<()> {
        checkpoint::save(ctx, dir, &self.model, &self.opt, &self.state()).await
    }

    /// Trains to `cfg.steps`, evaluates, samples, saves to `cfg.out`; returns the summary.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn run(&mut self, ctx: &Context, reporter: &mut dyn Reporter) -> Result<RunSummary> {
        reporter.on_start(self);
        let tokens_per_step = (self.cfg.batch_size * self.cfg.seq_len) as f64;
        let mut losses = Vec::new();
        let start = web_time_now();
        let first_step = self.step;
        while self.step < self.cfg.steps {
            let loss = self.train_step(ctx).await?;
            losses.push(loss);
            let elapsed = web_time_now() - start;
            let r = StepReport {
                step: self.step,
                loss,
                lr: self.cfg.lr_at(self.step - 1),
                tokens_per_s: (self.step - first_step) as f64 * tokens_per_step / elapsed.max(1e-9),
            };
            reporter.on_step(&r);
            if self.cfg.eval_every > 0 && self.step % self.cfg.eval_every == 0 && self.step < self.cfg.steps {
                let v = self.evaluate(ctx).await?;
                reporter.on_eval(self.step, v);
            }
        }
        let elapsed = web_time_now() - start;
        let trained = self.step - first_step;
        let tokens_per_s = if trained > 0 { trained as f64 * tokens_per_step / elapsed.max(1e-9) } else { 0.0 };
        let val = self.evaluate(ctx).await?;
        reporter.on_eval(self.step, val);
        let sample = if self.cfg.sample_len > 0 {
            let prompt = self.data.vocab.encode("One day").unwrap_or_else(|_| vec![0]);
            self.sample(ctx, &prompt, self.cfg.sample_len, 0.8, self.cfg.seed).await?
        } else {
            String::new()
        };
        self.save(ctx, &self.cfg.out.clone()).await?;
        reporter.on_message(&format!("checkpoint written to {}", self.cfg.out.display()));
        Ok(RunSummary {
            final_train_loss: losses.last().copied().unwrap_or(f32::NAN),
            final_val_loss: val,
            baseline_loss: self.data.unigram_entropy(),
            tokens_per_s,
            steps: self.step,
            params: self.model.num_params(),
            losses,
            sample,
            adapter: ctx.gpu.describe(),
            peak_gpu_bytes: ctx.pager.stats().peak_bytes,
        })
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn web_time_now() -> f64 {
    use std::sync::OnceLock;
    static T0: OnceLock<std::time::Instant> = OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

#[cfg(not(target_arch = "wasm32"))]
fn open_data(cfg: &TrainConfig, vocab: Option<Vocab>) -> Result<Dataset> {
    match &cfg.data {
        Some(path) => Dataset::open(path, vocab),
        None => Dataset::from_text(super::corpus::DEMO, "assets/corpus.txt (built in)", vocab),
    }
}

#[cfg(target_arch = "wasm32")]
fn open_data(cfg: &TrainConfig, vocab: Option<Vocab>) -> Result<Dataset> {
    match &cfg.data {
        Some(path) => {
            Err(Error::Data { path: path.clone(), msg: "files cannot be opened in the browser; pass a Dataset".into() })
        }
        None => Dataset::from_text(super::corpus::DEMO, "assets/corpus.txt (built in)", vocab),
    }
}

/// Samples an index from softmax(logits / temperature); temperature 0 takes the argmax.
pub fn sample_logits(logits: &[f32], temperature: f32, rng: &mut Rng) -> u32 {
    if temperature <= 0.0 {
        return logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap_or(0);
    }
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits.iter().map(|&l| (((l - m) / temperature) as f64).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut u = rng.uniform() as f64 * total;
    for (i, wi) in w.iter().enumerate() {
        u -= wi;
        if u <= 0.0 {
            return i as u32;
        }
    }
    (w.len() - 1) as u32
}
