//! Optimizers with fused WGSL updates, and global grad-norm clipping shared by both.

mod adamw;
mod clip;
mod host_adamw;
mod sgd;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::GradClip;
pub use host_adamw::HostAdamW;
pub use sgd::{Sgd, SgdConfig};
