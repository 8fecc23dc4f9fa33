//! Checkpoints in safetensors with Hugging Face GPT-2 names and layouts: `model.safetensors` +
//! `config.json` load unchanged into transformers' `GPT2LMHeadModel`; `optimizer.safetensors`
//! holds the AdamW moments. Files are written atomically (temp file, fsync, rename) and carry the
//! step in their metadata, so a reader can tell a torn pair.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

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

/// A tensor read from a checkpoint, converted to f32.
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// What `load` finds in a checkpoint directory.
pub struct Checkpoint {
    pub config: GptConfig,
    /// Present in checkpoints written by pagetrain.
    pub state: Option<TrainState>,
    pub weights: HashMap<String, HostTensor>,
    /// AdamW moments by `<param>.exp_avg` / `<param>.exp_avg_sq`, and the step count `t`.
    pub optimizer: Option<(HashMap<String, HostTensor>, u64)>,
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
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
    f.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    if let Some(dir) = path.parent() {
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

async fn host_tensors(ctx: &Context, named: Vec<(String, &Tensor)>) -> Result<Vec<(String, Vec<usize>, Vec<u8>)>> {
    let mut out = Vec::with_capacity(named.len());
    for (name, t) in named {
        let data = ctx.to_f32(t).await?;
        out.push((name, t.shape().to_vec(), bytemuck::cast_slice(&data).to_vec()));
    }
    Ok(out)
}

fn serialize(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)], meta: HashMap<String, String>) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|(n, s, d)| TensorView::new(Dtype::F32, s.clone(), d).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ckpt_err(path, e.to_string()))?;
    safetensors::serialize(views, Some(meta)).map_err(|e| ckpt_err(path, e.to_string()))
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

/// Reads model and optimizer state back from the GPU and serializes the checkpoint files.
pub async fn encode(ctx: &Context, model: &Gpt, opt: Moments<'_>, state: &TrainState) -> Result<CheckpointFiles> {
    let here = Path::new(MODEL_FILE);
    let state_json = serde_json::to_string(state).map_err(|e| ckpt_err(here, e.to_string()))?;
    let meta = |extra: &[(&str, String)]| {
        let mut m: HashMap<String, String> = HashMap::from([
            ("format".into(), "pt".into()),
            ("pagetrain_format_version".into(), FORMAT_VERSION.to_string()),
            ("step".into(), state.step.to_string()),
            ("train_state".into(), state_json.clone()),
        ]);
        m.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        m
    };
    // Everything that must come back from the GPU comes back in one round trip.
    let mut ids: Vec<_> = model.params().iter().map(|p| p.value.id()).collect();
    ids.extend(opt.m.iter().chain(opt.v.iter()).map(|t| t.id()));
    ctx.pager.sync_to_host(&ids)?;
    let mut weights = Vec::new();
    for (name, stored) in model.stored() {
        let (shape, data) = match stored {
            Stored::F32(t) => (t.shape().to_vec(), ctx.to_f32(t).await?),
            Stored::Int8(q) => (vec![q.rows, q.cols], q.dequantize(ctx).await?),
        };
        weights.push((name, shape, bytemuck::cast_slice(&data).to_vec()));
    }
    let params = model.params();
    let moments: Vec<(String, &Tensor)> = params
        .iter()
        .zip(opt.m.iter().zip(opt.v.iter()))
        .flat_map(|(p, (m, v))| [(format!("{}.exp_avg", p.name), m), (format!("{}.exp_avg_sq", p.name), v)])
        .collect();
    let moments = host_tensors(ctx, moments).await?;
    Ok(CheckpointFiles {
        model: serialize(here, &weights, meta(&[]))?,
        optimizer: serialize(Path::new(OPTIMIZER_FILE), &moments, meta(&[("adam_t", opt.t.to_string())]))?,
        config: serde_json::to_vec_pretty(&hf_config_json(&model.config)).map_err(|e| ckpt_err(here, e.to_string()))?,
    })
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
    let files = encode(ctx, model, opt, state).await?;
    let name = format!("step-{:08}", state.step);
    let step_dir = dir.join(&name);
    std::fs::create_dir_all(&step_dir).map_err(|e| Error::io(&step_dir, e))?;
    write_atomic(&step_dir.join(OPTIMIZER_FILE), &files.optimizer)?;
    write_atomic(&step_dir.join(CONFIG_FILE), &files.config)?;
    write_atomic(&step_dir.join(MODEL_FILE), &files.model)?;
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

/// Tensors and metadata of a safetensors file.
pub type SafetensorsContents = (HashMap<String, HostTensor>, HashMap<String, String>);

fn read_safetensors(path: &Path) -> Result<SafetensorsContents> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_safetensors(path, &bytes)
}

