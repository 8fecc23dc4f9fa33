//! Training: data, configuration, the step loop, checkpoints.

mod bet_trial;
pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod data;
pub mod generate;
#[cfg(not(target_arch = "wasm32"))]
pub mod metrics;
mod optimizer;
pub mod pending_loss;
#[cfg(not(target_arch = "wasm32"))]
pub mod prepare;
mod recompute_policy;
mod recompute_trial;
mod report;
pub mod run_file;
#[cfg(not(target_arch = "wasm32"))]
mod run_loop;
mod run_setup;
mod step_trial;
pub mod tensor_file;
pub mod tokenizer;
pub mod trainer;
mod trials;
mod update;
mod upload_trial;

pub use bet_trial::BetDecision;
pub use config::{format_bytes, parse_bytes, OptimizerOn, Precision, TrainConfig};
pub use data::{Dataset, Split, Vocab};
pub use generate::Sampling;
pub use recompute_trial::RecomputeDecision;
pub use run_file::RunFile;
pub use tokenizer::Tokenizer;
pub use trainer::{Quiet, Reporter, RunSummary, StepReport, Trainer};
pub use upload_trial::UploadDecision;
