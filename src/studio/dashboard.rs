//! What the panels draw: a run's history folded from its [`Event`]s. Nothing here waits on the
//! GPU or the run; applying an event is cheap.

use std::collections::VecDeque;

use super::feed::{Event, HostMemory, RunInfo, StepInfo};
use crate::pager::Snapshot;

#[derive(Clone, Debug, PartialEq)]
pub enum RunStatus {
    /// Nothing started yet.
    Idle,
    Starting,
    Running,
    Paused,
    Finished,
    Stopped,
    Failed(String),
}

impl RunStatus {
    /// Whether a run is alive (it answers commands).
    pub fn is_live(&self) -> bool {
        matches!(self, RunStatus::Starting | RunStatus::Running | RunStatus::Paused | RunStatus::Finished)
    }
}

/// Something worth a line on the timelines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerKind {
    /// Out-of-memory recovery: the micro-batch was halved.
    Shrink,
    /// The f16 loss scaler skipped an update.
    Skip,
    Checkpoint,
    Budget,
}

impl MarkerKind {
    pub fn label(self) -> &'static str {
        match self {
            MarkerKind::Shrink => "micro-batch shrink",
            MarkerKind::Skip => "loss-scale skip",
            MarkerKind::Checkpoint => "checkpoint",
            MarkerKind::Budget => "budget change",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Marker {
    pub step: u64,
    pub kind: MarkerKind,
    pub text: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Error,
}

/// Most log lines kept.
const LOG_LINES: usize = 200;

pub struct Dashboard {
    pub status: RunStatus,
    pub info: Option<RunInfo>,
    pub steps: Vec<StepInfo>,
    pub evals: Vec<(u64, f32)>,
    pub markers: Vec<Marker>,
    pub snapshot: Option<Snapshot>,
    /// Step of the snapshot; bumps `snapshot_seq` so views can cache what they derive from it.
    pub snapshot_step: u64,
    pub snapshot_seq: u64,
    pub host: HostMemory,
    pub log: VecDeque<(Level, String)>,
    pub sample: Option<String>,
}

impl Default for Dashboard {
    fn default() -> Self {
        Dashboard {
            status: RunStatus::Idle,
            info: None,
            steps: Vec::new(),
            evals: Vec::new(),
            markers: Vec::new(),
            snapshot: None,
            snapshot_step: 0,
            snapshot_seq: 0,
            host: HostMemory::default(),
            log: VecDeque::new(),
            sample: None,
        }
    }
}

impl Dashboard {
    /// Forgets the last run (a new one starts).
    pub fn reset(&mut self) {
        let log = std::mem::take(&mut self.log);
        *self = Dashboard { log, status: RunStatus::Starting, ..Dashboard::default() };
    }

    pub fn say(&mut self, level: Level, line: impl Into<String>) {
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back((level, line.into()));
    }

    /// The last error, if the run ended on one or a command failed since the last step.
    pub fn last_error(&self) -> Option<&str> {
        match &self.status {
            RunStatus::Failed(msg) => Some(msg),
            _ => self.log.back().filter(|(l, _)| *l == Level::Error).map(|(_, m)| m.as_str()),
        }
    }

    pub fn last_step(&self) -> u64 {
        self.steps.last().map_or(self.info.as_ref().map_or(0, |i| i.first_step), |s| s.step)
    }

    pub fn apply(&mut self, event: Event) {
        match event {
            Event::Started(info) => {
                self.say(Level::Info, format!("started: {} on {}", info.model, info.adapter));
                self.info = Some(info);
                self.status = RunStatus::Running;
            }
            Event::Step(s) => {
                if s.shrinks > 0 {
                    let text = format!("micro-batch now {}", s.micro_batch);
                    self.say(Level::Info, format!("step {}: out of GPU memory; {text}", s.step));
                    self.markers.push(Marker { step: s.step, kind: MarkerKind::Shrink, text });
                }
                if s.skipped {
                    let text = format!("loss scale now {}", s.loss_scale);
                    self.say(Level::Info, format!("step {}: gradients overflowed, step skipped; {text}", s.step));
                    self.markers.push(Marker { step: s.step, kind: MarkerKind::Skip, text });
                }
                if s.began_remaking {
                    let what =
                        "LayerNorm outputs and the MLP's hidden values are made again in backward instead of paged";
                    self.say(
                        Level::Info,
                        format!("step {}: evicted to stay in the GPU budget; from now on {what}", s.step),
                    );
                }
                if let Some(decided) = s.recompute_decided {
                    self.say(Level::Info, format!("step {}: {decided}", s.step));
                }
                if let Some(decided) = s.upload_decided {
                    self.say(Level::Info, format!("step {}: uploads through {decided}", s.step));
                }
                self.steps.push(s);
            }
            Event::Eval { step, loss } => self.evals.push((step, loss)),
            Event::Snapshot { step, snapshot, host } => {
                self.snapshot = Some(*snapshot);
                self.snapshot_step = step;
                self.snapshot_seq += 1;
                self.host = host;
            }
            Event::Checkpoint { step, path } => {
                self.say(Level::Info, format!("checkpoint written to {path}"));
                self.markers.push(Marker { step, kind: MarkerKind::Checkpoint, text: path });
            }
            Event::Budget { step, bytes } => {
                let text = crate::train::format_bytes(bytes);
                self.say(Level::Info, format!("GPU budget now {text}"));
                self.markers.push(Marker { step, kind: MarkerKind::Budget, text });
            }
            Event::Sample(text) => self.sample = Some(text),
            Event::Paused => self.status = RunStatus::Paused,
            Event::Resumed => self.status = RunStatus::Running,
            Event::Error(msg) => self.say(Level::Error, msg),
            Event::Failed(msg) => {
                self.say(Level::Error, msg.clone());
                self.status = RunStatus::Failed(msg);
            }
            Event::Finished { step } => {
                self.say(Level::Info, format!("finished at step {step}"));
                self.status = RunStatus::Finished;
            }
            Event::Stopped { step } => {
                self.say(Level::Info, format!("stopped at step {step}"));
                self.status = RunStatus::Stopped;
            }
        }
    }
}
