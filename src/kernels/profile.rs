//! `PAGETRAIN_PROFILE=1`: GPU time per kernel entry. Where the device writes timestamps inside
//! compute passes, each dispatch is bracketed by two, in the pass, and nothing waits: the step
//! runs as it does unprofiled, and the timestamps are read back when the query set is full or
//! the profile is asked for. Elsewhere (GL, browsers) every dispatch is submitted and waited for,
//! so its time includes the submission's overhead and the step runs serialised.
//!
//! Timestamps bracket a dispatch from the end of the work before it to the end of its own;
//! dispatches the driver overlaps count their shared time in each.
//!
//! `PAGETRAIN_PROFILE=shapes` also splits the products by shape, layout and compiled flags;
//! `PAGETRAIN_PROFILE=timeline` also keeps the timestamps in order (`timeline`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::timeline::{Span, StepTimeline, Timeline};
use crate::device::Gpu;
use crate::recorder::Recorder;

/// Dispatches bracketed before the timestamps are read back.
const PAIRS: u32 = 2048;

pub(super) struct Profile {
    /// Per entry: dispatches, seconds.
    totals: RefCell<HashMap<&'static str, (u64, f64)>>,
    /// `PAGETRAIN_PROFILE=shapes`: labels made per dispatch, kept once each (a step has a few
    /// dozen distinct products).
    shapes: Option<RefCell<std::collections::HashSet<&'static str>>>,
    timer: Option<Timer>,
    /// `PAGETRAIN_PROFILE=timeline` (with timestamps only).
    timeline: Option<RefCell<Timeline>>,
}

/// The query set and the buffers its timestamps come back through.
struct Timer {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// The entry each written pair of timestamps belongs to, in query order.
    entries: RefCell<Vec<&'static str>>,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// Pairs whose timestamps a failed read-back lost (reported beside the profile).
    lost: Cell<u64>,
    /// The first timestamp read back: the timeline's origin.
    origin: Cell<Option<u64>>,
}

/// Where a dispatch writes its timestamps: (query set, first of its two queries).
pub(super) type Stamps = Option<(wgpu::QuerySet, u32)>;

