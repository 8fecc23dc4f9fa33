//! One error type for the whole crate: every failure carries the data that explains it.

use std::path::PathBuf;

/// Everything that can go wrong in pagetrain, with what and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no GPU adapter with compute shaders found ({tried})")]
    NoAdapter { tried: String },

    #[error("could not open a device on {adapter}: {msg}")]
    RequestDevice { adapter: String, msg: String },

    #[error("shader `{kernel}` failed to compile: {msg}")]
    ShaderCompile { kernel: String, msg: String },

    #[error("GPU error in {context}: {msg}")]
    Gpu { context: String, msg: String },

    #[error("GPU device lost: {reason}")]
    DeviceLost { reason: String },

    #[error("GPU out of memory while allocating {what} ({bytes} bytes)")]
    OutOfMemory { what: String, bytes: u64 },

    #[error("GPU budget of {budget} bytes cannot hold `{tensor}`: {needed} bytes must be on the GPU at once")]
    BudgetTooSmall { tensor: String, needed: u64, budget: u64 },

    #[error("GPU budget of {budget} bytes has room for `{tensor}` ({bytes} bytes) but no free range that large in its slabs: the tensors the op holds split them")]
    SlabsFragmented { tensor: String, bytes: u64, budget: u64 },

    #[error("tensor `{tensor}` is {bytes} bytes, over this adapter's {limit}-byte {what}")]
    TooLarge { tensor: String, bytes: u64, limit: u64, what: &'static str },

    #[error("shape mismatch in {op}: expected {expected}, got {got}")]
    Shape { op: &'static str, expected: String, got: String },

    #[error("invalid {what}: {msg}")]
    Invalid { what: &'static str, msg: String },

    #[error("data file {path}: {msg}")]
    Data { path: PathBuf, msg: String },

    #[error("checkpoint {path}: {msg}")]
    Checkpoint { path: PathBuf, msg: String },

    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("writing `{tensor}` back to the host store failed ({cause}); {fate}")]
    WriteBack { tensor: String, cause: String, fate: &'static str },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn shape(op: &'static str, expected: impl std::fmt::Debug, got: impl std::fmt::Debug) -> Self {
        Error::Shape { op, expected: format!("{expected:?}"), got: format!("{got:?}") }
    }

    pub(crate) fn invalid(what: &'static str, msg: impl Into<String>) -> Self {
        Error::Invalid { what, msg: msg.into() }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// A line of advice for a person at a terminal, where one helps.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Error::NoAdapter { .. } => Some(
                "install a Vulkan driver (`apt-get install mesa-vulkan-drivers` gives the lavapipe CPU driver), \
                 or set WGPU_BACKEND=gl to use OpenGL; `pagetrain info` lists the adapters wgpu sees",
            ),
            Error::BudgetTooSmall { .. } => Some("raise --gpu-budget, or use a smaller model"),
            Error::SlabsFragmented { .. } => {
                Some("raise --gpu-budget, or give tensors buffers of their own (PAGETRAIN_GPU_POOL=buffers)")
            }
            Error::DeviceLost { .. } => Some("the driver reset the GPU; rerun with --resume from the last checkpoint"),
            Error::OutOfMemory { .. } => Some("lower --batch-size or --seq-len"),
            Error::Checkpoint { .. } => {
                Some("point --resume / --init-from at a directory written by `pagetrain train --out`")
            }
            _ => None,
        }
    }
}
