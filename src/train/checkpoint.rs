//! Checkpoints in safetensors with Hugging Face GPT-2 names and layouts: `model.safetensors` +
//! `config.json` load unchanged into transformers' `GPT2LMHeadModel`; `optimizer.safetensors`
//! holds the AdamW moments. Files are written atomically (temp file, fsync, rename) and carry the
//! step in their metadata, so a reader can tell a torn pair. Both are written and read a tensor
//! at a time (see [`super::tensor_file`]): a checkpoint never needs all weights and moments in
//! RAM at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::tensor_file::{TensorFile, TensorFileWriter};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::{Gpt, GptConfig, Module, Param, Stored};
use crate::tensor::Tensor;

pub const FORMAT_VERSION: u32 = 1;
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const CONFIG_FILE: &str = "config.json";

/// Where a run stands, saved next to the weights.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    pub step: u64,
    /// Seed of the per-step batch sampler (batch of step n = f(seed, n)).
    pub data_seed: u64,
    /// Character vocabulary of a text-trained model (None for token-file data).
    pub vocab: Option<Vec<char>>,
    pub config: GptConfig,
    /// Pattern of the Linear layers frozen in int8 (`--freeze-int8`), restored on resume.
    #[serde(default)]
    pub frozen_int8: Option<String>,
    /// Mixed precision's dynamic loss scale and the good steps since it last changed, so an f16
    /// run resumes exactly (absent: a fresh scale).
    #[serde(default)]
    pub loss_scale: Option<LossScale>,
}

/// The state of dynamic loss scaling.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    pub scale: f32,
    pub good_steps: u64,
    pub skipped_steps: u64,
}

/// What `load` finds in a checkpoint directory: the headers of its files, read and checked;
/// tensors are read one at a time when they are copied into a model.
pub struct Checkpoint {
    pub config: GptConfig,
    /// Present in checkpoints written by pagetrain.
    pub state: Option<TrainState>,
    pub weights: TensorFile,
    /// AdamW moments by `<param>.exp_avg` / `<param>.exp_avg_sq`, and the step count `t`.
    pub optimizer: Option<(TensorFile, u64)>,
}

fn ckpt_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), msg: msg.into() }
}

/// Hugging Face's `config.json` for a GPT-2 of this shape.
pub fn hf_config_json(c: &GptConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": null,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
    })
}

/// The model a Hugging Face GPT-2 `config.json` (its `text`, read from `path`) describes.
pub fn config_from_hf_json(path: &Path, text: &str) -> Result<GptConfig> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| ckpt_err(path, e.to_string()))?;
    config_from_hf(path, &v)
}

fn config_from_hf(path: &Path, v: &serde_json::Value) -> Result<GptConfig> {
    let get = |key: &str| -> Result<usize> {
        v.get(key)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| ckpt_err(path, format!("config.json lacks `{key}`")))
    };
    if let Some(act) = v.get("activation_function").and_then(|a| a.as_str()) {
        if act != "gelu_new" && act != "gelu_pytorch_tanh" {
            return Err(ckpt_err(path, format!("activation `{act}` is not GPT-2's tanh GELU")));
        }
    }
    let c = GptConfig {
        n_layer: get("n_layer")?,
        n_head: get("n_head")?,
        n_embd: get("n_embd")?,
        block_size: get("n_positions")?,
        vocab_size: get("vocab_size")?,
    };
    c.validate().map_err(|e| ckpt_err(path, e.to_string()))?;
    Ok(c)
}

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename.
#[cfg(not(target_arch = "wasm32"))]
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let (staged, mut w) = Staged::create(path)?;
    w.write_all(bytes).map_err(|e| Error::io(&staged.tmp, e))?;
    staged.commit(w)
}

/// The three files of a checkpoint, as bytes (the browser offers them as downloads).
pub struct CheckpointFiles {
    pub model: Vec<u8>,
    pub optimizer: Vec<u8>,
    pub config: Vec<u8>,
}

/// Optimizer state as a checkpoint sees it: AdamW's moments (one per parameter) and step count.
pub struct Moments<'a> {
    pub m: &'a [Tensor],
    pub v: &'a [Tensor],
    pub t: u64,
}

