//! Checkpoints of a sharded run. Every rank writes its shard of the AdamW moments,
//! `optimizer.shard-R-of-N.safetensors`, as pieces named `<param>.exp_avg@<first element>`;
//! rank 0 writes `model.safetensors` and `config.json` as a single process does (after the
//! all-gather every rank holds the whole model), then points `latest` at the step. Reading
//! assembles the whole moments from the N shard files, so any number of ranks — one included —
//! resumes from them; `pagetrain merge-shards DIR` writes them out as the usual
//! `optimizer.safetensors`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};

use super::ShardedAdamW;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::{Gpt, Module};
use crate::train::checkpoint;
use crate::train::tensor_file::{TensorFile, TensorFileWriter};

/// A whole moment tensor rebuilt from the shards' pieces.
struct Whole {
    shape: Vec<usize>,
    data: Vec<f32>,
}

fn ckpt_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), msg: msg.into() }
}

/// The shard file of `rank` of `ranks`.
pub fn shard_file(rank: usize, ranks: usize) -> String {
    format!("optimizer.shard-{rank:03}-of-{ranks:03}.safetensors")
}

/// `(rank, ranks)` from a shard file's name.
fn parse_shard_file(name: &str) -> Option<(usize, usize)> {
    let mid = name.strip_prefix("optimizer.shard-")?.strip_suffix(".safetensors")?;
    let (r, n) = mid.split_once("-of-")?;
    Some((r.parse().ok()?, n.parse().ok()?))
}

/// Serializes this rank's shard: the pieces, the step, AdamW's step count and every parameter's
/// shape (so the whole tensors can be rebuilt from the shards alone).
pub fn encode_shard(ctx: &Context, model: &Gpt, opt: &ShardedAdamW, step: u64) -> Result<Vec<u8>> {
    let params = model.params();
    let pieces = opt.shard_pieces(ctx)?;
    let mut named = Vec::with_capacity(2 * pieces.len());
    for p in &pieces {
        let (name, offset) = (&params[p.param].name, p.offset);
        named.push((format!("{name}.exp_avg@{offset}"), &p.m));
        named.push((format!("{name}.exp_avg_sq@{offset}"), &p.v));
    }
    let shapes: HashMap<&str, &[usize]> = params.iter().map(|p| (p.name.as_str(), p.value.shape())).collect();
    let here = Path::new("optimizer shard");
    let meta = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("step".to_string(), step.to_string()),
        ("adam_t".to_string(), opt.t.to_string()),
        ("shapes".to_string(), serde_json::to_string(&shapes).map_err(|e| ckpt_err(here, e.to_string()))?),
    ]);
    let views = named
        .iter()
        .map(|(n, d)| TensorView::new(Dtype::F32, vec![d.len()], bytemuck::cast_slice(d)).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ckpt_err(here, e.to_string()))?;
    safetensors::serialize(views, Some(meta)).map_err(|e| ckpt_err(here, e.to_string()))
}

/// Writes a checkpoint of a sharded run into `dir/step-N/` (every rank calls it at the same
/// step): each rank its shard, rank 0 the model, `config.json` and `run_file` as `run.toml`;
/// `latest` moves only once every shard is on disk.
#[cfg(not(target_arch = "wasm32"))]
pub async fn save(
    ctx: &Context,
    dist: &super::Dist,
    dir: &Path,
    model: &Gpt,
    opt: &ShardedAdamW,
    state: &checkpoint::TrainState,
    run_file: Option<&str>,
) -> Result<PathBuf> {
    let name = format!("step-{:08}", state.step);
    let step_dir = dir.join(&name);
    std::fs::create_dir_all(&step_dir).map_err(|e| Error::io(&step_dir, e))?;
    let shard = encode_shard(ctx, model, opt, state.step)?;
    checkpoint::write_atomic(&step_dir.join(shard_file(dist.rank(), dist.size())), &shard)?;
    if dist.is_lead() {
        let none = checkpoint::Moments { m: &[], v: &[], t: opt.t };
        let files = checkpoint::encode(ctx, model, none, state).await?;
        checkpoint::write_atomic(&step_dir.join(checkpoint::CONFIG_FILE), &files.config)?;
        checkpoint::write_atomic(&step_dir.join(checkpoint::MODEL_FILE), &files.model)?;
        if let Some(text) = run_file {
            checkpoint::write_atomic(&step_dir.join("run.toml"), text.as_bytes())?;
        }
    }
    dist.comm.barrier();
    if dist.is_lead() {
        checkpoint::point_latest(dir, &name)?;
        checkpoint::prune(dir, &name);
    }
    dist.comm.barrier();
    Ok(step_dir)
}

/// The whole AdamW moments (`<param>.exp_avg`, `<param>.exp_avg_sq`) and step count assembled
/// from the shard files in `dir`, as an in-memory safetensors file, or None when it has none.
/// `step`: the model file's step (a shard of another step is a torn checkpoint). Every element
/// must come from exactly one shard. (Unlike a single process's checkpoint, this holds the whole
/// moments in RAM while a run resumes.)
pub fn assemble(dir: &Path, step: Option<&String>) -> Result<Option<(TensorFile, u64)>> {
    let Some((moments, t)) = assemble_moments(dir, step)? else { return Ok(None) };
    let bytes = encode_moments(dir, &moments, HashMap::from([("adam_t".to_string(), t.to_string())]))?;
    Ok(Some((TensorFile::from_bytes(&dir.join("optimizer shards"), bytes)?, t)))
}