impl Profile {
    pub(super) fn new(gpu: &Gpu, shapes: bool, timeline: bool) -> Self {
        let timer = gpu.features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES).then(|| {
            let bytes = PAIRS as u64 * 2 * 8;
            let buffer = |label, usage| {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: bytes,
                    usage,
                    mapped_at_creation: false,
                })
            };
            Timer {
                queries: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: PAIRS * 2,
                }),
                resolved: buffer("profile resolve", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
                readback: buffer("profile read-back", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
                entries: RefCell::new(Vec::new()),
                period_ns: gpu.queue.get_timestamp_period() as f64,
                lost: Cell::new(0),
                origin: Cell::new(None),
            }
        });
        let shapes = shapes.then(Default::default);
        let timeline = (timeline && timer.is_some()).then(Default::default);
        Profile { totals: RefCell::new(HashMap::new()), shapes, timer, timeline }
    }

    /// `entry`, or under `PAGETRAIN_PROFILE=shapes` the label `detail` makes (kept once).
    pub(super) fn label(&self, entry: &'static str, detail: impl FnOnce() -> String) -> &'static str {
        let Some(shapes) = &self.shapes else { return entry };
        let label = detail();
        let mut shapes = shapes.borrow_mut();
        if let Some(kept) = shapes.get(label.as_str()) {
            return kept;
        }
        let kept: &'static str = Box::leak(label.into_boxed_str());
        shapes.insert(kept);
        kept
    }

    /// Whether dispatches are timed by timestamps (else each is waited for).
    pub(super) fn stamped(&self) -> bool {
        self.timer.is_some()
    }

    /// The queries the next dispatch of `entry` writes; reads the set back first when it is full.
    pub(super) fn stamps(&self, recorder: &Recorder, entry: &'static str) -> Stamps {
        let timer = self.timer.as_ref()?;
        if timer.entries.borrow().len() as u32 == PAIRS {
            self.read_back(recorder);
        }
        let mut entries = timer.entries.borrow_mut();
        entries.push(entry);
        Some((timer.queries.clone(), (entries.len() as u32 - 1) * 2))
    }

    /// Adds a dispatch waited for on the host (no timestamps).
    pub(super) fn add_waited(&self, entry: &'static str, seconds: f64) {
        let mut totals = self.totals.borrow_mut();
        let e = totals.entry(entry).or_default();
        e.0 += 1;
        e.1 += seconds;
    }

    /// Resolves the timestamps written so far, waits for them and adds them up per entry.
    fn read_back(&self, recorder: &Recorder) {
        let Some(timer) = &self.timer else { return };
        let entries = std::mem::take(&mut *timer.entries.borrow_mut());
        if entries.is_empty() {
            return;
        }
        let count = entries.len() as u32 * 2;
        let bytes = count as u64 * 8;
        recorder.record(|enc| {
            enc.resolve_query_set(&timer.queries, 0..count, &timer.resolved, 0);
            enc.copy_buffer_to_buffer(&timer.resolved, 0, &timer.readback, 0, bytes);
        });
        let index = recorder.flush();
        let (tx, rx) = std::sync::mpsc::channel();
        timer.readback.slice(..bytes).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r.is_ok());
        });
        let waited = recorder.wait(index);
        if waited.is_err() || rx.try_recv() != Ok(true) {
            timer.lost.set(timer.lost.get() + entries.len() as u64);
            timer.readback.unmap();
            return;
        }
        let ticks: Option<Vec<u64>> =
            timer.readback.get_mapped_range(..bytes).ok().map(|m| bytemuck::pod_collect_to_vec(&m));
        timer.readback.unmap();
        let Some(ticks) = ticks else {
            timer.lost.set(timer.lost.get() + entries.len() as u64);
            return;
        };
        let mut totals = self.totals.borrow_mut();
        for (entry, pair) in entries.iter().zip(ticks.chunks_exact(2)) {
            let e = totals.entry(entry).or_default();
            e.0 += 1;
            e.1 += pair[1].saturating_sub(pair[0]) as f64 * timer.period_ns * 1e-9;
        }
        if let Some(timeline) = &self.timeline {
            let origin = timer.origin.get().unwrap_or(ticks[0]);
            timer.origin.set(Some(origin));
            let ns = |t: u64| (t as i128 - origin as i128) as f64 * timer.period_ns;
            let mut timeline = timeline.borrow_mut();
            for (&entry, pair) in entries.iter().zip(ticks.chunks_exact(2)) {
                timeline.push(Span { entry, start_ns: ns(pair[0]), end_ns: ns(pair[1]) });
            }
            timeline.mark_read_back();
        }
    }

    /// Forgets the totals so far (after reading back what is outstanding); the timeline keeps
    /// its steps.
    pub(super) fn restart(&self, recorder: &Recorder) {
        self.read_back(recorder);
        self.totals.borrow_mut().clear();
    }

    /// The next dispatch starts a training step (for the timeline).
    pub(super) fn mark_step(&self) {
        if let (Some(timeline), Some(timer)) = (&self.timeline, &self.timer) {
            timeline.borrow_mut().mark_step(timer.entries.borrow().len());
        }
    }

    /// The marked steps as the GPU ran them (`PAGETRAIN_PROFILE=timeline`); reads outstanding
    /// timestamps back first.
    pub(super) fn steps(&self, recorder: &Recorder) -> Vec<StepTimeline> {
        let Some(timeline) = &self.timeline else { return Vec::new() };
        self.read_back(recorder);
        timeline.borrow().steps()
    }

    /// Per entry (dispatches, seconds), slowest first; reads outstanding timestamps back first.
    pub(super) fn totals(&self, recorder: &Recorder) -> Vec<(&'static str, u64, f64)> {
        self.read_back(recorder);
        let mut v: Vec<_> = self.totals.borrow().iter().map(|(k, (n, s))| (*k, *n, *s)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    /// Dispatches whose timestamps could not be read back.
    pub(super) fn lost(&self) -> u64 {
        self.timer.as_ref().map_or(0, |t| t.lost.get())
    }
}