/// The metadata both files carry; `extra` adds to it.
fn file_meta(state: &TrainState, extra: &[(&str, String)]) -> Result<HashMap<String, String>> {
    let state_json = serde_json::to_string(state).map_err(|e| ckpt_err(Path::new(MODEL_FILE), e.to_string()))?;
    let mut m: HashMap<String, String> = HashMap::from([
        ("format".into(), "pt".into()),
        ("pagetrain_format_version".into(), FORMAT_VERSION.to_string()),
        ("step".into(), state.step.to_string()),
        ("train_state".into(), state_json),
    ]);
    m.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    Ok(m)
}

/// Writes the model's weights (int8-frozen ones dequantized) to `out` as safetensors, a tensor
/// at a time from the pager.
async fn write_model<W: std::io::Write>(
    ctx: &Context,
    path: &Path,
    out: W,
    model: &Gpt,
    state: &TrainState,
) -> Result<W> {
    let stored = model.stored();
    let shapes: Vec<(String, Vec<usize>)> = stored
        .iter()
        .map(|(name, s)| match s {
            Stored::F32(t) => (name.clone(), t.shape().to_vec()),
            Stored::Int8(q) => (name.clone(), vec![q.rows, q.cols]),
        })
        .collect();
    let mut w = TensorFileWriter::new(path, out, &shapes, file_meta(state, &[])?)?;
    for (name, s) in &stored {
        let data = match s {
            Stored::F32(t) => ctx.to_f32(t).await?,
            Stored::Int8(q) => q.dequantize(ctx).await?,
        };
        w.write(name, &data)?;
    }
    w.finish()
}

/// Writes AdamW's moments to `out` as safetensors, a tensor at a time.
async fn write_moments<W: std::io::Write>(
    ctx: &Context,
    path: &Path,
    out: W,
    model: &Gpt,
    opt: &Moments<'_>,
    state: &TrainState,
) -> Result<W> {
    let params = model.params();
    let moments: Vec<(String, &Tensor)> = params
        .iter()
        .zip(opt.m.iter().zip(opt.v.iter()))
        .flat_map(|(p, (m, v))| [(format!("{}.exp_avg", p.name), m), (format!("{}.exp_avg_sq", p.name), v)])
        .collect();
    let shapes: Vec<(String, Vec<usize>)> = moments.iter().map(|(n, t)| (n.clone(), t.shape().to_vec())).collect();
    let mut w = TensorFileWriter::new(path, out, &shapes, file_meta(state, &[("adam_t", opt.t.to_string())])?)?;
    for (name, t) in &moments {
        w.write(name, &ctx.to_f32(t).await?)?;
    }
    w.finish()
}

/// Brings every weight and moment the GPU changed back to the host store in one round trip.
fn sync_state(ctx: &Context, model: &Gpt, opt: &Moments<'_>) -> Result<()> {
    let mut ids: Vec<_> = model.params().iter().map(|p| p.value.id()).collect();
    ids.extend(opt.m.iter().chain(opt.v.iter()).map(|t| t.id()));
    ctx.pager.sync_to_host(&ids)
}

/// The checkpoint files as bytes (where there is no file system to stream them to).
pub async fn encode(ctx: &Context, model: &Gpt, opt: Moments<'_>, state: &TrainState) -> Result<CheckpointFiles> {
    sync_state(ctx, model, &opt)?;
    let here = Path::new(MODEL_FILE);
    Ok(CheckpointFiles {
        model: write_model(ctx, here, Vec::new(), model, state).await?,
        optimizer: write_moments(ctx, Path::new(OPTIMIZER_FILE), Vec::new(), model, &opt, state).await?,
        config: serde_json::to_vec_pretty(&hf_config_json(&model.config)).map_err(|e| ckpt_err(here, e.to_string()))?,
    })
}

/// A file written under a temporary name, renamed into place by [`Staged::commit`].
#[cfg(not(target_arch = "wasm32"))]
struct Staged {
    path: PathBuf,
    tmp: PathBuf,
}

