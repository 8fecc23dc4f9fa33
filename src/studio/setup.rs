//! Run setup and controls: model, data, budget, precision, optimizer placement, recompute,
//! accumulation; start, pause, resume, stop, save; a new budget while the run goes on.

use std::path::PathBuf;

use eframe::egui::{self, RichText, Ui};

use super::dashboard::RunStatus;
use super::feed::{Command, RunSetup};
use crate::context::StoreKind;
use crate::nn::{GptConfig, ModelShape};
use crate::train::{format_bytes, parse_bytes, OptimizerOn, Precision};

/// What the user asked for this frame.
#[derive(Clone, Debug)]
pub enum Action {
    Start(Box<RunSetup>),
    Send(Command),
}

const CUSTOM: &str = "custom";

pub struct SetupPanel {
    /// A preset name or `custom`.
    pub model: String,
    pub custom: ModelShape,
    /// A text or `.bin` token file; empty: the built-in corpus.
    pub data: String,
    pub budget_auto: bool,
    pub budget_bytes: u64,
    budget_text: String,
    pub precision: Precision,
    pub optimizer_on: OptimizerOn,
    pub recompute: bool,
    pub accum: usize,
    pub batch_size: usize,
    pub seq_len: usize,
    pub steps: u64,
    pub lr: f32,
    pub out: String,
    /// A checkpoint directory to continue from; empty: a fresh model.
    pub resume: String,
    pub store_in_memory: bool,
    /// Fields of the setup that [`RunSetup`] does not show here (seed, schedule, device, …).
    base: RunSetup,
    /// Why the last Start was refused.
    pub error: Option<String>,
}

impl SetupPanel {
    pub fn new(setup: &RunSetup) -> SetupPanel {
        let t = &setup.train;
        let budget = setup.budget.unwrap_or(256 << 20);
        SetupPanel {
            model: if t.custom_model.is_some() { CUSTOM.into() } else { t.model.clone() },
            custom: t.custom_model.unwrap_or(ModelShape { n_layer: 4, n_head: 4, n_embd: 128, block_size: 128 }),
            data: t.data.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            budget_auto: setup.budget.is_none(),
            budget_bytes: budget,
            budget_text: format_bytes(budget),
            precision: t.precision,
            optimizer_on: t.optimizer_on,
            recompute: t.recompute,
            accum: t.accum,
            batch_size: t.batch_size,
            seq_len: t.seq_len,
            steps: t.steps,
            lr: t.lr,
            out: t.out.display().to_string(),
            resume: t.resume.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            store_in_memory: matches!(setup.store, StoreKind::Memory),
            base: setup.clone(),
            error: None,
        }
    }

    /// The run the form describes, or why it cannot start.
    pub fn setup(&self) -> Result<RunSetup, String> {
        let mut s = self.base.clone();
        let t = &mut s.train;
        if self.model == CUSTOM {
            GptConfig::from_shape(self.custom, 1).map_err(|e| e.to_string())?;
            t.custom_model = Some(self.custom);
        } else {
            t.model = self.model.clone();
            t.custom_model = None;
        }
        t.data = (!self.data.trim().is_empty()).then(|| PathBuf::from(self.data.trim()));
        t.precision = self.precision;
        t.optimizer_on = self.optimizer_on;
        t.recompute = self.recompute;
        t.accum = self.accum;
        t.batch_size = self.batch_size;
        t.seq_len = self.seq_len;
        t.steps = self.steps;
        t.lr = self.lr;
        t.out = PathBuf::from(self.out.trim());
        t.resume = (!self.resume.trim().is_empty()).then(|| PathBuf::from(self.resume.trim()));
        t.validate().map_err(|e| e.to_string())?;
        s.budget = (!self.budget_auto).then_some(self.budget_bytes);
        s.store = if self.store_in_memory { StoreKind::Memory } else { StoreKind::Mmap(t.out.join("store")) };
        Ok(s)
    }

    pub fn show(&mut self, ui: &mut Ui, status: &RunStatus) -> Vec<Action> {
        let mut actions = Vec::new();
        let live = status.is_live();
        ui.heading("Run");
        ui.add_enabled_ui(!live, |ui| self.form(ui));
        self.budget(ui, live, &mut actions);
        ui.separator();
        ui.horizontal_wrapped(|ui| {
            if !live && ui.button("Start").clicked() {
                match self.setup() {
                    Ok(s) => {
                        self.error = None;
                        actions.push(Action::Start(Box::new(s)));
                    }
                    Err(e) => self.error = Some(e),
                }
            }
            if live {
                match status {
                    RunStatus::Paused if ui.button("Resume").clicked() => actions.push(Action::Send(Command::Resume)),
                    RunStatus::Running | RunStatus::Starting if ui.button("Pause").clicked() => {
                        actions.push(Action::Send(Command::Pause))
                    }
                    _ => {}
                }
                if ui.button("Stop").clicked() {
                    actions.push(Action::Send(Command::Stop));
                }
                if ui.button("Save checkpoint").clicked() {
                    actions.push(Action::Send(Command::Save));
                }
            }
        });
        if let Some(e) = &self.error {
            ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
        }
        actions
    }

