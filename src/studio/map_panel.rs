//! The residency map: every tensor a cell sized by its bytes, coloured by where its bytes are,
//! grouped by layer and kind. Tensors too small to see are drawn as one striped cell per group
//! (split by location); a click on a group shows it alone, each tensor a cell.

use eframe::egui::{self, pos2, vec2, Align2, Color32, FontId, Rect, Sense, Stroke, StrokeKind, Ui};

use super::residency::{self, bytes_by_location, group_title, location_color, location_label, Group, Kind, LOCATIONS};
use super::treemap::squarify;
use crate::pager::{Snapshot, TensorInfo};
use crate::train::format_bytes;

/// Smallest cell (in square points) drawn for a tensor of its own on the overview.
const MIN_CELL_AREA: f64 = 100.0;
/// Most tensors drawn one by one per group on the overview (the rest are aggregated).
const MAX_CELLS_PER_GROUP: usize = 48;
/// In a group shown alone, tensors below this area are aggregated.
const MIN_CELL_AREA_EXPANDED: f64 = 9.0;

/// What a cell stands for.
#[derive(Clone, Debug, PartialEq)]
pub enum CellContent {
    /// One tensor: its index in the snapshot.
    Tensor(usize),
    /// Tensors of one group too small to draw one by one.
    Aggregate { layer: String, kind: Kind, tensors: Vec<usize>, bytes: u64, by_location: [u64; LOCATIONS.len()] },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub rect: Rect,
    pub content: CellContent,
    /// The group the cell belongs to (a click shows it alone).
    pub group: (String, Kind),
}

#[derive(Default)]
pub struct ResidencyMap {
    /// A group shown alone, by layer and kind.
    pub expanded: Option<(String, Kind)>,
    /// Cells drawn last frame, for hovering and for tests.
    pub cells: Vec<Cell>,
}

impl ResidencyMap {
    pub fn show(&mut self, ui: &mut Ui, snap: Option<&Snapshot>) {
        legend(ui);
        let Some(snap) = snap else {
            ui.label("No snapshot yet: start a run to see where its tensors are.");
            self.cells.clear();
            return;
        };
        let groups = residency::groups(snap);
        if let Some((layer, kind)) = self.expanded.clone() {
            ui.horizontal(|ui| {
                if ui.button("< all tensors").clicked() {
                    self.expanded = None;
                }
                ui.label(format!("{} — click anywhere to go back", group_title(&layer, kind)));
            });
        }
        let size = ui.available_size().max(vec2(64.0, 64.0));
        let (response, painter) = ui.allocate_painter(size, Sense::click());
        let area = response.rect.shrink(1.0);
        let shown = self.expanded.as_ref().and_then(|(l, k)| groups.iter().find(|g| &g.layer == l && g.kind == *k));
        if self.expanded.is_some() && shown.is_none() {
            self.expanded = None; // the group is gone (e.g. a new run)
        }
        self.cells = match shown {
            Some(g) => group_cells(snap, g, area, MIN_CELL_AREA_EXPANDED, usize::MAX),
            None => overview_cells(snap, &groups, area, &painter),
        };
        for cell in &self.cells {
            paint_cell(&painter, cell, snap);
        }
        let hovered = response.hover_pos().and_then(|p| self.cells.iter().find(|c| c.rect.contains(p)));
        if let Some(cell) = hovered.cloned() {
            painter.rect_stroke(cell.rect, 0.0, Stroke::new(2.0, Color32::WHITE), StrokeKind::Inside);
            let response = response.on_hover_ui_at_pointer(|ui| describe(ui, &cell, snap));
            if response.clicked() {
                self.expanded = if self.expanded.is_some() { None } else { Some(cell.group.clone()) };
            }
        } else if response.clicked() {
            self.expanded = None;
        }
    }

    /// The cell drawing tensor `id`, if it has one of its own.
    pub fn cell_of(&self, snap: &Snapshot, id: u64) -> Option<&Cell> {
        self.cells.iter().find(|c| matches!(c.content, CellContent::Tensor(i) if snap.tensors[i].id == id))
    }
}

