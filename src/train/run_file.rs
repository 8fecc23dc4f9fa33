//! Run configuration files (`--config run.toml`): keys named as the long flags with underscores
//! (`batch_size`, `seq_len`, …). A file sets what it names; flags override it; what a run used is
//! written beside each of its checkpoints as `run.toml`, which `--config` reads back.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config::{OptimizerOn, Precision, TrainConfig};
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::nn::ModelShape;

/// Largest configuration file read (a run file is a few hundred bytes).
const MAX_BYTES: u64 = 1 << 20;

/// Every key a run file may hold; absent keys keep their defaults (or the flags' values).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub model: Option<String>,
    /// A custom size instead of a preset: all four together.
    pub n_layer: Option<usize>,
    pub n_head: Option<usize>,
    pub n_embd: Option<usize>,
    pub block_size: Option<usize>,
    pub steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub accum: Option<usize>,
    pub seq_len: Option<usize>,
    pub lr: Option<f32>,
    pub min_lr: Option<f32>,
    pub warmup_steps: Option<u64>,
    pub weight_decay: Option<f32>,
    pub grad_clip: Option<f32>,
    pub seed: Option<u64>,
    pub data: Option<PathBuf>,
    pub val_data: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub init_from: Option<PathBuf>,
    pub eval_batches: Option<usize>,
    pub eval_every: Option<u64>,
    pub sample_len: Option<usize>,
    pub sample_prompt: Option<String>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub checkpoint_every: Option<u64>,
    pub optimizer_on: Option<String>,
    /// Steps before host AdamW's updates are delayed by one step.
    pub delayed_update: Option<u64>,
    pub recompute: Option<bool>,
    /// `TrainConfig::auto_recompute`.
    pub auto_recompute: Option<bool>,
    pub freeze_int8: Option<String>,
    pub precision: Option<String>,
    pub tokenizer: Option<Tokenizer>,
    /// `512MiB`, `2GiB` or `auto`.
    pub gpu_budget: Option<String>,
    /// A directory for the host store's files, or `memory`.
    pub store: Option<String>,
}

