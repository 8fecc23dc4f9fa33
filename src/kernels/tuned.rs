//! Kernel choices measured on this adapter (`pagetrain tune`, [`crate::bench::autotune`]) and
//! kept on disk, so every later run on the same adapter, driver and pagetrain version starts
//! from them instead of the built-in defaults ([`super::Tuning::for_adapter`], which were
//! measured on lavapipe and an H200 and are guesses anywhere else).
//!
//! One small TOML file per adapter beside the pipeline caches
//! ([`super::pipeline_cache::cache_dir`]): `tuning-<key>.toml`. It names the adapter, driver and
//! version (and a checksum of the kernels' sources) it was measured for; a file for another (a
//! hash collision, a copied folder, a pagetrain whose kernels differ) or one that does not parse
//! is ignored with a warning.
//! Environment variables (`PAGETRAIN_MATMUL`, `PAGETRAIN_ATTENTION`, `PAGETRAIN_ATTENTION_LANES`)
//! still win over it, and `PAGETRAIN_TUNED=0` ignores it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::tuning::{HeadKernels, MatmulVariant, Tuning, TUNED_HEAD_SIZES};
use super::{attention, pipeline_cache};
use crate::device::Gpu;
use crate::error::{Error, Result};

/// The matmul family a product starts from (`matmul::pick` refines `Large` per shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulFamily {
    Direct,
    Tiled,
    Large,
}

impl MatmulFamily {
    pub const ALL: [MatmulFamily; 3] = [MatmulFamily::Direct, MatmulFamily::Tiled, MatmulFamily::Large];

    pub fn variant(self) -> MatmulVariant {
        match self {
            MatmulFamily::Direct => MatmulVariant::Direct,
            MatmulFamily::Tiled => MatmulVariant::Tiled,
            MatmulFamily::Large => MatmulVariant::Large,
        }
    }

    /// Whether `gpu` can run it (the large tiles' workgroup memory and bindings).
    pub fn runs_on(self, gpu: &Gpu) -> bool {
        self != MatmulFamily::Large || Tuning::large_fits(&gpu.limits)
    }
}

/// Which kernels one pass of attention runs on (where the head size allows; see `attention::pick`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    Rows,
    /// The blocked kernels at the largest tile whose workgroup memory fits.
    Blocked,
    /// Forward only: the blocked kernels at 16-row tiles.
    Blocked16,
    /// Backward only: the per-row kernels with the head dimension split over 2, 4 or 8 lanes.
    Lanes2,
    Lanes4,
    Lanes8,
}

impl AttentionKind {
    /// Threads a row of the per-row backward (1 but for the lanes kernels).
    pub fn lanes(self) -> u32 {
        match self {
            AttentionKind::Lanes2 => 2,
            AttentionKind::Lanes4 => 4,
            AttentionKind::Lanes8 => 8,
            AttentionKind::Rows | AttentionKind::Blocked | AttentionKind::Blocked16 => 1,
        }
    }

    /// The candidates for the forward (`backward` false) or the backward on `gpu`: blocked
    /// kernels (the forward's at either tile) not on OpenGL (its drivers compile their unrolled
    /// tiles for minutes), lanes where the subgroups are that wide.
    pub fn candidates(gpu: &Gpu, backward: bool) -> Vec<AttentionKind> {
        let mut kinds = vec![AttentionKind::Rows];
        if gpu.info.backend != wgpu::Backend::Gl {
            kinds.push(AttentionKind::Blocked);
            if !backward {
                kinds.push(AttentionKind::Blocked16);
            }
        }
        if backward {
            let lanes = [AttentionKind::Lanes2, AttentionKind::Lanes4, AttentionKind::Lanes8];
            kinds.extend(lanes.into_iter().filter(|l| attention::lanes_supported(gpu, l.lanes())));
        }
        kinds
    }
}

/// Attention's kernels `pagetrain tune` chose at one head size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionChoice {
    pub head_size: u32,
    pub forward: AttentionKind,
    pub backward: AttentionKind,
}

/// What `pagetrain tune` chose, and for which adapter, driver and pagetrain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuned {
    pub adapter: String,
    pub driver: String,
    pub backend: String,
    pub pagetrain: String,
    pub matmul: MatmulFamily,
    /// Per head size measured (at most [`TUNED_HEAD_SIZES`]); other sizes keep the defaults.
    pub attention: Vec<AttentionChoice>,
}

/// A tuned file is a few hundred bytes; anything much larger is not one.
const MAX_FILE_BYTES: u64 = 16 << 10;

/// Which adapter a tuned file is for: (adapter, driver, backend).
fn adapter_identity(gpu: &Gpu) -> (String, String, String) {
    let i = &gpu.info;
    let driver = format!("{} {}", i.driver, i.driver_info).trim().to_string();
    (gpu.describe(), driver, format!("{:?}", i.backend))
}

/// Which pagetrain a tuned file was measured with: its version and a checksum of every shader's
/// source (a file measured on other kernels is stale). Only computed where a file is read or
/// made, not to find one.
fn pagetrain_identity() -> String {
    let sources: String = super::ALL.iter().map(|s| s.source).collect();
    let kernels = pipeline_cache::checksum(sources.as_bytes());
    format!("{} (kernels {kernels:016x})", env!("CARGO_PKG_VERSION"))
}

