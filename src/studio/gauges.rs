//! Gauges: the GPU pool against its budget, staging memory, host memory, the pager's counters.

use eframe::egui::{self, Color32, ProgressBar, RichText, Ui};

use super::dashboard::Dashboard;
use crate::pager::Snapshot;
use crate::train::format_bytes;

/// Share of the budget the pool holds, for the bar: never drawn past full. A pool above its
/// budget would be a pager bug; the text then says so in red instead of a longer bar.
pub fn pool_fraction(snap: &Snapshot) -> f32 {
    if snap.budget == 0 {
        return 0.0;
    }
    (snap.gpu_bytes as f64 / snap.budget as f64).clamp(0.0, 1.0) as f32
}

/// "118.0 MiB of 256.0 MiB budget (peak 200.0 MiB)".
pub fn pool_text(snap: &Snapshot) -> String {
    format!(
        "{} of {} budget (peak {})",
        format_bytes(snap.gpu_bytes),
        format_bytes(snap.budget),
        format_bytes(snap.peak_gpu_bytes)
    )
}

/// "last step: 812.0 MiB up, 640.0 MiB back, 9.1 GB/s, 12 ms exposed".
pub fn bus_text(snap: &Snapshot) -> String {
    match &snap.last_step {
        Some(t) => format!(
            "last step: {} up, {} back, {:.1} GB/s over the step, {:.0} ms waiting on transfers",
            format_bytes(t.bytes_up),
            format_bytes(t.bytes_down),
            t.bus_gbps(),
            t.exposed_s * 1e3
        ),
        None => "no step finished yet".to_string(),
    }
}

pub fn show(ui: &mut Ui, dash: &Dashboard) {
    let Some(snap) = &dash.snapshot else {
        ui.label("GPU pool: no run yet");
        return;
    };
    ui.horizontal(|ui| {
        name(ui, "GPU pool");
        ui.add(ProgressBar::new(pool_fraction(snap)).text(pool_text(snap)).desired_width(320.0));
        if snap.gpu_bytes > snap.budget {
            ui.label(RichText::new("over budget").color(Color32::RED));
        }
    });
    ui.horizontal(|ui| {
        name(ui, "staging");
        let kind = if snap.staging_pinned { " (uploads from pinned host memory, by DMA)" } else { "" };
        ui.label(format!("{} of upload and write-back rings{kind}", format_bytes(snap.staging_bytes)));
    });
    ui.horizontal(|ui| {
        name(ui, "bus");
        ui.label(bus_text(snap));
    });
    ui.horizontal(|ui| {
        name(ui, "host");
        let rss = dash.host.rss_bytes.map_or("unknown".to_string(), format_bytes);
        let share = if dash.host.host_only_bytes > 0 {
            format!(
                "{:.0} % in RAM (page cache), {} on disk only",
                100.0 * dash.host.host_in_ram_bytes as f64 / dash.host.host_only_bytes as f64,
                format_bytes(dash.host.host_only_bytes - dash.host.host_in_ram_bytes)
            )
        } else {
            "all on the GPU".to_string()
        };
        ui.label(format!(
            "process RSS {rss}; store {} — host-only tensors {}, {share}",
            format_bytes(snap.host_bytes),
            format_bytes(dash.host.host_only_bytes)
        ));
    });
    ui.horizontal(|ui| {
        name(ui, "pager");
        let c = &snap.counters;
        ui.label(format!(
            "{} hits, {} misses, {} evictions, {} prefetches; {} up, {} written back; {:.2} s stalled",
            c.hits,
            c.misses,
            c.evictions,
            c.prefetches,
            format_bytes(c.bytes_uploaded),
            format_bytes(c.bytes_written_back),
            c.stall_s
        ));
    });
}

/// A row's name in a fixed width (rows, not a Grid: a grid whose column widens with its text
/// asks for one more frame each time).
fn name(ui: &mut Ui, text: &str) {
    ui.add_sized([64.0, 18.0], egui::Label::new(text));
}
