//! The metrics log: one JSON object a line in `OUT/metrics.jsonl`, a line per step and per
//! evaluation, appended (a resumed run goes on in the same file), for plotting and comparing runs.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A step's line.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepLine {
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub tokens_per_s: f64,
    /// Bytes across the bus during the step, each way, and seconds waited on transfers.
    pub bytes_uploaded: u64,
    pub bytes_written_back: u64,
    pub stall_s: f64,
    pub micro_batch: usize,
    /// Data-parallel runs: this rank's `comm_bytes` on the network, `comm_s` communicating,
    /// `comm_exposed_s` of them the host only waited (absent for a single process).
    #[serde(flatten)]
    pub comm: Option<crate::dist::CommStats>,
}

pub struct MetricsLog {
    path: PathBuf,
    /// None: a log that writes nothing (the ranks of a data-parallel run other than rank 0).
    file: Option<std::fs::File>,
}

impl MetricsLog {
    pub const FILE: &'static str = "metrics.jsonl";

    /// Opens (appends to) `dir/metrics.jsonl`.
    pub fn open(dir: &Path) -> Result<MetricsLog> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(Self::FILE);
        let file =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::io(&path, e))?;
        Ok(MetricsLog { path, file: Some(file) })
    }

    /// [`MetricsLog::open`] when `wanted`, else a log that writes nothing.
    pub fn open_if(wanted: bool, dir: &Path) -> Result<MetricsLog> {
        if wanted {
            return Self::open(dir);
        }
        Ok(MetricsLog { path: dir.join(Self::FILE), file: None })
    }

    pub fn step(&mut self, line: &StepLine) -> Result<()> {
        self.write(&serde_json::to_value(line).expect("serializable"))
    }

    pub fn eval(&mut self, step: u64, val_loss: f32) -> Result<()> {
        self.write(&serde_json::json!({ "step": step, "val_loss": val_loss }))
    }

    fn write(&mut self, v: &serde_json::Value) -> Result<()> {
        match &mut self.file {
            Some(f) => writeln!(f, "{v}").map_err(|e| Error::io(&self.path, e)),
            None => Ok(()),
        }
    }
}