/// `moments` as safetensors bytes (sorted by name) with `meta`.
fn encode_moments(dir: &Path, moments: &HashMap<String, Whole>, meta: HashMap<String, String>) -> Result<Vec<u8>> {
    let mut names: Vec<&String> = moments.keys().collect();
    names.sort();
    let shapes: Vec<(String, Vec<usize>)> = names.iter().map(|n| ((*n).clone(), moments[*n].shape.clone())).collect();
    let mut w = TensorFileWriter::new(&dir.join(checkpoint::OPTIMIZER_FILE), Vec::new(), &shapes, meta)?;
    for n in names {
        w.write(n, &moments[n].data)?;
    }
    w.finish()
}

fn assemble_moments(dir: &Path, step: Option<&String>) -> Result<Option<(HashMap<String, Whole>, u64)>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(None) };
    let mut files: Vec<(usize, usize, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let (r, n) = parse_shard_file(e.file_name().to_str()?)?;
            Some((r, n, e.path()))
        })
        .collect();
    if files.is_empty() {
        return Ok(None);
    }
    files.sort();
    let ranks = files[0].1;
    if files.len() != ranks || files.iter().enumerate().any(|(i, f)| f.0 != i || f.1 != ranks) {
        let found: Vec<String> = files.iter().map(|f| format!("{} of {}", f.0, f.1)).collect();
        return Err(ckpt_err(dir, format!("optimizer shards incomplete: found {}", found.join(", "))));
    }
    let mut full: HashMap<String, Whole> = HashMap::new();
    let mut filled: HashMap<String, usize> = HashMap::new();
    let mut adam_t = None;
    for (_, _, path) in &files {
        let file = TensorFile::open(path)?;
        let meta = file.metadata();
        if meta.get("step") != step {
            return Err(ckpt_err(
                path,
                format!("shard of step {:?}, the model is of step {step:?}: torn checkpoint", meta.get("step")),
            ));
        }
        let t: u64 = meta.get("adam_t").and_then(|t| t.parse().ok()).ok_or_else(|| ckpt_err(path, "missing adam_t"))?;
        if adam_t.is_some_and(|a| a != t) {
            return Err(ckpt_err(path, "shards disagree on adam_t"));
        }
        adam_t = Some(t);
        let shapes: HashMap<String, Vec<usize>> = meta
            .get("shapes")
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| ckpt_err(path, "missing or bad `shapes` metadata"))?;
        let names: Vec<String> = file.names().map(String::from).collect();
        for name in names {
            let piece = file.read_f32(&name)?;
            let (tensor, offset) = name
                .rsplit_once('@')
                .and_then(|(n, o)| Some((n.to_string(), o.parse::<usize>().ok()?)))
                .ok_or_else(|| ckpt_err(path, format!("tensor `{name}` is not named `<moment>@<offset>`")))?;
            let param = tensor.strip_suffix(".exp_avg_sq").or_else(|| tensor.strip_suffix(".exp_avg"));
            let shape = param
                .and_then(|p| shapes.get(p))
                .ok_or_else(|| ckpt_err(path, format!("tensor `{name}` names no parameter in `shapes`")))?;
            let numel: usize = shape.iter().product();
            let len = piece.len();
            if offset.checked_add(len).is_none_or(|end| end > numel) {
                return Err(ckpt_err(path, format!("piece `{name}` ({len} values) runs past {numel} elements")));
            }
            let whole = full
                .entry(tensor.clone())
                .or_insert_with(|| Whole { shape: shape.clone(), data: vec![f32::NAN; numel] });
            whole.data[offset..offset + len].copy_from_slice(&piece);
            *filled.entry(tensor).or_default() += len;
        }
    }
    for (name, t) in &full {
        if filled[name] != t.data.len() || t.data.iter().any(|v| v.is_nan()) {
            return Err(ckpt_err(dir, format!("optimizer shards do not cover `{name}` exactly once")));
        }
    }
    Ok(Some((full, adam_t.unwrap_or(0))))
}

/// Writes the moments assembled from `dir`'s shards as the usual `optimizer.safetensors` beside
/// them (for tools that read one file); returns its path.
#[cfg(not(target_arch = "wasm32"))]
pub fn merge(dir: &Path) -> Result<PathBuf> {
    let dir = checkpoint::resolve(dir);
    let model = dir.join(checkpoint::MODEL_FILE);
    let meta = TensorFile::open(&model)?.metadata();
    let (moments, t) =
        assemble_moments(&dir, meta.get("step"))?.ok_or_else(|| ckpt_err(&dir, "holds no optimizer shard files"))?;
    let mut ometa = meta.clone();
    ometa.insert("adam_t".into(), t.to_string());
    let out = dir.join(checkpoint::OPTIMIZER_FILE);
    let bytes = encode_moments(&dir, &moments, ometa)?;
    checkpoint::write_atomic(&out, &bytes)?;
    Ok(out)
}
