//! The studio's window: setup and sampling on the left, gauges and the residency map in the
//! middle, timelines below. How a run is driven (a thread natively, a future in the browser) is
//! behind [`Driver`]; everything drawn comes from the [`Dashboard`].

use eframe::egui::{self, RichText, Ui};

use super::dashboard::{Dashboard, Level, MarkerKind, RunStatus};
use super::feed::{Command, Event, RunSetup};
use super::map_panel::ResidencyMap;
use super::sample::SamplePanel;
use super::setup::{Action, SetupPanel};
use super::{gauges, plots};
use crate::clock::Stopwatch;
use crate::train::format_bytes;

/// A run as the window sees it.
pub trait Driver {
    fn send(&self, command: Command);
    /// Events since the last call.
    fn poll(&self) -> Vec<Event>;
}

/// Starts a run; the `egui::Context` is for repaint requests.
pub type Starter = Box<dyn FnMut(RunSetup, egui::Context) -> Box<dyn Driver>>;

/// Runs after each frame (the headless mode's screenshot and exit).
type FrameHook = Box<dyn FnMut(&mut StudioApp, &egui::Context)>;

/// Frame times of the UI, for the status bar and the headless report.
#[derive(Default)]
pub struct FrameStats {
    /// Start times (s since the window opened) of the last frames.
    recent: std::collections::VecDeque<f64>,
    pub frames: u64,
    /// Seconds spent building frames (the UI's own work, not the renderer's).
    pub ui_seconds: f64,
    pub slowest_ui_s: f64,
}

impl FrameStats {
    fn record(&mut self, at: f64, ui_s: f64) {
        if self.recent.len() == 120 {
            self.recent.pop_front();
        }
        self.recent.push_back(at);
        self.frames += 1;
        self.ui_seconds += ui_s;
        self.slowest_ui_s = self.slowest_ui_s.max(ui_s);
    }

    /// Frames per second over the last frames (while the window repaints continuously).
    pub fn fps(&self) -> Option<f64> {
        let (first, last) = (self.recent.front()?, self.recent.back()?);
        (self.recent.len() > 1 && last > first).then(|| (self.recent.len() - 1) as f64 / (last - first))
    }
}

pub struct StudioApp {
    pub dash: Dashboard,
    pub setup: SetupPanel,
    pub map: ResidencyMap,
    pub sample: SamplePanel,
    pub frames: FrameStats,
    starter: Starter,
    run: Option<Box<dyn Driver>>,
    clock: Stopwatch,
    /// Hooks the headless mode runs after each frame.
    after_frame: Option<FrameHook>,
    /// Repaint every frame (for measuring the frame rate).
    pub continuous: bool,
}

impl StudioApp {
    pub fn new(setup: &RunSetup, starter: Starter) -> StudioApp {
        StudioApp {
            dash: Dashboard::default(),
            setup: SetupPanel::new(setup),
            map: ResidencyMap::default(),
            sample: SamplePanel::default(),
            frames: FrameStats::default(),
            starter,
            run: None,
            clock: Stopwatch::start(),
            after_frame: None,
            continuous: false,
        }
    }

    /// Runs `hook` after every frame (headless mode: screenshot and exit).
    pub fn set_after_frame(&mut self, hook: impl FnMut(&mut StudioApp, &egui::Context) + 'static) {
        self.after_frame = Some(Box::new(hook));
    }

    /// Starts a run from `setup`, replacing the last one (which must have ended).
    pub fn start(&mut self, setup: RunSetup, ctx: &egui::Context) {
        self.run = None;
        self.dash.reset();
        self.run = Some((self.starter)(setup, ctx.clone()));
    }

    pub fn send(&mut self, command: Command) {
        match &self.run {
            Some(run) => run.send(command),
            None => self.dash.say(Level::Error, "no run to send that to"),
        }
    }

    /// Applies what the run sent since the last frame, and files dropped on the window.
    pub fn pump(&mut self, ctx: &egui::Context) {
        if let Some(run) = &self.run {
            for e in run.poll() {
                self.dash.apply(e);
            }
        }
        let dropped = ctx.input(|i| i.raw.dropped_files.first().map(|f| f.path().to_path_buf()));
        if let Some(path) = dropped {
            self.setup.data = path.display().to_string();
            self.dash.say(Level::Info, format!("data: {}", path.display()));
        }
    }