/// The tensors (as f32) and metadata of safetensors `bytes` read from `path` (named in errors).
pub fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<SafetensorsContents> {
    let st =
        SafeTensors::deserialize(bytes).map_err(|e| ckpt_err(path, format!("not a valid safetensors file: {e}")))?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| ckpt_err(path, e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytemuck::pod_collect_to_vec(view.data()),
            Dtype::F16 => {
                view.data().chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            Dtype::BF16 => {
                view.data().chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            other => {
                return Err(ckpt_err(
                    path,
                    format!("tensor `{name}` has dtype {other:?}; f32, f16 and bf16 are supported"),
                ))
            }
        };
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(ckpt_err(path, format!("tensor `{name}` holds a non-finite value at {i}")));
        }
        tensors.insert(name, HostTensor { shape: view.shape().to_vec(), data });
    }
    Ok((tensors, meta))
}

/// Reads a checkpoint directory written by pagetrain, or any GPT-2-layout one (`config.json` +
/// `model.safetensors`, as Hugging Face saves them).
pub fn load(dir: &Path) -> Result<Checkpoint> {
    if !dir.is_dir() {
        return Err(ckpt_err(dir, "is not a directory"));
    }
    let dir = &resolve(dir);
    let model_path = dir.join(MODEL_FILE);
    let (mut weights, meta) = read_safetensors(&model_path)?;
    // GPT2Model checkpoints name tensors without the `transformer.` prefix.
    if weights.keys().any(|k| k.starts_with("h.") || k == "wte.weight") {
        weights = weights.into_iter().map(|(k, v)| (format!("transformer.{k}"), v)).collect();
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
    let held: f64 = weights.values().map(|t| t.data.len() as f64).sum();
    if config.num_params_f64() > held {
        return Err(ckpt_err(
            &model_path,
            format!("the config describes {:.0} parameters, the file holds {held:.0} values", config.num_params_f64()),
        ));
    }
    let opt_path = dir.join(OPTIMIZER_FILE);
    let optimizer = if opt_path.exists() {
        let (moments, ometa) = read_safetensors(&opt_path)?;
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

fn take<'a>(path: &Path, map: &'a HashMap<String, HostTensor>, name: &str, want: &[usize]) -> Result<&'a HostTensor> {
    let t = map.get(name).ok_or_else(|| ckpt_err(path, format!("missing tensor `{name}`")))?;
    if t.shape != want {
        return Err(ckpt_err(path, format!("tensor `{name}` has shape {:?}, the model needs {want:?}", t.shape)));
    }
    Ok(t)
}

/// Copies the checkpoint's weights into `model` (every parameter must be present, shapes equal).
pub fn load_weights(ctx: &Context, dir: &Path, model: &Gpt, weights: &HashMap<String, HostTensor>) -> Result<()> {
    let params: Vec<&Param> = model.params();
    // Check everything before writing anything.
    let path = resolve(dir).join(MODEL_FILE);
    for p in &params {
        take(&path, weights, &p.name, p.value.shape())?;
    }
    for p in params {
        ctx.write_f32(&p.value, &weights[&p.name].data)?;
    }
    Ok(())
}

/// Copies the AdamW moments into `opt` (the caller restores the step count).
pub fn load_optimizer(
    ctx: &Context,
    dir: &Path,
    model: &Gpt,
    opt: Moments<'_>,
    moments: &HashMap<String, HostTensor>,
) -> Result<()> {
    let params = model.params();
    let path = resolve(dir).join(OPTIMIZER_FILE);
    for p in &params {
        take(&path, moments, &format!("{}.exp_avg", p.name), p.value.shape())?;
        take(&path, moments, &format!("{}.exp_avg_sq", p.name), p.value.shape())?;
    }
    for (i, p) in params.iter().enumerate() {
        ctx.write_f32(&opt.m[i], &moments[&format!("{}.exp_avg", p.name)].data)?;
        ctx.write_f32(&opt.v[i], &moments[&format!("{}.exp_avg_sq", p.name)].data)?;
    }
    Ok(())
}

/// The directory's model file, for messages.
pub fn model_path(dir: &Path) -> PathBuf {
    resolve(dir).join(MODEL_FILE)
}