fn legend(ui: &mut Ui) {
    ui.horizontal_wrapped(|ui| {
        for l in LOCATIONS {
            let (r, _) = ui.allocate_exact_size(vec2(12.0, 12.0), Sense::hover());
            ui.painter().rect_filled(r, 2.0, location_color(l));
            ui.label(location_label(l));
        }
        ui.label("·  red corner: dirty (GPU copy newer)  ·  yellow edge: transfer in flight  ·  striped: small tensors, click to expand");
    });
}

/// Layers tile the area by bytes; inside each, its kinds; inside each kind, its tensors.
fn overview_cells(snap: &Snapshot, groups: &[Group], area: Rect, painter: &egui::Painter) -> Vec<Cell> {
    let mut layers: Vec<(&str, Vec<&Group>)> = Vec::new();
    for g in groups {
        match layers.last_mut() {
            Some((l, gs)) if *l == g.layer => gs.push(g),
            _ => layers.push((&g.layer, vec![g])),
        }
    }
    let layer_bytes: Vec<f64> = layers.iter().map(|(_, gs)| gs.iter().map(|g| g.bytes as f64).sum()).collect();
    let mut cells = Vec::new();
    for ((name, gs), rect) in layers.iter().zip(squarify(&layer_bytes, area)) {
        if !rect.is_positive() {
            continue;
        }
        let mut inner = rect.shrink(1.5);
        if inner.height() > 30.0 && inner.width() > 40.0 {
            painter.text(inner.left_top(), Align2::LEFT_TOP, *name, FontId::proportional(11.0), Color32::GRAY);
            inner.min.y += 13.0;
        }
        let bytes: Vec<f64> = gs.iter().map(|g| g.bytes as f64).collect();
        for (g, r) in gs.iter().zip(squarify(&bytes, inner)) {
            if r.is_positive() {
                cells.extend(group_cells(snap, g, r.shrink(0.5), MIN_CELL_AREA, MAX_CELLS_PER_GROUP));
            }
        }
    }
    cells
}

/// A group's tensors in `rect`: those large enough one by one, the rest as one aggregate cell.
fn group_cells(snap: &Snapshot, g: &Group, rect: Rect, min_area: f64, max_cells: usize) -> Vec<Cell> {
    let per_byte = rect.area() as f64 / g.bytes.max(1) as f64;
    let own =
        g.tensors.iter().take(max_cells).take_while(|&&i| snap.tensors[i].bytes as f64 * per_byte >= min_area).count();
    let (alone, rest) = g.tensors.split_at(own);
    let mut weights: Vec<f64> = alone.iter().map(|&i| snap.tensors[i].bytes.max(1) as f64).collect();
    let rest_bytes: u64 = rest.iter().map(|&i| snap.tensors[i].bytes).sum();
    if !rest.is_empty() {
        weights.push(rest_bytes.max(1) as f64);
    }
    let group = (g.layer.clone(), g.kind);
    let rects = squarify(&weights, rect);
    let mut cells: Vec<Cell> = alone
        .iter()
        .zip(&rects)
        .map(|(&i, &r)| Cell { rect: r, content: CellContent::Tensor(i), group: group.clone() })
        .collect();
    if !rest.is_empty() {
        let content = CellContent::Aggregate {
            layer: g.layer.clone(),
            kind: g.kind,
            tensors: rest.to_vec(),
            bytes: rest_bytes,
            by_location: bytes_by_location(rest.iter().map(|&i| &snap.tensors[i])),
        };
        cells.push(Cell { rect: rects[rects.len() - 1], content, group });
    }
    cells.retain(|c| c.rect.is_positive());
    cells
}

