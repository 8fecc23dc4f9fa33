//! Launchers for `shaders/layernorm.wgsl`.

use super::reduce::{column_block_rows, column_blocks, sum_rows};
use super::{grid_1d, grid_rows, Kernels, LAYERNORM, SHORT_ROW, WG};
use crate::error::Result;
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        rows: u32,
        c: u32,
        eps: f32,
        block_rows: u32,
    }
}

fn params(rows: usize, c: usize, eps: f32) -> Params {
    Params { rows: rows as u32, c: c as u32, eps, block_rows: 0 }
}

/// Threads a row takes in the kernels that hold rows in registers (`ROW_THREADS`), rows a
/// workgroup of them holds (`GROUP_ROWS`), and the most elements a thread holds.
const ROW_THREADS: usize = 128;
const GROUP_ROWS: usize = WG as usize / ROW_THREADS;
const MAX_HELD: usize = 16;

/// A row kernel's three forms: a thread per row (up to SHORT_ROW), rows held in registers (up
/// to ROW_THREADS · MAX_HELD), a workgroup per row (longer).
struct Forms {
    short: &'static str,
    held: &'static str,
    wide: &'static str,
}

const FORWARD: Forms =
    Forms { short: "layernorm_forward_rows", held: "layernorm_forward", wide: "layernorm_forward_wide" };
const BACKWARD: Forms =
    Forms { short: "layernorm_backward_rows", held: "layernorm_backward", wide: "layernorm_backward_wide" };

/// The entry for rows of `c`, the elements a thread holds (the variant's DIM), and the grid.
fn launch(rows: usize, c: usize, forms: Forms) -> (&'static str, u32, [u32; 3]) {
    let held = c.div_ceil(ROW_THREADS).next_power_of_two();
    if c <= SHORT_ROW {
        (forms.short, 0, grid_1d(rows as u64))
    } else if held <= MAX_HELD {
        (forms.held, held as u32, grid_1d((rows.div_ceil(GROUP_ROWS) * WG as usize) as u64))
    } else {
        (forms.wide, 0, grid_rows(rows as u64))
    }
}

/// out (N,C), mean (N), rstd (N) from x (N,C), weight (C), bias (C).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    k: &Kernels,
    out: &View,
    mean: &View,
    rstd: &View,
    x: &View,
    w: &View,
    b: &View,
    rows: usize,
    c: usize,
    eps: f32,
) -> Result<()> {
    let (entry, held, grid) = launch(rows, c, FORWARD);
    k.dispatch_unrolled(LAYERNORM, entry, (held, 0), &[out, mean, rstd, x, w, b], &params(rows, c, eps), grid)
}

/// dx (N,C) += ..., and dweight (C), dbias (C) += ... (accumulating). With `partials` (two
/// scratches of `column_blocks(N, C)·C` floats, for dweight and dbias) the parameter sums run
/// in two stages where [`column_blocks`] says so (see there), else a thread per column.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dx: Option<&View>,
    dw: &View,
    db: &View,
    dout: &View,
    x: &View,
    w: &View,
    mean: &View,
    rstd: &View,
    partials: Option<(&View, &View)>,
    rows: usize,
    c: usize,
) -> Result<()> {
    let p = params(rows, c, 0.0);
    if let Some(dx) = dx {
        let (entry, held, grid) = launch(rows, c, BACKWARD);
        k.dispatch_unrolled(LAYERNORM, entry, (held, 0), &[dx, dout, x, w, mean, rstd], &p, grid)?;
    }
    let blocks = column_blocks(rows, c);
    match partials {
        Some((pw, pb)) if blocks > 1 => {
            let stage1 = Params { block_rows: column_block_rows(rows, c) as u32, ..p };
            let grid = [c.div_ceil(256) as u32, blocks as u32, 1];
            k.dispatch(LAYERNORM, "layernorm_backward_param_blocks", &[pw, pb, dout, x, mean, rstd], &stage1, grid)?;
            sum_rows(k, dw, pw, None, blocks, c)?;
            sum_rows(k, db, pb, None, blocks, c)
        }
        _ => k.dispatch(LAYERNORM, "layernorm_backward_params", &[dw, db, dout, x, mean, rstd], &p, grid_1d(c as u64)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shader_splits_rows_among_threads_as_the_launcher_counts() {
        let src = include_str!("../../shaders/layernorm.wgsl");
        let line = format!("const ROW_THREADS: u32 = {}u;", super::ROW_THREADS);
        assert!(src.contains(&line), "layernorm.wgsl lacks `{line}`");
    }
}