#[cfg(not(target_arch = "wasm32"))]
impl Staged {
    fn create(path: &Path) -> Result<(Staged, std::io::BufWriter<std::fs::File>)> {
        let tmp = path.with_extension("tmp");
        let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok((Staged { path: path.to_path_buf(), tmp }, std::io::BufWriter::with_capacity(1 << 20, f)))
    }

    /// fsync, rename over `path`, and make the rename durable.
    fn commit(self, w: std::io::BufWriter<std::fs::File>) -> Result<()> {
        let f = w.into_inner().map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        f.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        drop(f);
        std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))?;
        if let Some(dir) = self.path.parent() {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

/// Where the newest complete checkpoint under `dir` is: `dir/latest` (a link to a `step-N`
/// directory) when present, else `dir` itself (a plain Hugging Face-style directory).
pub fn resolve(dir: &Path) -> PathBuf {
    let latest = dir.join(LATEST);
    if latest.join(MODEL_FILE).exists() {
        return latest;
    }
    #[cfg(not(unix))]
    if let Ok(name) = std::fs::read_to_string(&latest) {
        return dir.join(name.trim());
    }
    dir.to_path_buf()
}

/// Checkpoints written by `save` keep this many step directories (the newest first).
pub const KEEP: usize = 2;
pub const LATEST: &str = "latest";

/// Writes model, optimizer and config into `dir/step-N/` and only then points `dir/latest` at it
/// (an atomic rename), so a process killed at any moment leaves the last complete checkpoint in
/// place and no torn files. Older step directories beyond `KEEP` are removed.
#[cfg(not(target_arch = "wasm32"))]
pub async fn save(ctx: &Context, dir: &Path, model: &Gpt, opt: Moments<'_>, state: &TrainState) -> Result<PathBuf> {
    sync_state(ctx, model, &opt)?;
    let name = format!("step-{:08}", state.step);
    let step_dir = dir.join(&name);
    std::fs::create_dir_all(&step_dir).map_err(|e| Error::io(&step_dir, e))?;
    let path = step_dir.join(OPTIMIZER_FILE);
    let (staged, w) = Staged::create(&path)?;
    staged.commit(write_moments(ctx, &path, w, model, &opt, state).await?)?;
    let config = serde_json::to_vec_pretty(&hf_config_json(&model.config)).map_err(|e| ckpt_err(dir, e.to_string()))?;
    write_atomic(&step_dir.join(CONFIG_FILE), &config)?;
    let path = step_dir.join(MODEL_FILE);
    let (staged, w) = Staged::create(&path)?;
    staged.commit(write_model(ctx, &path, w, model, state).await?)?;
    point_latest(dir, &name)?;
    prune(dir, &name);
    Ok(step_dir)
}

/// Creates `dir` and checks that files can be written there (a run checks its `--out` before
/// training, not at its first checkpoint).
#[cfg(not(target_arch = "wasm32"))]
pub fn check_writable(dir: &Path) -> Result<()> {
    let unwritable = |e: std::io::Error| {
        let why = if dir.is_file() { "it is a file".to_string() } else { e.to_string() };
        Error::io(dir, std::io::Error::new(e.kind(), format!("checkpoints cannot be written here: {why}")))
    };
    std::fs::create_dir_all(dir).map_err(unwritable)?;
    let probe = dir.join(format!(".write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(unwritable)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(unix)]
pub(crate) fn point_latest(dir: &Path, name: &str) -> Result<()> {
    let tmp = dir.join("latest.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, dir.join(LATEST)).map_err(|e| Error::io(dir.join(LATEST), e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(all(not(unix), not(target_arch = "wasm32")))]
pub(crate) fn point_latest(dir: &Path, name: &str) -> Result<()> {
    write_atomic(&dir.join(LATEST), name.as_bytes())
}

/// Removes step directories other than the `KEEP` newest (never `current`).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn prune(dir: &Path, current: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut steps: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-") && n.as_str() != current)
        .collect();
    steps.sort();
    let extra = steps.len().saturating_sub(KEEP - 1);
    for old in &steps[..extra] {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
}

/// Reads a checkpoint directory written by pagetrain, or any GPT-2-layout one (`config.json` +
/// `model.safetensors`, as Hugging Face saves them).
pub fn load(dir: &Path) -> Result<Checkpoint> {
    if !dir.is_dir() {
        return Err(ckpt_err(dir, "is not a directory"));
    }
    let dir = &resolve(dir);
    let model_path = dir.join(MODEL_FILE);
    let mut weights = TensorFile::open(&model_path)?;
    let meta = weights.metadata();
    // GPT2Model checkpoints name tensors without the `transformer.` prefix.
    if weights.names().any(|k| k.starts_with("h.") || k == "wte.weight") {
        weights.add_prefix("transformer.");
    }
    let state: Option<TrainState> = match meta.get("train_state") {
        Some(s) => {
            Some(serde_json::from_str(s).map_err(|e| ckpt_err(&model_path, format!("bad train_state metadata: {e}")))?)
        }
        None => None,
    };
    let config = match &state {
        Some(s) => s.config,
        None => {
            let path = dir.join(CONFIG_FILE);
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            config_from_hf_json(&path, &text)?
        }
    };
    // A model is built (its parameters allocated) before its weights are copied in: a config
    // that promises more parameters than the file holds is refused first, so a hostile file
    // cannot make us allocate more than it justifies.
    let held = weights.elements();
    if config.num_params_f64() > held {
        return Err(ckpt_err(
            &model_path,
            format!("the config describes {:.0} parameters, the file holds {held:.0} values", config.num_params_f64()),
        ));
    }
    let opt_path = dir.join(OPTIMIZER_FILE);
    let optimizer = if opt_path.exists() {
        let moments = TensorFile::open(&opt_path)?;
        let ometa = moments.metadata();
        if ometa.get("step") != meta.get("step") {
            return Err(ckpt_err(
                dir,
                format!(
                    "optimizer step {:?} and model step {:?} differ: torn checkpoint",
                    ometa.get("step"),
                    meta.get("step")
                ),
            ));
        }
        let t =
            ometa.get("adam_t").and_then(|t| t.parse().ok()).ok_or_else(|| ckpt_err(&opt_path, "missing adam_t"))?;
        Some((moments, t))
    } else {
        // A data-parallel run's checkpoint holds one shard of the moments per rank.
        crate::dist::shard_files::assemble(dir, meta.get("step"))?
    };
    Ok(Checkpoint { config, state, weights, optimizer })
}

/// Checks that `file` holds `name` with shape `want`.
fn check_shape(file: &TensorFile, name: &str, want: &[usize]) -> Result<()> {
    match file.shape(name) {
        None => Err(ckpt_err(file.path(), format!("missing tensor `{name}`"))),
        Some(s) if s != want => {
            Err(ckpt_err(file.path(), format!("tensor `{name}` has shape {s:?}, the model needs {want:?}")))
        }
        Some(_) => Ok(()),
    }
}

/// Copies the checkpoint's weights into `model`, one tensor at a time (every parameter must be
/// present, shapes equal — checked from the header before anything is read).
pub fn load_weights(ctx: &Context, model: &Gpt, weights: &TensorFile) -> Result<()> {
    let params: Vec<&Param> = model.params();
    for p in &params {
        check_shape(weights, &p.name, p.value.shape())?;
    }
    for p in params {
        ctx.write_f32(&p.value, &weights.read_f32(&p.name)?)?;
    }
    Ok(())
}

/// Copies the AdamW moments into `opt`, one tensor at a time (the caller restores the step count).
pub fn load_optimizer(ctx: &Context, model: &Gpt, opt: Moments<'_>, moments: &TensorFile) -> Result<()> {
    let params = model.params();
    let names = |p: &Param| [format!("{}.exp_avg", p.name), format!("{}.exp_avg_sq", p.name)];
    for p in &params {
        for n in names(p) {
            check_shape(moments, &n, p.value.shape())?;
        }
    }
    for (i, p) in params.iter().enumerate() {
        let [m, v] = names(p);
        ctx.write_f32(&opt.m[i], &moments.read_f32(&m)?)?;
        ctx.write_f32(&opt.v[i], &moments.read_f32(&v)?)?;
    }
    Ok(())
}

/// The directory's model file, for messages.
pub fn model_path(dir: &Path) -> PathBuf {
    resolve(dir).join(MODEL_FILE)
}