    /// Everything, inside `ui` (the whole window).
    pub fn panels(&mut self, ui: &mut Ui) {
        let ctx = ui.ctx().clone();
        self.pump(&ctx);
        egui::Panel::top("status").show(ui, |ui| self.status_bar(ui));
        egui::Panel::left("setup").resizable(true).default_size(340.0).show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| self.left(ui, &ctx));
        });
        egui::Panel::bottom("timelines").resizable(true).default_size(380.0).show(ui, |ui| plots::show(ui, &self.dash));
        egui::CentralPanel::default().show(ui, |ui| {
            gauges::show(ui, &self.dash);
            ui.separator();
            ui.strong("Where every tensor is");
            self.map.show(ui, self.dash.snapshot.as_ref());
        });
    }

    fn status_bar(&mut self, ui: &mut Ui) {
        ui.horizontal(|ui| {
            ui.strong("pagetrain studio");
            ui.separator();
            let status = match &self.dash.status {
                RunStatus::Idle => "no run".to_string(),
                RunStatus::Failed(_) => "failed".to_string(),
                s => format!("{s:?}").to_lowercase(),
            };
            ui.label(status);
            if let Some(info) = &self.dash.info {
                ui.separator();
                ui.label(format!("step {} / {}", self.dash.last_step(), info.last_step));
            }
            if let Some(s) = self.dash.steps.last() {
                ui.separator();
                ui.label(format!("loss {:.4}", s.loss));
                ui.separator();
                ui.label(format!("{:.0} ms a step, {:.0} tokens/s", s.seconds * 1e3, s.tokens_per_s));
            }
            if self.frames.frames > 0 {
                ui.separator();
                let ms = self.frames.ui_seconds * 1e3 / self.frames.frames as f64;
                match self.frames.fps().filter(|_| self.continuous) {
                    Some(fps) => ui.label(format!("UI {fps:.0} fps, {ms:.1} ms a frame")),
                    None => ui.label(format!("UI {ms:.1} ms a frame")),
                };
            }
        });
        if let Some(err) = self.dash.last_error() {
            ui.label(RichText::new(err).color(ui.visuals().error_fg_color));
        }
    }

    fn left(&mut self, ui: &mut Ui, ctx: &egui::Context) {
        let status = self.dash.status.clone();
        for action in self.setup.show(ui, &status) {
            match action {
                Action::Start(setup) => self.start(*setup, ctx),
                Action::Send(c) => self.send(c),
            }
        }
        let last_checkpoint = self.dash.markers.iter().rev().find(|m| m.kind == MarkerKind::Checkpoint);
        if let (false, Some(m)) = (status.is_live(), last_checkpoint) {
            if ui.button(format!("Resume from the checkpoint of step {}", m.step)).clicked() {
                self.setup.resume = m.text.clone();
            }
        }
        ui.separator();
        let sample = self.dash.sample.clone();
        if let Some(c) = self.sample.show(ui, status.is_live(), sample.as_deref()) {
            self.send(c);
        }
        if let Some(info) = &self.dash.info {
            ui.separator();
            ui.heading("This run");
            for line in [
                format!("model: {} — {:.2}M parameters", info.model, info.params as f64 / 1e6),
                format!("data: {}", info.data),
                format!("adapter: {}", info.adapter),
                format!("optimizer on the {}", info.optimizer),
                format!("precision: {}", info.precision),
                format!("store: {}", info.store),
            ] {
                ui.label(line);
            }
            if let Some(s) = &self.dash.snapshot {
                ui.label(format!(
                    "footprint now: {} in {} tensors",
                    format_bytes(s.tensors.iter().map(|t| t.bytes).sum()),
                    s.tensors.len()
                ));
            }
        }
        ui.separator();
        ui.heading("Log");
        for (level, line) in self.dash.log.iter().rev().take(12) {
            let text = RichText::new(line).small();
            ui.label(if *level == Level::Error { text.color(ui.visuals().error_fg_color) } else { text });
        }
    }
}

impl eframe::App for StudioApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        let t0 = self.clock.seconds();
        if std::env::var_os("PAGETRAIN_STUDIO_DEBUG").is_some() {
            eprintln!("frame at {t0:.2} s: {:?}", ui.ctx().repaint_causes());
        }
        self.panels(ui);
        let ctx = ui.ctx().clone();
        self.frames.record(t0, self.clock.seconds() - t0);
        if let Some(mut hook) = self.after_frame.take() {
            hook(self, &ctx);
            self.after_frame = Some(hook);
        }
        // Otherwise frames come when the run has news or the user does something.
        if self.continuous {
            ctx.request_repaint();
        }
    }
}