impl Tuned {
    /// Choices for `gpu` (its identity filled in).
    pub fn new(gpu: &Gpu, matmul: MatmulFamily, attention: Vec<AttentionChoice>) -> Tuned {
        let (adapter, driver, backend) = adapter_identity(gpu);
        Tuned { adapter, driver, backend, pagetrain: pagetrain_identity(), matmul, attention }
    }

    /// Where `gpu`'s tuned file lives (`None` without a cache folder).
    pub fn path(gpu: &Gpu) -> Option<PathBuf> {
        let (adapter, driver, backend) = adapter_identity(gpu);
        let who = format!("{adapter}\n{driver}\n{backend}\n{:x}:{:x}", gpu.info.vendor, gpu.info.device);
        // (a hash stable across builds and toolchains, unlike std's)
        let key = pipeline_cache::checksum(who.as_bytes());
        Some(pipeline_cache::cache_dir()?.join(format!("tuning-{key:016x}.toml")))
    }

    /// Reads a tuned file and checks it is for `gpu`: an `Err` names the file and what is wrong.
    pub fn load(path: &Path, gpu: &Gpu) -> Result<Tuned> {
        let bad = |why: String| Error::Data { path: path.into(), msg: format!("tuned kernel choices: {why}") };
        let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        if len > MAX_FILE_BYTES {
            return Err(bad(format!("{len} bytes: not a tuned file (at most {MAX_FILE_BYTES})")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let tuned: Tuned = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let (adapter, driver, backend) = adapter_identity(gpu);
        let pagetrain = pagetrain_identity();
        let fields = [
            ("adapter", &tuned.adapter, &adapter),
            ("driver", &tuned.driver, &driver),
            ("backend", &tuned.backend, &backend),
            ("pagetrain version", &tuned.pagetrain, &pagetrain),
        ];
        if let Some((what, theirs, ours)) = fields.into_iter().find(|(_, a, b)| a != b) {
            return Err(bad(format!("measured for {what} `{theirs}`, this is `{ours}`: run `pagetrain tune` again")));
        }
        if !tuned.matmul.runs_on(gpu) {
            return Err(bad(format!("matmul `{:?}` does not run on this adapter", tuned.matmul)));
        }
        if tuned.attention.len() > TUNED_HEAD_SIZES {
            return Err(bad(format!("{} head sizes: at most {TUNED_HEAD_SIZES}", tuned.attention.len())));
        }
        let allowed = |kind: AttentionKind, backward| AttentionKind::candidates(gpu, backward).contains(&kind);
        for a in &tuned.attention {
            if !allowed(a.forward, false) || !allowed(a.backward, true) {
                return Err(bad(format!("head size {}: {a:?} does not run on this adapter", a.head_size)));
            }
        }
        Ok(tuned)
    }

    /// Writes the file (to a temporary name, then renamed: a concurrent run never reads half).
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::io(path, e);
        let body = toml::to_string(self).map_err(|e| Error::invalid("tuned kernel choices", e.to_string()))?;
        let text = format!(
            "# Kernel choices `pagetrain tune` measured on this adapter; delete the file to go back\n\
             # to the built-in defaults.\n{body}"
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// `tuning` with these choices, except where `overridden(variable)` says the user set one
    /// of the environment variables that choose the same thing.
    pub fn apply(&self, tuning: Tuning, overridden: impl Fn(&str) -> bool) -> Tuning {
        let mut t = tuning;
        if !overridden("PAGETRAIN_MATMUL") {
            t.matmul = self.matmul.variant();
        }
        // (a variable that chooses attention's kernels chooses them at every head size)
        if !overridden("PAGETRAIN_ATTENTION") && !overridden("PAGETRAIN_ATTENTION_LANES") {
            let tuned = self.attention.iter().map(|a| HeadKernels {
                head_size: a.head_size,
                blocked: (
                    matches!(a.forward, AttentionKind::Blocked | AttentionKind::Blocked16),
                    a.backward == AttentionKind::Blocked,
                ),
                forward_tile: (a.forward == AttentionKind::Blocked16).then_some(16),
                lanes: a.backward.lanes(),
            });
            // the measured sizes first, then the built-in ones at other sizes
            let measured = |h: &HeadKernels| self.attention.iter().any(|a| a.head_size == h.head_size);
            let builtin = tuning.attention_tuned.into_iter().flatten().filter(|h| !measured(h));
            let mut heads = tuned.chain(builtin).map(Some);
            t.attention_tuned = std::array::from_fn(|_| heads.next().flatten());
        }
        t
    }

    /// `tuning` with `gpu`'s tuned file applied, where there is one (see the module docs), and
    /// the file it came from.
    pub fn apply_saved(gpu: &Gpu, tuning: Tuning) -> (Tuning, Option<PathBuf>) {
        if std::env::var("PAGETRAIN_TUNED").is_ok_and(|v| v == "0") {
            return (tuning, None);
        }
        let Some(path) = Tuned::path(gpu).filter(|p| p.exists()) else { return (tuning, None) };
        match Tuned::load(&path, gpu) {
            Ok(tuned) => {
                log::info!("kernel choices from {}", path.display());
                (tuned.apply(tuning, |v| std::env::var_os(v).is_some()), Some(path))
            }
            Err(e) => {
                log::warn!("{e}; the built-in kernel choices stay");
                (tuning, None)
            }
        }
    }
}
