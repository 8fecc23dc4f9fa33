//! Try the model: text generated from the current weights after a prompt, at a temperature.

use eframe::egui::{self, Ui};

use super::feed::Command;

pub struct SamplePanel {
    pub prompt: String,
    pub tokens: usize,
    pub temperature: f32,
    pub seed: u64,
}

impl Default for SamplePanel {
    fn default() -> Self {
        SamplePanel { prompt: "One day".into(), tokens: 200, temperature: 0.8, seed: 1 }
    }
}

impl SamplePanel {
    /// `live`: a run can answer; `text`: its last sample.
    pub fn show(&mut self, ui: &mut Ui, live: bool, text: Option<&str>) -> Option<Command> {
        ui.heading("Try the model");
        let mut command = None;
        ui.horizontal(|ui| {
            let label = ui.label("prompt");
            ui.text_edit_singleline(&mut self.prompt).labelled_by(label.id);
        });
        ui.add(egui::Slider::new(&mut self.temperature, 0.0..=2.0).text("temperature"));
        ui.horizontal(|ui| {
            let label = ui.label("tokens");
            ui.add(egui::DragValue::new(&mut self.tokens).range(1..=2000)).labelled_by(label.id);
            let label = ui.label("seed");
            ui.add(egui::DragValue::new(&mut self.seed)).labelled_by(label.id);
            if ui.add_enabled(live, egui::Button::new("Generate")).clicked() {
                self.seed += 1;
                command = Some(Command::Sample {
                    prompt: self.prompt.clone(),
                    tokens: self.tokens,
                    temperature: self.temperature,
                    seed: self.seed - 1,
                });
            }
        });
        if let Some(t) = text {
            egui::ScrollArea::vertical().id_salt("sample text").max_height(160.0).show(ui, |ui| {
                ui.label(egui::RichText::new(format!("{}{t}", self.prompt)).monospace());
            });
        }
        command
    }
}
