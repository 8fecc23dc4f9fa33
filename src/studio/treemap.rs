//! Squarified treemap layout (Bruls, Huizing, van Wijk 2000): rectangles whose areas are
//! proportional to their weights, as close to squares as a greedy row-by-row pass gets them.

use eframe::egui::{pos2, Rect};

/// One rectangle per weight, in the order of `weights`, tiling `area`. Weights ≤ 0 (or not
/// finite) get empty rectangles.
pub fn squarify(weights: &[f64], area: Rect) -> Vec<Rect> {
    let mut out = vec![Rect::NOTHING; weights.len()];
    let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i].is_finite() && weights[i] > 0.0).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]));
    let total: f64 = order.iter().map(|&i| weights[i]).sum();
    if order.is_empty() || area.width() <= 0.0 || area.height() <= 0.0 {
        return out;
    }
    // Work in area units: each weight becomes its share of the rectangle's area.
    let scale = (area.width() as f64 * area.height() as f64) / total;
    let mut free = area;
    let mut row: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let side = free.width().min(free.height()) as f64;
        let area_of = |ids: &[usize]| ids.iter().map(|&j| weights[j] * scale).collect::<Vec<_>>();
        let mut with_next = row.clone();
        with_next.push(order[i]);
        if row.is_empty() || worst(&area_of(&with_next), side) <= worst(&area_of(&row), side) {
            row = with_next;
            i += 1;
        } else {
            free = lay_row(&row, &area_of(&row), free, &mut out);
            row.clear();
        }
    }
    if !row.is_empty() {
        let areas = row.iter().map(|&j| weights[j] * scale).collect::<Vec<_>>();
        lay_row(&row, &areas, free, &mut out);
    }
    out
}

/// The worst aspect ratio of a row of `areas` laid along a side of length `side`.
fn worst(areas: &[f64], side: f64) -> f64 {
    let sum: f64 = areas.iter().sum();
    let (min, max) = areas.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &a| (lo.min(a), hi.max(a)));
    if sum <= 0.0 || min <= 0.0 {
        return f64::MAX;
    }
    let (s2, w2) = (sum * sum, side * side);
    (w2 * max / s2).max(s2 / (w2 * min))
}

/// Lays `row` along the shorter side of `free`; returns what is left of `free`.
fn lay_row(row: &[usize], areas: &[f64], free: Rect, out: &mut [Rect]) -> Rect {
    let sum: f64 = areas.iter().sum();
    if free.width() >= free.height() {
        // A column on the left, items stacked top to bottom.
        let w = (sum / free.height() as f64) as f32;
        let w = w.min(free.width());
        let mut y = free.top();
        for (k, (&id, &a)) in row.iter().zip(areas).enumerate() {
            let h = if k + 1 == row.len() { free.bottom() - y } else { (a / w as f64) as f32 };
            out[id] = Rect::from_min_max(pos2(free.left(), y), pos2(free.left() + w, y + h));
            y += h;
        }
        Rect::from_min_max(pos2(free.left() + w, free.top()), free.max)
    } else {
        // A row on top, items left to right.
        let h = ((sum / free.width() as f64) as f32).min(free.height());
        let mut x = free.left();
        for (k, (&id, &a)) in row.iter().zip(areas).enumerate() {
            let w = if k + 1 == row.len() { free.right() - x } else { (a / h as f64) as f32 };
            out[id] = Rect::from_min_max(pos2(x, free.top()), pos2(x + w, free.top() + h));
            x += w;
        }
        Rect::from_min_max(pos2(free.left(), free.top() + h), free.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(weights: &[f64], area: Rect) -> Vec<Rect> {
        let rects = squarify(weights, area);
        let total: f64 = weights.iter().filter(|w| **w > 0.0).sum();
        let full = (area.width() * area.height()) as f64;
        for (w, r) in weights.iter().zip(&rects) {
            if *w <= 0.0 {
                assert!(!r.is_positive(), "weight {w} got {r:?}");
                continue;
            }
            let want = w / total * full;
            let got = (r.width() * r.height()) as f64;
            assert!((got - want).abs() <= 1e-3 * full + 1e-3, "weight {w}: area {got}, want {want}");
            assert!(area.expand(1e-3).contains_rect(*r), "{r:?} outside {area:?}");
        }
        for (i, a) in rects.iter().enumerate() {
            for b in &rects[i + 1..] {
                let overlap = a.intersect(*b);
                assert!(!overlap.is_positive() || overlap.area() < 1e-2, "{a:?} overlaps {b:?}");
            }
        }
        rects
    }

    #[test]
    fn areas_are_proportional_and_tile_without_overlap() {
        let area = Rect::from_min_max(pos2(10.0, 20.0), pos2(610.0, 420.0));
        check(&[6.0, 6.0, 4.0, 3.0, 2.0, 2.0, 1.0], area);
        check(&[1.0], area);
        check(&[5.0, 0.0, -1.0, 3.0], area);
        let many: Vec<f64> = (1..500).map(|i| ((i * 7919) % 1000 + 1) as f64).collect();
        check(&many, area);
        check(&[1e9, 1.0, 1.0], Rect::from_min_max(pos2(0.0, 0.0), pos2(30.0, 900.0)));
    }

    #[test]
    fn equal_weights_in_a_square_are_squares() {
        let area = Rect::from_min_max(pos2(0.0, 0.0), pos2(100.0, 100.0));
        for r in squarify(&[1.0; 4], area) {
            assert!((r.width() - 50.0).abs() < 1e-3 && (r.height() - 50.0).abs() < 1e-3, "{r:?}");
        }
    }

    #[test]
    fn nothing_to_lay_out() {
        assert!(squarify(&[], Rect::from_min_max(pos2(0.0, 0.0), pos2(1.0, 1.0))).is_empty());
        assert!(!squarify(&[1.0], Rect::NOTHING)[0].is_positive());
    }
}
