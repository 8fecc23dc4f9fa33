//! The training loop: batches from the data, forward, backward, the optimizer, evaluation,
//! sampling, checkpoints. A step's batch is split into micro-batches whose gradients accumulate;
//! when a micro-batch does not fit the GPU, the step starts over with half the micro-batch and
//! twice the accumulation (the same data, the same effective batch). Progress goes to a
//! [`Reporter`] (the CLI's progress bar; later the studio).

use std::rc::Rc;
use std::sync::Arc;

use super::checkpoint::{self, LossScale, TrainState};
use super::config::{Precision, TrainConfig};
use super::data::{Dataset, Prefetcher, Split, Vocab};
use super::generate::{generate, start_token, Sampling};
pub use super::optimizer::Optimizer;
use super::pending_loss::{PendingLosses, StepLoss};
pub use super::report::{Quiet, Reporter, RunSummary, StepReport};
use super::run_setup::{checkpoint_vocab, choose_optimizer, open_data};
use super::step_trial::StepTrial;
use super::tokenizer::Tokenizer;
use super::update::PendingUpdate;
pub use super::update::{GROWTH_INTERVAL, INITIAL_LOSS_SCALE};
use crate::context::Context;
use crate::dist::Dist;
use crate::error::{Error, Result};
use crate::nn::{Gpt, Module, StepBackward};
use crate::optim::AdamWConfig;
use crate::rng::Rng;

pub struct Trainer {
    pub cfg: TrainConfig,
    pub model: Gpt,
    pub opt: Optimizer,
    pub data: Arc<Dataset>,
    pub step: u64,
    /// Sequences per micro-batch now (starts at --batch-size, halves on out-of-memory).
    pub micro_batch: usize,
    /// Seed of the per-step batch sampler (kept in checkpoints).
    data_seed: u64,
    prefetch: Option<Prefetcher>,
    /// Why the optimizer runs where it does.
    pub optimizer_reason: String,
    /// Precision in use (f32 when f16 was asked for on an adapter without shader-f16).
    pub precision: Precision,
    pub precision_note: String,
    /// Dynamic loss scale (1 in f32): the loss gradient is seeded with it, the update divides it
    /// out; a step whose gradients overflow is skipped and the scale halved.
    pub loss_scale: f32,
    pub(super) good_steps: u64,
    pub skipped_steps: u64,
    /// `PAGETRAIN_PHASES=1`: time each step's forward+backward and optimizer (syncing between).
    print_phases: bool,
    /// Set to take a pager snapshot after the next step's first forward, when the activations
    /// saved for backward are all alive (a snapshot between steps shows none of them).
    pub want_forward_snapshot: bool,
    pub forward_snapshot: Option<crate::pager::Snapshot>,
    /// The run's effective configuration (a `run.toml`), written into each checkpoint.
    pub run_file: Option<String>,
    /// This process's rank in a data-parallel run (None: a single process).
    pub dist: Option<Rc<Dist>>,
    /// The last step's update, when it is delayed (`--delayed-update`): its norm is taken and
    /// its update started just before the next backward, so the step's end waits for nothing
    /// and the next forward is recorded while the GPU finishes this backward.
    pub(super) pending_update: Option<PendingUpdate>,
    /// Whether this paged run recomputes its blocks, measured (`TrainConfig::auto_recompute`).
    pub(super) recompute_trial: StepTrial,
    /// How this paged run's uploads cross the bus, measured where the GPU offers a choice.
    pub(super) upload_trial: StepTrial,
    /// Whether this paged run's host optimizer bets on unclipped steps, measured.
    pub(super) bet_trial: StepTrial,
    /// The upload path the upload trial began on (its usual way).
    pub(super) upload_usual: crate::pager::UploadPath,
    /// A step has evicted tensors to stay in the GPU budget.
    pub(super) paged: bool,
    /// Recompute or remaking changed since the last step: the next one will not repeat its
    /// accesses ([`crate::pager::Pager::begin_step_unlike_last`]).
    pub(super) step_changed: bool,
}

/// Whether a mixed-precision run with AdamW on the host sends its gradients down in f16:
/// `TrainConfig::f16_gradients`, else `PAGETRAIN_F16_GRADS=0|1`, else yes.
fn f16_gradients(cfg: &TrainConfig) -> bool {
    cfg.f16_gradients.unwrap_or_else(|| std::env::var("PAGETRAIN_F16_GRADS").as_deref() != Ok("0"))
}