    fn form(&mut self, ui: &mut Ui) {
        egui::Grid::new("setup").num_columns(2).spacing([8.0, 4.0]).show(ui, |ui| {
            let label = ui.label("model");
            let combo = egui::ComboBox::from_id_salt("model").selected_text(&self.model).show_ui(ui, |ui| {
                for p in GptConfig::PRESETS.iter().chain([&CUSTOM]) {
                    ui.selectable_value(&mut self.model, p.to_string(), *p);
                }
            });
            combo.response.labelled_by(label.id);
            ui.end_row();
            if self.model == CUSTOM {
                let c = &mut self.custom;
                row(ui, "layers", |ui| ui.add(egui::DragValue::new(&mut c.n_layer).range(1..=96)));
                row(ui, "heads", |ui| ui.add(egui::DragValue::new(&mut c.n_head).range(1..=64)));
                row(ui, "width", |ui| ui.add(egui::DragValue::new(&mut c.n_embd).range(1..=8192)));
                row(ui, "context", |ui| ui.add(egui::DragValue::new(&mut c.block_size).range(1..=8192)));
            }
            let hint = "built-in corpus; a path or drop a file";
            row(ui, "data", |ui| ui.add(egui::TextEdit::singleline(&mut self.data).hint_text(hint)));
            row(ui, "steps", |ui| ui.add(egui::DragValue::new(&mut self.steps).range(1..=10_000_000)));
            row(ui, "batch size", |ui| ui.add(egui::DragValue::new(&mut self.batch_size).range(1..=4096)));
            row(ui, "sequence length", |ui| ui.add(egui::DragValue::new(&mut self.seq_len).range(1..=8192)));
            row(ui, "accumulation", |ui| ui.add(egui::DragValue::new(&mut self.accum).range(1..=1024)));
            row(ui, "learning rate", |ui| ui.add(egui::DragValue::new(&mut self.lr).speed(1e-4).range(1e-7..=1.0)));
            ui.label("precision");
            ui.horizontal(|ui| {
                ui.selectable_value(&mut self.precision, Precision::F32, "f32");
                ui.selectable_value(&mut self.precision, Precision::F16, "f16");
            });
            ui.end_row();
            ui.label("optimizer on");
            ui.horizontal(|ui| {
                ui.selectable_value(&mut self.optimizer_on, OptimizerOn::Gpu, "GPU");
                ui.selectable_value(&mut self.optimizer_on, OptimizerOn::Host, "host");
                ui.selectable_value(&mut self.optimizer_on, OptimizerOn::Split, "split");
                ui.selectable_value(&mut self.optimizer_on, OptimizerOn::Auto, "auto");
            });
            ui.end_row();
            ui.label("memory");
            ui.vertical(|ui| {
                ui.checkbox(&mut self.recompute, "recompute activations");
                ui.checkbox(&mut self.store_in_memory, "host store in memory (no files)");
            });
            ui.end_row();
            row(ui, "output", |ui| ui.text_edit_singleline(&mut self.out));
            let hint = "a checkpoint directory, or empty";
            row(ui, "resume from", |ui| ui.add(egui::TextEdit::singleline(&mut self.resume).hint_text(hint)));
        });
    }

    /// The budget: a log slider and a text field; while a run is live, an Apply button.
    fn budget(&mut self, ui: &mut Ui, live: bool, actions: &mut Vec<Action>) {
        ui.horizontal(|ui| {
            ui.label("GPU budget");
            ui.add_enabled(!live, egui::Checkbox::new(&mut self.budget_auto, "auto"));
        });
        if self.budget_auto && !live {
            return;
        }
        let mut mib = self.budget_bytes as f64 / 1048576.0;
        // Not clamped: a clamping slider rounds the value every frame, and a budget below 1 MiB
        // or between whole MiB (the browser demo's 1400 KiB) must stay as typed.
        let slider = egui::Slider::new(&mut mib, 1.0..=262144.0)
            .logarithmic(true)
            .suffix(" MiB")
            .max_decimals(0)
            .clamping(egui::SliderClamping::Never);
        if ui.add(slider.text("budget")).changed() {
            self.budget_bytes = (mib * 1048576.0) as u64;
            self.budget_text = format_bytes(self.budget_bytes);
        }
        ui.horizontal(|ui| {
            let label = ui.label("bytes");
            let edit =
                ui.add(egui::TextEdit::singleline(&mut self.budget_text).desired_width(100.0)).labelled_by(label.id);
            if edit.changed() {
                if let Ok(b) = parse_bytes(&self.budget_text) {
                    self.budget_bytes = b;
                }
            }
            ui.label(format!("= {} bytes", self.budget_bytes));
            if live && ui.button("Apply budget").clicked() {
                self.budget_auto = false;
                actions.push(Action::Send(Command::SetBudget(self.budget_bytes)));
            }
        });
    }
}

/// A grid row: a label and the widget it names (for screen readers and tests).
fn row(ui: &mut Ui, label: &str, add: impl FnOnce(&mut Ui) -> egui::Response) {
    let label = ui.label(label);
    add(ui).labelled_by(label.id);
    ui.end_row();
}
