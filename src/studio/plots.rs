//! Timelines over steps: loss, bus bandwidth, stalls, speed — with out-of-memory shrinks,
//! loss-scale skips, checkpoints and budget changes marked on each.

use eframe::egui::{Color32, Ui};
use egui_plot::{Bar, BarChart, Legend, Line, Plot, PlotPoints, PlotUi, Points, VLine};

use super::dashboard::{Dashboard, MarkerKind};

pub fn marker_color(kind: MarkerKind) -> Color32 {
    match kind {
        MarkerKind::Shrink => Color32::from_rgb(229, 57, 53),
        MarkerKind::Skip => Color32::from_rgb(255, 167, 38),
        MarkerKind::Checkpoint => Color32::from_rgb(102, 187, 106),
        MarkerKind::Budget => Color32::from_rgb(171, 71, 188),
    }
}

/// One legend entry per kind (lines of one name share it): a long run's checkpoints named one by
/// one would fill the plot with legend. What each marker says is in the log.
fn markers(plot: &mut PlotUi<'_>, dash: &Dashboard) {
    for m in &dash.markers {
        plot.vline(VLine::new(m.kind.label(), m.step as f64).color(marker_color(m.kind)).width(1.5));
    }
}

fn series(dash: &Dashboard, f: impl Fn(&super::feed::StepInfo) -> f64) -> PlotPoints<'static> {
    dash.steps.iter().map(|s| [s.step as f64, f(s)]).collect::<Vec<_>>().into()
}

fn plot(id: &str, height: f32) -> Plot<'static> {
    Plot::new(id.to_string()).height(height).legend(Legend::default()).allow_scroll(false).x_axis_label("step")
}

/// The four timelines in a 2 × 2 grid as wide as `ui`.
pub fn show(ui: &mut Ui, dash: &Dashboard) {
    // Fixed heights: the bottom panel sizes itself to them (a height taken from the panel
    // would shrink it to whatever the first frame had).
    let h = 150.0;
    let w = (ui.available_width() / 2.0 - 8.0).max(120.0);
    ui.horizontal(|ui| {
        ui.vertical(|ui| {
            ui.set_width(w);
            ui.strong("loss");
            plot("loss", h).show(ui, |p| {
                p.line(Line::new("train", series(dash, |s| s.loss as f64)).color(Color32::from_rgb(66, 165, 245)));
                let val: Vec<[f64; 2]> = dash.evals.iter().map(|&(s, l)| [s as f64, l as f64]).collect();
                if !val.is_empty() {
                    p.points(Points::new("validation", val).radius(3.0).color(Color32::from_rgb(255, 202, 40)));
                }
                markers(p, dash);
            });
        });
        ui.vertical(|ui| {
            ui.set_width(w);
            ui.strong("bus (GB/s)");
            plot("bus", h).show(ui, |p| {
                let gbps = |b: u64, s: f64| if s > 0.0 { b as f64 / s / 1e9 } else { 0.0 };
                p.line(Line::new("upload", series(dash, |s| gbps(s.bytes_uploaded, s.seconds))));
                p.line(Line::new("write-back", series(dash, |s| gbps(s.bytes_written_back, s.seconds))));
                markers(p, dash);
            });
        });
    });
    ui.horizontal(|ui| {
        ui.vertical(|ui| {
            ui.set_width(w);
            ui.strong("stalls: ms per step waiting on transfers");
            plot("stalls", h).show(ui, |p| {
                let bars: Vec<Bar> =
                    dash.steps.iter().map(|s| Bar::new(s.step as f64, s.stall_s * 1e3).width(0.8)).collect();
                p.bar_chart(BarChart::new("stall", bars).color(Color32::from_rgb(239, 83, 80)));
                p.line(Line::new("step time", series(dash, |s| s.seconds * 1e3)).color(Color32::GRAY));
                markers(p, dash);
            });
        });
        ui.vertical(|ui| {
            ui.set_width(w);
            ui.strong("speed: tokens/s");
            plot("speed", h).show(ui, |p| {
                p.line(Line::new("tokens/s", series(dash, |s| s.tokens_per_s)).color(Color32::from_rgb(38, 166, 154)));
                markers(p, dash);
            });
        });
    });
}