/// Whether `e` means "this much does not fit on the GPU".
pub fn is_out_of_memory(e: &Error) -> bool {
    matches!(e, Error::BudgetTooSmall { .. } | Error::SlabsFragmented { .. } | Error::OutOfMemory { .. })
}

impl Trainer {
    /// Sets up a run from `cfg`: data, model (fresh, `--init-from` or `--resume`), optimizer.
    pub fn new(ctx: &Context, cfg: TrainConfig, data: Option<Dataset>) -> Result<Trainer> {
        Self::with_dist(ctx, cfg, data, None)
    }

    /// [`Trainer::new`] as one rank of a data-parallel run: `cfg.batch_size` is per rank, the
    /// optimizer is sharded.
    pub fn with_dist(
        ctx: &Context,
        cfg: TrainConfig,
        data: Option<Dataset>,
        dist: Option<Rc<Dist>>,
    ) -> Result<Trainer> {
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
        let vocab = match (&ckpt, cfg.tokenizer) {
            (Some(c), tokenizer) => checkpoint_vocab(tokenizer, c),
            (None, Tokenizer::Gpt2) => Some(Vocab::Gpt2),
            (None, _) => None,
        };
        let data = match data {
            Some(d) => d,
            None => open_data(&cfg, vocab)?,
        };
        if let (Some(v), Vocab::Chars(_)) = (&ckpt_vocab, &data.vocab) {
            if *v != data.vocab {
                return Err(Error::invalid("data", "the checkpoint's character vocabulary differs from this data's"));
            }
        }
        let config = match &ckpt {
            Some(c) => c.config,
            None => cfg.model_config(data.vocab.size())?,
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
        crate::clock::startup_phase("data open");

        let mut model = Gpt::new(ctx, config, cfg.seed)?;
        crate::clock::startup_phase("model initialised");
        let dir: Option<std::path::PathBuf> = cfg.resume.clone().or(cfg.init_from.clone());
        let dir = dir.as_deref();
        if let Some(c) = &ckpt {
            checkpoint::load_weights(ctx, &model, &c.weights)?;
        }
        // Freezing happens on the loaded weights and before the optimizer sees the parameters.
        let mut cfg = cfg;
        if cfg.freeze_int8.is_none() {
            cfg.freeze_int8 = resumed_state.as_ref().and_then(|s| s.frozen_int8.clone());
        }
        if let Some(pattern) = &cfg.freeze_int8 {
            let (m, n) = model.freeze_int8(ctx, pattern)?;
            if n == 0 {
                return Err(Error::invalid("--freeze-int8", format!("no Linear layer's name contains `{pattern}`")));
            }
            model = m;
        }
        let (precision, precision_note) = match cfg.precision {
            Precision::F16 if ctx.gpu.features.contains(wgpu::Features::SHADER_F16) => {
                model = model.to_half(ctx)?;
                (Precision::F16, "f16 activations, gradients and weight copies in the kernels, f32 master weights and optimizer state, dynamic loss scaling".to_string())
            }
            Precision::F16 => (Precision::F32, format!("{} has no shader-f16: training in f32", ctx.gpu.describe())),
            Precision::F32 => (Precision::F32, "f32".to_string()),
        };
        model.set_recompute_blocks(super::recompute_policy::blocks_recomputed(cfg.recompute, model.blocks.len()));
        model.set_keep_attention(super::recompute_policy::keep_attention_at_start(ctx));
        if cfg.remake.is_none() {
            cfg.remake = match std::env::var("PAGETRAIN_REMAKE").as_deref() {
                Ok("0") => Some(false),
                Ok("1") => Some(true),
                _ => None,
            };
        }
        model.set_remake(cfg.remake == Some(true));
        let opt_cfg = AdamWConfig {
            lr: cfg.lr,
            weight_decay: cfg.weight_decay,
            max_grad_norm: cfg.grad_clip,
            ..Default::default()
        };
        let (on, mut optimizer_reason) = choose_optimizer(ctx, &cfg, &config);
        let f16_grads = precision == Precision::F16 && f16_gradients(&cfg);
        let mut opt =
            Optimizer::for_run(ctx, &model, on, dist.as_ref(), opt_cfg, &cfg, f16_grads, &mut optimizer_reason)?;
        if cfg.delayed_update.is_some() && !matches!(opt, Optimizer::Host(_)) {
            optimizer_reason += "; --delayed-update left off: it delays the host optimizer's updates";
        }
        crate::clock::startup_phase("optimizer state allocated");
        let mut step = 0;
        let mut data_seed = cfg.seed.wrapping_add(1);
        let fresh = LossScale { scale: INITIAL_LOSS_SCALE, good_steps: 0, skipped_steps: 0 };
        let mut scaler = if precision == Precision::F16 { fresh } else { LossScale { scale: 1.0, ..fresh } };
        if let (Some(c), Some(dir), Some(state)) = (&ckpt, dir, &resumed_state) {
            let (moments, t) = c.optimizer.as_ref().ok_or_else(|| Error::Checkpoint {
                path: checkpoint::resolve(dir).join(checkpoint::OPTIMIZER_FILE),
                msg: "missing: cannot resume without the optimizer state".into(),
            })?;
            match &opt {
                Optimizer::Sharded(o) => o.load_moments(ctx, &model.params(), moments, &checkpoint::resolve(dir))?,
                _ => checkpoint::load_optimizer(ctx, &model, opt.moments(), moments)?,
            }
            opt.set_t(*t);
            step = state.step;
            data_seed = state.data_seed;
            if precision == Precision::F16 {
                scaler = state.loss_scale.unwrap_or(fresh);
            }
        }
        if let Some(d) = &dist {
            d.check_agree(&crate::dist::describe_setup(&cfg, &config, precision, &data, step))?;
        }
        let micro_batch = cfg.batch_size;
        let trainer = Trainer {
            cfg,
            model,
            opt,
            data: Arc::new(data),
            step,
            micro_batch,
            data_seed,
            prefetch: None,
            optimizer_reason,
            precision,
            precision_note,
            loss_scale: scaler.scale,
            good_steps: scaler.good_steps,
            skipped_steps: scaler.skipped_steps,
            print_phases: std::env::var("PAGETRAIN_PHASES").is_ok_and(|v| v != "0"),
            want_forward_snapshot: false,
            forward_snapshot: None,
            run_file: None,
            dist,
            pending_update: None,
            recompute_trial: StepTrial::default(),
            upload_trial: StepTrial::default(),
            bet_trial: StepTrial::default(),
            upload_usual: crate::pager::UploadPath::Ring,
            paged: false,
            step_changed: false,
        };
        // A prompt the vocabulary cannot encode fails now, not after the training.
        trainer.sample_prompt()?;
        Ok(trainer)
    }

    /// Sequences per optimizer step: micro-batch × accumulation, fixed for the run.
    pub fn effective_batch(&self) -> usize {
        self.cfg.batch_size * self.cfg.accum
    }

    /// Processes training together (1 without `dist`).
    pub fn ranks(&self) -> usize {
        self.dist.as_ref().map_or(1, |d| d.size())
    }

    /// Sequences per optimizer step over all ranks: each rank trains on its slice of this batch.
    pub fn global_batch(&self) -> usize {
        self.effective_batch() * self.ranks()
    }

    /// Whether this process prints, evaluates, samples and writes metrics (rank 0, or alone).
    pub fn is_lead(&self) -> bool {
        self.dist.as_ref().is_none_or(|d| d.is_lead())
    }

    /// Forward and backward over one step's batch in micro-batches; their losses are copied
    /// into `losses` (read later: no wait here).
    async fn accumulate(&mut self, ctx: &Context, x: &[u32], y: &[u32]) -> Result<PendingLosses> {
        let t = self.cfg.seq_len;
        let micro = self.micro_batch;
        let n_micro = self.effective_batch() / micro;
        let mut losses = PendingLosses::new(ctx, n_micro);
        for i in 0..n_micro {
            let rows = i * micro * t..(i + 1) * micro * t;
            let tokens = ctx.from_u32("tokens", &[micro, t], &x[rows.clone()])?;
            // The last step's deferred updates land layer by layer as this forward reaches them;
            // whatever the forward did not reach is updated before backward adds new gradients.
            let (model, opt) = (&self.model, &mut self.opt);
            let seed = self.loss_scale / n_micro as f32;
            // (a delayed update reads the last step's gradients after this forward)
            let backward = StepBackward { seed, grads_free: self.pending_update.is_none() };
            let loss =
                model.loss_prepared(ctx, &tokens, &y[rows], Some(backward), &mut |ps| opt.apply_deferred(ctx, ps))?;
            opt.apply_deferred(ctx, &model.params())?;
            if std::mem::take(&mut self.want_forward_snapshot) {
                self.forward_snapshot = Some(ctx.pager.snapshot());
            }
            // (a delayed update takes the last step's gradients aside before backward adds new ones)
            self.start_pending_update(ctx).await?;
            let mut grads = self.model.grads();
            let last = i + 1 == n_micro;
            if last {
                // (a delayed update is not the next step's: nothing to bet on)
                let next = (!self.opt.delays_next_update()).then(|| (self.cfg.lr_at(self.step), 1.0 / self.loss_scale));
                if let Some(watcher) = self.opt.gradient_watcher(ctx, &self.model, next)? {
                    grads.watch(watcher);
                }
            }
            ctx.backward(&loss, &mut grads, seed)?;
            if last {
                self.opt.backward_done(ctx)?;
            }
            losses.push(ctx, &loss)?;
        }
        Ok(losses)
    }

    /// One optimizer step on the step's batch; returns the mean loss before the update (waits
    /// for the step's GPU work: [`Trainer::train_step_pending`] does not).
    pub async fn train_step(&mut self, ctx: &Context) -> Result<f32> {
        self.train_step_pending(ctx).await?.get(ctx).await
    }

    /// One optimizer step, submitted; its loss is read when asked for ([`StepLoss::get`]), so a
    /// loop that asks after recording the next step keeps the GPU busy. A non-finite loss is an
    /// error then.
    pub async fn train_step_pending(&mut self, ctx: &Context) -> Result<StepLoss> {
        let clock = crate::clock::Stopwatch::start();
        let (b, t) = (self.global_batch(), self.cfg.seq_len);
        let (x, y) = match &self.prefetch {
            Some(p) => p.get(&self.data, self.step)?,
            None => self.data.step_batch(self.data_seed, self.step, b, t)?,
        };
        let (x, y) = match &self.dist {
            Some(d) => (d.my_rows(&x, self.effective_batch() * t), d.my_rows(&y, self.effective_batch() * t)),
            None => (&x[..], &y[..]),
        };
        let evictions = ctx.pager.counters().evictions;
        let trial_clock = self.trial_step_begins(ctx)?;
        // The update delayed at the step before last lands before this forward reads the weights.
        self.opt.land_delayed()?;
        let loss = loop {
            if std::mem::take(&mut self.step_changed) {
                ctx.pager.begin_step_unlike_last();
            } else {
                ctx.pager.begin_step();
            }
            match self.accumulate(ctx, x, y).await {
                Ok(losses) => break losses,
                Err(e) if is_out_of_memory(&e) && self.micro_batch > 1 => {
                    // Throw the partial step away and run it again in smaller pieces (not by
                    // the partial step's accesses: it freed its tensors unread).
                    self.step_changed = true;
                    ctx.tape().clear();
                    self.apply_pending(ctx).await?;
                    self.model.zero_grad(ctx)?;
                    ctx.pager.trim();
                    let from = self.micro_batch;
                    let effective = self.effective_batch();
                    self.micro_batch = (1..=from / 2).rev().find(|d| effective.is_multiple_of(*d)).unwrap_or(1);
                    log::warn!(
                        "step {}: a micro-batch of {from} does not fit ({e}); retrying with {} x {}",
                        self.step,
                        effective / self.micro_batch,
                        self.micro_batch
                    );
                    ctx.pager.note_shrink();
                }
                Err(e) => return Err(e),
            }
        };
        self.after_evictions(ctx, ctx.pager.counters().evictions - evictions);
        // Ranks agree on the mean at once (it is a collective); alone, it is read later.
        let mut loss = match &self.dist {
            Some(d) => StepLoss::known(self.step, d.mean(loss.mean(ctx).await?)?),
            None => StepLoss::pending(self.step, loss),
        };
        let forward_backward_s = clock.seconds();
        let update =
            PendingUpdate { step: self.step, lr: self.cfg.lr_at(self.step), grad_scale: 1.0 / self.loss_scale };
        if self.opt.delays_next_update() {
            self.pending_update = Some(update);
        } else {
            self.update(ctx, update).await?;
        }
        if self.print_phases {
            ctx.sync()?;
            let total = clock.seconds();
            eprintln!(
                "step {}: forward+backward {:.1} ms, optimizer {:.1} ms",
                self.step,
                forward_backward_s * 1e3,
                (total - forward_backward_s) * 1e3
            );
        }
        loss.submit(ctx);
        self.trial_step_ends(ctx, trial_clock)?;
        self.step += 1;
        Ok(loss)
    }

    /// Mean loss over `cfg.eval_batches` validation batches (a fixed sample, so evaluations compare).
    pub async fn evaluate(&mut self, ctx: &Context) -> Result<f32> {
        self.apply_pending(ctx).await?;
        // The same sequences whatever the micro-batch, so runs that shrank it compare.
        let mut rng = Rng::new(self.cfg.seed ^ 0xE7A1);
        let (b, t, micro) = (self.cfg.batch_size, self.cfg.seq_len, self.micro_batch.min(self.cfg.batch_size));
        let mut total = 0.0;
        let mut parts = 0;
        for _ in 0..self.cfg.eval_batches {
            let (x, y) = self.data.batch(Split::Val, &mut rng, b, t)?;
            for (xs, ys) in x.chunks(micro * t).zip(y.chunks(micro * t)) {
                let loss = ctx.no_grad(|| -> Result<_> {
                    let tokens = ctx.from_u32("tokens", &[xs.len() / t, t], xs)?;
                    self.model.loss(ctx, &tokens, ys)
                })?;
                let rows = xs.len() / t;
                total += ctx.to_f32(&loss).await?[0] * rows as f32;
                parts += rows;
            }
        }
        Ok(total / parts.max(1) as f32)
    }

    /// `n` tokens generated after `prompt` (the vocabulary's start token when empty), decoded.
    pub async fn sample(
        &mut self,
        ctx: &Context,
        prompt: &[u32],
        n: usize,
        sampling: Sampling,
        seed: u64,
    ) -> Result<String> {
        self.apply_pending(ctx).await?;
        let start = [start_token(&self.data.vocab)];
        let prompt = if prompt.is_empty() { &start[..] } else { prompt };
        let vocab = self.data.vocab.size();
        let tokens = generate(ctx, &self.model, prompt, n, vocab, sampling, seed, &mut |_| Ok(())).await?;
        Ok(self.data.vocab.decode(&tokens))
    }

    /// The end-of-run sample's prompt as tokens (empty: none given).
    pub(super) fn sample_prompt(&self) -> Result<Vec<u32>> {
        match &self.cfg.sample_prompt {
            Some(text) => self.data.vocab.encode(text).map_err(|e| Error::invalid("sample_prompt", e.to_string())),
            None => Ok(Vec::new()),
        }
    }

    pub fn state(&self) -> TrainState {
        TrainState {
            step: self.step,
            data_seed: self.data_seed,
            vocab: match &self.data.vocab {
                Vocab::Chars(c) => Some(c.clone()),
                Vocab::Gpt2 | Vocab::Ids { .. } => None,
            },
            config: self.model.config,
            frozen_int8: self.cfg.freeze_int8.clone(),
            loss_scale: (self.precision == Precision::F16).then_some(LossScale {
                scale: self.loss_scale,
                good_steps: self.good_steps,
                skipped_steps: self.skipped_steps,
            }),
        }
    }

    /// Writes a checkpoint of the current step under `dir` (see [`checkpoint::save`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn save(&mut self, ctx: &Context, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        self.apply_pending(ctx).await?;
        if let (Some(d), Optimizer::Sharded(o)) = (&self.dist, &self.opt) {
            let state = self.state();
            return crate::dist::shard_files::save(ctx, d, dir, &self.model, o, &state, self.run_file.as_deref()).await;
        }
        let saved = checkpoint::save(ctx, dir, &self.model, self.opt.moments(), &self.state()).await?;
        if let Some(text) = &self.run_file {
            let path = saved.join("run.toml");
            std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        }
        Ok(saved)
    }

    /// Starts a thread that prepares the batches of the coming steps.
    pub fn start_prefetch(&mut self) {
        let p = Prefetcher::new(self.data.clone(), self.data_seed, self.step, self.global_batch(), self.cfg.seq_len, 4);
        self.prefetch = Some(p);
    }
}
