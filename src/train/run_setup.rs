//! What a run is set up with before its first step: its data (opened with the tokenizer and
//! the checkpoint's vocabulary in mind) and where its optimizer runs.

use super::checkpoint::Checkpoint;
use super::config::{OptimizerOn, Precision, TrainConfig};
use super::data::{Dataset, Vocab};
use super::tokenizer::{Tokenizer, GPT2_VOCAB};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::GptConfig;
use crate::optim::{kept_bytes_of, HostAdamW};

/// The fraction of the budget a split optimizer's GPU share may keep (`optim::SplitAdamW`); the
/// rest is the step's working set. 0.6 in f16, whose activations take half the bytes, a third in
/// f32 (GPT-2 small at a quarter budget, H100: f16 split at a half 89.0 / 90.9 ms a step against
/// 103.4 / 104.4 with AdamW on the host, BENCHMARKS stop 46; at 0.6 84.6 / 84.7 against 85.8 /
/// 85.5 at a half, 88.6 at 0.7, 209.7 at 0.8, stop 49: the host's share of the update paces the
/// forward, and a larger GPU share leaves it less to do until the working set no longer fits).
/// `PAGETRAIN_SPLIT_SHARE` (a fraction, 0 to 1) overrides. In bytes of `budget`, with the
/// share's name for messages ([`share_of`]).
pub(super) fn split_share(budget: u64, precision: Precision) -> (u64, String) {
    let default = match precision {
        Precision::F16 => 0.6,
        Precision::F32 => 1.0 / 3.0,
    };
    let asked = std::env::var("PAGETRAIN_SPLIT_SHARE").ok();
    let fraction = asked.as_deref().and_then(|v| v.parse::<f64>().ok()).filter(|&f| f > 0.0 && f <= 1.0);
    if let (Some(v), None) = (&asked, fraction) {
        // (it was a divisor until stop 49: "2" meant a half)
        log::warn!("PAGETRAIN_SPLIT_SHARE={v} is not a fraction of the budget between 0 and 1; using {default:.2}");
    }
    share_of(budget, fraction.unwrap_or(default))
}

/// `share` of `budget` bytes, and how a message names it ("1/2", "0.60").
fn share_of(budget: u64, share: f64) -> (u64, String) {
    let inverse = 1.0 / share;
    let name =
        if (inverse - inverse.round()).abs() < 1e-9 { format!("1/{}", inverse.round()) } else { format!("{share:.2}") };
    ((budget as f64 * share) as u64, name)
}

/// Where the optimizer should run, and why. `auto` keeps it on the GPU when parameters,
/// gradients and both moments (16 bytes per parameter) fit in half the budget, so they stay
/// resident. Otherwise it compares per-step estimates from what it measures here: the GPU
/// optimizer pages ~28 bytes per parameter across the bus (parameter, gradient, both moments in;
/// parameter and moments back), the host one ~8 (gradient down, parameter up) plus its CPU time
/// (the norm and update passes on all cores, timed here on arrays larger than the caches).
/// Where the host wins and the embedding's state fits in its share of the budget
/// ([`split_share`]), AdamW is split: the embedding (and the parameters after it that fit) update
/// on the GPU, the rest on the host.
pub(super) fn choose_optimizer(ctx: &Context, cfg: &TrainConfig, model: &GptConfig) -> (OptimizerOn, String) {
    let params = model.num_params() as f64;
    match cfg.optimizer_on {
        OptimizerOn::Gpu => (OptimizerOn::Gpu, "--optimizer-on gpu".into()),
        OptimizerOn::Host => (OptimizerOn::Host, "--optimizer-on host".into()),
        OptimizerOn::Split => (OptimizerOn::Split, "--optimizer-on split".into()),
        OptimizerOn::Auto => {
            if !ctx.pager.waits_may_block() {
                // (the measurements below wait for the GPU, which the browser cannot within a call)
                return (OptimizerOn::Gpu, "auto: the GPU (nothing is measured where waits cannot block)".into());
            }
            let states = 16.0 * params;
            let budget = ctx.pager.budget() as f64;
            if states * 2.0 <= budget {
                let why = format!(
                    "auto: optimizer state {:.0} MiB stays resident in the {:.0} MiB budget",
                    states / 1048576.0,
                    budget / 1048576.0
                );
                return (OptimizerOn::Gpu, why);
            }
            // The fused GPU update needs a parameter, its gradient and both moments on the GPU at once.
            let c = model.n_embd as f64;
            let largest = 4.0 * (model.vocab_size as f64 * c).max(4.0 * c * c).max(model.block_size as f64 * c);
            if 4.0 * largest > budget * 0.9 {
                let why = format!(
                    "auto: the GPU update of the largest parameter needs {:.0} MiB at once, over the {:.0} MiB budget",
                    4.0 * largest / 1048576.0,
                    budget / 1048576.0
                );
                return (OptimizerOn::Host, why);
            }
            let bus = ctx.pager.probe_upload_gbps(16 << 20).unwrap_or(1.0).max(0.01) * 1e9;
            // 32 Mi parameters (512 MiB of arrays) leave the caches, as a model's sweep does.
            let cpu = HostAdamW::measure_rate(1 << 25).max(1.0);
            let gpu_s = 28.0 * params / bus;
            // A delayed update's host pass runs beside the next step: only its bus traffic counts.
            let hidden = cfg.delayed_update.is_some() && crate::optim::worker_threads() > 1;
            let host_s = 8.0 * params / bus + if hidden { 0.0 } else { params / cpu };
            let figures = format!(
                "bus {:.1} GB/s, host AdamW {:.0} M params/s{}: the optimizer's share of a step (its bus traffic and host passes) ~{:.0} ms with AdamW on the GPU vs ~{:.0} ms on the host",
                bus / 1e9,
                cpu / 1e6,
                if hidden { ", its passes hidden by --delayed-update" } else { "" },
                gpu_s * 1e3,
                host_s * 1e3
            );
            // The embedding comes first in the forward: with its state on the GPU the next step
            // need not wait for its gradient to go down, the host to update it and it to go up.
            let embedding_values = (model.vocab_size * model.n_embd) as u64;
            let embedding = kept_bytes_of(embedding_values, cfg.precision == Precision::F16) as f64;
            let (share, share_name) = split_share(ctx.pager.budget(), cfg.precision);
            let splits = cfg.delayed_update.is_none() && embedding <= share as f64;
            if host_s < gpu_s && splits {
                (OptimizerOn::Split, format!("auto: {figures}; the embedding's state fits {share_name} of the budget"))
            } else if host_s < gpu_s {
                (OptimizerOn::Host, format!("auto: {figures}"))
            } else {
                (OptimizerOn::Gpu, format!("auto: {figures}"))
            }
        }
    }
}

