//! Training: data, configuration, the step loop, checkpoints.

pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod data;
pub mod trainer;

pub use config::{format_bytes, parse_bytes, OptimizerOn, Precision, TrainConfig};
pub use data::{Dataset, Split, Vocab};
pub use trainer::{Quiet, Reporter, RunSummary, StepReport, Trainer};