fn paint_cell(painter: &egui::Painter, cell: &Cell, snap: &Snapshot) {
    let r = cell.rect;
    let border = Stroke::new(1.0, Color32::from_gray(24));
    match &cell.content {
        CellContent::Tensor(i) => {
            let t = &snap.tensors[*i];
            painter.rect_filled(r, 0.0, location_color(t.location));
            if t.dirty {
                let s = (r.width().min(r.height()) * 0.4).min(8.0);
                let tr = r.right_top();
                let tri = vec![tr, pos2(tr.x - s, tr.y), pos2(tr.x, tr.y + s)];
                painter.add(egui::Shape::convex_polygon(tri, Color32::from_rgb(229, 57, 53), Stroke::NONE));
            }
            if t.in_flight {
                painter.rect_stroke(r, 0.0, Stroke::new(2.0, Color32::from_rgb(255, 235, 59)), StrokeKind::Inside);
            }
            if r.width() > 70.0 && r.height() > 16.0 {
                let short = t.name.rsplit(['.', '/']).next().unwrap_or(&t.name);
                let text = painter.layout_no_wrap(short.to_string(), FontId::proportional(10.0), Color32::WHITE);
                if text.size().x < r.width() - 4.0 {
                    painter.galley(r.left_top() + vec2(3.0, 2.0), text, Color32::WHITE);
                }
            }
        }
        CellContent::Aggregate { by_location, bytes, tensors, .. } => {
            // Stripes left to right, one per location, as wide as its share of the bytes.
            let mut x = r.left();
            for (k, &b) in by_location.iter().enumerate() {
                if b == 0 {
                    continue;
                }
                let w = r.width() * b as f32 / (*bytes).max(1) as f32;
                let stripe = Rect::from_min_max(pos2(x, r.top()), pos2((x + w).min(r.right()), r.bottom()));
                painter.rect_filled(stripe, 0.0, location_color(LOCATIONS[k]));
                x += w;
            }
            painter.rect_stroke(r, 0.0, Stroke::new(1.0, Color32::from_gray(200)), StrokeKind::Inside);
            if r.width() > 60.0 && r.height() > 14.0 {
                let label = format!("{} tensors", tensors.len());
                painter.text(r.center(), Align2::CENTER_CENTER, label, FontId::proportional(10.0), Color32::WHITE);
            }
        }
    }
    painter.rect_stroke(r, 0.0, border, StrokeKind::Inside);
}

/// The hover text of a cell.
pub fn describe_text(cell: &Cell, snap: &Snapshot) -> String {
    match &cell.content {
        CellContent::Tensor(i) => tensor_text(&snap.tensors[*i]),
        CellContent::Aggregate { layer, kind, tensors, bytes, by_location } => {
            let mut s =
                format!("{}: {} small tensors, {}", group_title(layer, *kind), tensors.len(), format_bytes(*bytes));
            for (k, &b) in by_location.iter().enumerate() {
                if b > 0 {
                    s += &format!("\n  {}: {}", location_label(LOCATIONS[k]), format_bytes(b));
                }
            }
            s + "\nclick to see them one by one"
        }
    }
}

pub fn tensor_text(t: &TensorInfo) -> String {
    let shape = if t.shape.is_empty() {
        "—".to_string()
    } else {
        format!("[{}]", t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
    };
    let next = t.next_use.map_or("not predicted".to_string(), |n| format!("access {n} of the step"));
    let mut flags = Vec::new();
    if t.dirty {
        flags.push("dirty: the GPU copy is newer than the host's");
    }
    if t.in_flight {
        flags.push("a transfer is in flight");
    }
    let flags = if flags.is_empty() { String::new() } else { format!("\n{}", flags.join("; ")) };
    format!(
        "{}\nshape {shape}, {}, {}\nlocation: {}\nuploads: {}, last use: access {}, next use: {next}{flags}",
        t.name,
        t.dtype,
        format_bytes(t.bytes),
        location_label(t.location),
        t.uploads,
        t.last_use
    )
}

fn describe(ui: &mut Ui, cell: &Cell, snap: &Snapshot) {
    ui.label(describe_text(cell, snap));
}