/// The vocabulary a checkpoint implies under `tokenizer`: its own characters, or GPT-2's BPE
/// (asked for, or auto for a checkpoint without characters whose vocabulary is GPT-2's); `None`
/// leaves the choice to the data.
pub(super) fn checkpoint_vocab(tokenizer: Tokenizer, ckpt: &Checkpoint) -> Option<Vocab> {
    let chars = ckpt.state.as_ref().and_then(|s| s.vocab.clone()).map(Vocab::Chars);
    let is_gpt2 = chars.is_none() && ckpt.config.vocab_size == GPT2_VOCAB;
    match tokenizer {
        Tokenizer::Gpt2 => Some(Vocab::Gpt2),
        Tokenizer::Chars => chars,
        Tokenizer::Auto => chars.or(is_gpt2.then_some(Vocab::Gpt2)),
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(super) fn open_data(cfg: &TrainConfig, vocab: Option<Vocab>) -> Result<Dataset> {
    if let (Tokenizer::Chars, Some(path)) = (cfg.tokenizer, &cfg.data) {
        if path.extension().is_some_and(|e| e == "bin") {
            return Err(Error::Data {
                path: path.clone(),
                msg: "holds token ids: --tokenizer chars reads text files".into(),
            });
        }
    }
    let data = match &cfg.data {
        Some(path) => Dataset::open(path, vocab)?,
        None => Dataset::from_text(super::corpus::DEMO, "assets/corpus.txt (built in)", vocab)?,
    };
    match &cfg.val_data {
        Some(path) => {
            let val = Dataset::open(path, Some(data.vocab.clone()))?;
            data.with_validation(val)
        }
        None => Ok(data),
    }
}

#[cfg(target_arch = "wasm32")]
pub(super) fn open_data(cfg: &TrainConfig, vocab: Option<Vocab>) -> Result<Dataset> {
    match &cfg.data {
        Some(path) => {
            Err(Error::Data { path: path.clone(), msg: "files cannot be opened in the browser; pass a Dataset".into() })
        }
        None => Dataset::from_text(super::corpus::DEMO, "assets/corpus.txt (built in)", vocab),
    }
}

#[cfg(test)]
mod tests {
    use super::share_of;

    #[test]
    fn a_share_is_named_as_a_fraction_of_the_budget() {
        assert_eq!(share_of(3000, 1.0 / 3.0), (1000, "1/3".to_string()));
        assert_eq!(share_of(3000, 0.5), (1500, "1/2".to_string()));
        assert_eq!(share_of(3000, 0.6), (1800, "0.60".to_string()));
    }
}
