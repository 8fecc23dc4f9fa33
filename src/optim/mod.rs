//! Optimizers with fused WGSL updates, and global grad-norm clipping shared by both.

mod adamw;
mod clip;
mod sgd;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::GradClip;
pub use sgd::{Sgd, SgdConfig};