impl RunFile {
    /// Reads and checks `path` (unknown keys and wrong types are errors naming the key).
    pub fn load(path: &Path) -> Result<RunFile> {
        let bad = |msg: String| Error::Data { path: path.to_path_buf(), msg };
        let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        if len > MAX_BYTES {
            return Err(bad(format!("is {len} bytes; a run file is at most {MAX_BYTES}")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text).map_err(bad)
    }

    pub fn parse(text: &str) -> std::result::Result<RunFile, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// `base` with what this file sets.
    pub fn apply(&self, base: TrainConfig) -> Result<TrainConfig> {
        let bad = |key: &'static str, msg: String| Error::Invalid { what: key, msg };
        let mut c = base;
        macro_rules! set {
            ($($key:ident),*) => { $( if let Some(v) = &self.$key { c.$key = v.clone(); } )* };
        }
        set!(model, steps, batch_size, accum, seq_len, lr, warmup_steps, weight_decay, grad_clip, seed);
        set!(out, eval_batches, eval_every, sample_len, checkpoint_every, recompute, tokenizer);
        set!(auto_recompute);
        if let Some(v) = &self.sample_prompt {
            c.sample_prompt = Some(v.clone());
        }
        c.sampling.temperature = self.temperature.unwrap_or(c.sampling.temperature);
        c.sampling.top_k = self.top_k.unwrap_or(c.sampling.top_k);
        c.sampling.top_p = self.top_p.unwrap_or(c.sampling.top_p);
        if let Some(v) = self.min_lr {
            c.min_lr = Some(v);
        }
        if let Some(v) = self.delayed_update {
            c.delayed_update = Some(v);
        }
        for (v, field) in [
            (&self.data, &mut c.data),
            (&self.val_data, &mut c.val_data),
            (&self.resume, &mut c.resume),
            (&self.init_from, &mut c.init_from),
        ] {
            if v.is_some() {
                field.clone_from(v);
            }
        }
        if let Some(p) = &self.freeze_int8 {
            c.freeze_int8 = Some(p.clone());
        }
        if let Some(v) = &self.optimizer_on {
            c.optimizer_on = v.parse::<OptimizerOn>().map_err(|e| bad("optimizer_on", e))?;
        }
        if let Some(v) = &self.precision {
            c.precision = v.parse::<Precision>().map_err(|e| bad("precision", e))?;
        }
        match (self.n_layer, self.n_head, self.n_embd, self.block_size) {
            (None, None, None, None) => {}
            (Some(n_layer), Some(n_head), Some(n_embd), Some(block_size)) => {
                c.custom_model = Some(ModelShape { n_layer, n_head, n_embd, block_size });
            }
            _ => {
                return Err(bad(
                    "n_layer",
                    "a custom size needs n_layer, n_head, n_embd and block_size together".into(),
                ))
            }
        }
        Ok(c)
    }

    /// The file that reproduces `cfg` (with the budget and store the run used).
    pub fn from_config(cfg: &TrainConfig, gpu_budget: Option<String>, store: Option<String>) -> RunFile {
        let custom = cfg.custom_model;
        RunFile {
            model: custom.is_none().then(|| cfg.model.clone()),
            n_layer: custom.map(|m| m.n_layer),
            n_head: custom.map(|m| m.n_head),
            n_embd: custom.map(|m| m.n_embd),
            block_size: custom.map(|m| m.block_size),
            steps: Some(cfg.steps),
            batch_size: Some(cfg.batch_size),
            accum: Some(cfg.accum),
            seq_len: Some(cfg.seq_len),
            lr: Some(cfg.lr),
            min_lr: cfg.min_lr,
            warmup_steps: Some(cfg.warmup_steps),
            weight_decay: Some(cfg.weight_decay),
            grad_clip: Some(cfg.grad_clip),
            seed: Some(cfg.seed),
            data: cfg.data.clone(),
            val_data: cfg.val_data.clone(),
            out: Some(cfg.out.clone()),
            resume: cfg.resume.clone(),
            init_from: cfg.init_from.clone(),
            eval_batches: Some(cfg.eval_batches),
            eval_every: Some(cfg.eval_every),
            sample_len: Some(cfg.sample_len),
            sample_prompt: cfg.sample_prompt.clone(),
            temperature: Some(cfg.sampling.temperature),
            top_k: Some(cfg.sampling.top_k),
            top_p: Some(cfg.sampling.top_p),
            checkpoint_every: Some(cfg.checkpoint_every),
            optimizer_on: Some(format!("{:?}", cfg.optimizer_on).to_lowercase()),
            delayed_update: cfg.delayed_update,
            recompute: Some(cfg.recompute),
            auto_recompute: Some(cfg.auto_recompute),
            freeze_int8: cfg.freeze_int8.clone(),
            precision: Some(format!("{:?}", cfg.precision).to_lowercase()),
            tokenizer: Some(cfg.tokenizer),
            gpu_budget,
            store,
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a run file serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_what_it_names_and_round_trips() {
        let f = RunFile::parse(
            "steps = 7\nbatch_size = 3\nseq_len = 32\nlr = 0.001\nmin_lr = 1e-5\nprecision = \"f16\"\n\
             n_layer = 3\nn_head = 2\nn_embd = 48\nblock_size = 40\ntokenizer = \"gpt2\"\ngpu_budget = \"64MiB\"\n\
             sample_prompt = \"Once\"\ntemperature = 0.5\ntop_k = 40\ntop_p = 0.9\ndelayed_update = 40\n",
        )
        .unwrap();
        let c = f.apply(TrainConfig::default()).unwrap();
        assert_eq!((c.steps, c.batch_size, c.seq_len, c.lr, c.min_lr), (7, 3, 32, 0.001, Some(1e-5)));
        assert_eq!(c.precision, Precision::F16);
        assert_eq!(c.delayed_update, Some(40));
        assert_eq!(c.tokenizer, Tokenizer::Gpt2);
        assert_eq!(c.sample_prompt.as_deref(), Some("Once"));
        assert_eq!((c.sampling.temperature, c.sampling.top_k, c.sampling.top_p), (0.5, 40, 0.9));
        assert_eq!(c.custom_model, Some(ModelShape { n_layer: 3, n_head: 2, n_embd: 48, block_size: 40 }));
        assert_eq!(c.warmup_steps, TrainConfig::default().warmup_steps, "unnamed keys keep their defaults");
        let again = RunFile::parse(&RunFile::from_config(&c, f.gpu_budget.clone(), None).to_toml()).unwrap();
        let c2 = again.apply(TrainConfig::default()).unwrap();
        assert_eq!(format!("{c:?}"), format!("{c2:?}"));
        assert_eq!(again.gpu_budget.as_deref(), Some("64MiB"));
    }

    #[test]
    fn mistakes_name_the_key() {
        for (text, key) in [
            ("stesp = 3", "stesp"),
            ("steps = \"three\"", "steps"),
            ("precision = \"f8\"", "f8"),
            ("optimizer_on = \"tpu\"", "tpu"),
            ("n_layer = 2", "n_head"),
            ("steps = ", "steps"),
        ] {
            let err = RunFile::parse(text).and_then(|f| f.apply(TrainConfig::default()).map_err(|e| e.to_string()));
            let err = err.expect_err(text);
            assert!(err.contains(key), "{text}: {err}");
        }
    }
}
