//! Training hyperparameters, checked before anything touches the GPU.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::nn::{GptConfig, ModelShape};

/// Where AdamW runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OptimizerOn {
    /// Fused kernels over paged states.
    Gpu,
    /// Worker threads over the host-resident states.
    Host,
    /// The first parameters (the embedding first) on the GPU with their state kept there, the
    /// rest on the host (`optim::SplitAdamW`).
    Split,
    /// Decided from the model and the budget; the run says which and why. The GPU wherever
    /// the optimizer's state fits half the budget, so a resident run decides without measuring.
    #[default]
    Auto,
}

/// Storage precision of the weights the kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    /// f16 activations and activation gradients, f16 copies of the Linear weights for the
    /// products; f32 master weights, weight gradients and optimizer state; dynamic loss scaling.
    F16,
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "f16" => Ok(Precision::F16),
            other => Err(format!("`{other}`: use f32 or f16")),
        }
    }
}

impl std::str::FromStr for OptimizerOn {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "gpu" => Ok(OptimizerOn::Gpu),
            "host" => Ok(OptimizerOn::Host),
            "split" => Ok(OptimizerOn::Split),
            "auto" => Ok(OptimizerOn::Auto),
            other => Err(format!("`{other}`: use gpu, host, split or auto")),
        }
    }
}

/// Everything a training run needs to know. `Default` is the built-in demo run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Model preset: `tiny`, `small`, `gpt2-124m`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`.
    pub model: String,
    /// A custom size instead of the preset.
    pub custom_model: Option<ModelShape>,
    pub steps: u64,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches whose gradients are summed per optimizer step.
    pub accum: usize,
    pub seq_len: usize,
    /// Peak learning rate (after warmup; cosine decay to `min_lr`).
    pub lr: f32,
    /// Where the cosine decay ends (`None`: lr/10).
    pub min_lr: Option<f32>,
    pub warmup_steps: u64,
    pub weight_decay: f32,
    /// Global gradient-norm clip (≤ 0: off).
    pub grad_clip: f32,
    pub seed: u64,
    /// Text or `.bin` token file; `None`: the built-in demo corpus.
    pub data: Option<PathBuf>,
    /// A separate validation file (then all of `data` trains); `None`: the last tenth of `data`.
    pub val_data: Option<PathBuf>,
    /// Where the checkpoint goes.
    pub out: PathBuf,
    /// Continue from this checkpoint directory.
    pub resume: Option<PathBuf>,
    /// Start from the weights of this GPT-2-layout checkpoint directory.
    pub init_from: Option<PathBuf>,
    /// Validation batches at each evaluation.
    pub eval_batches: usize,
    /// Evaluate every this many steps (0: only at the end).
    pub eval_every: u64,
    /// Tokens to sample at the end (0: none).
    pub sample_len: usize,
    /// What the end-of-run sample continues (`None`: the vocabulary's start token).
    pub sample_prompt: Option<String>,
    /// How the end-of-run sample draws tokens.
    pub sampling: super::generate::Sampling,
    /// Write a checkpoint every this many steps (0: only at the end).
    pub checkpoint_every: u64,
    pub optimizer_on: OptimizerOn,
    /// With AdamW on the host: after this many steps, each update runs during the whole next
    /// step, whose forward and backward read the weights of the step before (ZeRO-Offload's
    /// delayed parameter update, `optim::delayed_update`). `None`: never.
    pub delayed_update: Option<u64>,
    /// Keep only each block's input in forward; recompute the block in backward.
    pub recompute: bool,
    /// Where `recompute` is not asked for: once a step has had to evict tensors to stay in the
    /// GPU budget, time steps with and without recompute and keep the faster
    /// (`train::recompute_trial`). Off: never recompute unasked.
    pub auto_recompute: bool,
    /// Make LayerNorm outputs and the MLP's hidden values again in backward instead of keeping
    /// them (`Block::forward`).
    /// `None`: from the step after one that had to evict tensors to stay in the GPU budget
    /// (`PAGETRAIN_REMAKE=0` or `1` decides instead, for measuring).
    pub remake: Option<bool>,
    /// With `--precision f16` and AdamW on the host: gradients go down to it in f16, scaled per
    /// tensor (`optim::HalfGrads`), half the bytes of f32. `None`: yes, unless
    /// `PAGETRAIN_F16_GRADS=0` (for measuring).
    pub f16_gradients: Option<bool>,
    /// Freeze the Linear layers whose names contain this as int8 weights (e.g. `mlp`, `h.0.`).
    pub freeze_int8: Option<String>,
    pub precision: Precision,
    pub tokenizer: super::Tokenizer,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: "tiny".into(),
            custom_model: None,
            steps: 400,
            batch_size: 16,
            accum: 1,
            seq_len: 64,
            lr: 3e-3,
            min_lr: None,
            warmup_steps: 30,
            weight_decay: 0.1,
            grad_clip: 1.0,
            seed: 1337,
            data: None,
            val_data: None,
            out: PathBuf::from("runs/default"),
            resume: None,
            init_from: None,
            eval_batches: 8,
            eval_every: 0,
            sample_len: 300,
            sample_prompt: None,
            sampling: super::generate::Sampling::default(),
            checkpoint_every: 0,
            optimizer_on: OptimizerOn::Auto,
            delayed_update: None,
            recompute: false,
            auto_recompute: true,
            remake: None,
            f16_gradients: None,
            freeze_int8: None,
            precision: Precision::F32,
            tokenizer: super::Tokenizer::Auto,
        }
    }
}

