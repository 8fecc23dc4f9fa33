//! Launchers for `shaders/embedding.wgsl`: token + position embedding.

use super::{grid_1d, Kernels, EMBEDDING};
use crate::error::{Error, Result};
use crate::pager::View;

gpu_params! {
    pub(super) struct Params {
        /// B·T
        n: u32,
        t: u32,
        c: u32,
        _pad: u32,
    }
}

fn params(n: usize, t: usize, c: usize) -> Params {
    Params { n: n as u32, t: t as u32, c: c as u32, ..Default::default() }
}

/// out (N,C) = wte[tokens] + wpe[row % t]; tokens (N) u32, N = B·T.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    k: &Kernels,
    out: &View,
    tokens: &View,
    wte: &View,
    wpe: &View,
    n: usize,
    t: usize,
    c: usize,
) -> Result<()> {
    k.dispatch(EMBEDDING, "embedding_forward", &[out, tokens, wte, wpe], &params(n, t, c), grid_1d((n * c) as u64))
}

/// Longest batch (B·T rows) the backward takes: row indices keep a flag bit free.
pub const MAX_ROWS: usize = 1 << 31;

/// dwte (V,C) and dwpe (maxT,C) += from dout (N,C). `links` is scratch of N u32 for dwte: where
/// each token's rows continue, so a thread per (token, channel) adds them in row order.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    k: &Kernels,
    dwte: Option<&View>,
    dwpe: Option<&View>,
    links: &View,
    tokens: &View,
    dout: &View,
    n: usize,
    t: usize,
    c: usize,
) -> Result<()> {
    let p = params(n, t, c);
    if let Some(dwte) = dwte {
        if n > MAX_ROWS || n * c > u32::MAX as usize {
            return Err(Error::invalid(
                "embedding backward",
                format!("{n} rows of {c}: past {MAX_ROWS} rows or 2^32 elements"),
            ));
        }
        k.dispatch(EMBEDDING, "embedding_token_links", &[links, tokens], &p, grid_1d(n as u64))?;
        k.dispatch(EMBEDDING, "embedding_backward_wte", &[dwte, tokens, dout, links], &p, grid_1d((n * c) as u64))?;
    }
    if let Some(dwpe) = dwpe {
        k.dispatch(EMBEDDING, "embedding_backward_wpe", &[dwpe, dout], &p, grid_1d((t * c) as u64))?;
    }
    Ok(())
}
