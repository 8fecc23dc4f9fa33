//! Training: data, configuration, the step loop, checkpoints.