impl TrainConfig {
    /// Rejects nonsense with a message naming the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid("hyperparameter", msg));
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be a positive number, got {}", self.lr));
        }
        if self.batch_size == 0 {
            return bad("--batch-size must be at least 1".into());
        }
        if self.accum == 0 {
            return bad("--accum must be at least 1".into());
        }
        if self.seq_len == 0 {
            return bad("--seq-len must be at least 1".into());
        }
        if self.steps == 0 {
            return bad("--steps must be at least 1".into());
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!("weight decay must be >= 0, got {}", self.weight_decay));
        }
        if self.eval_batches == 0 {
            return bad("eval batches must be at least 1".into());
        }
        if let Some(m) = self.min_lr {
            if !(m.is_finite() && (0.0..=self.lr).contains(&m)) {
                return bad(format!("min_lr must be between 0 and --lr {}, got {m}", self.lr));
            }
        }
        self.sampling.validate()?;
        if self.resume.is_some() && self.init_from.is_some() {
            return bad("--resume and --init-from exclude each other".into());
        }
        Ok(())
    }

    /// The model this run trains over a vocabulary of `vocab_size` (a fresh one; checkpoints
    /// bring their own).
    pub fn model_config(&self, vocab_size: usize) -> Result<GptConfig> {
        match self.custom_model {
            Some(shape) => GptConfig::from_shape(shape, vocab_size),
            None => GptConfig::preset(&self.model, vocab_size),
        }
    }

    /// Learning rate at `step` (0-based): linear warmup, then cosine decay to `min_lr`.
    pub fn lr_at(&self, step: u64) -> f32 {
        let min_lr = self.min_lr.unwrap_or(self.lr / 10.0);
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f32 / self.warmup_steps as f32;
        }
        let span = self.steps.saturating_sub(self.warmup_steps).max(1) as f32;
        let progress = ((step - self.warmup_steps) as f32 / span).min(1.0);
        min_lr + 0.5 * (self.lr - min_lr) * (1.0 + (std::f32::consts::PI * progress).cos())
    }
}

/// Bytes from a size like `512MiB`, `2GiB`, `1.5 GB` or `4096` (binary units either way).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("`{s}` is not a size like 512MiB or 2GiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit `{other}` (use KiB, MiB, GiB)")),
    };
    Ok((n * mult) as u64)
}

/// A byte count for people: `812 B`, `3.4 KiB`, `118.0 MiB`, `2.00 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b < 1024.0 {
        format!("{bytes} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1048576.0)
    } else {
        format!("{:.2} GiB", b / 1073741824.0)
    }
}
