//! Every kernel against its CPU f64 reference on random data of awkward shapes. Outputs are
//! NaN-poisoned first and followed by canaries, so a skipped or out-of-bounds write fails.
//! One test binary; its parts are the kernel families.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod autotune;
mod layers;
mod matmul;
mod reductions_and_optimizers;
mod submissions;

use common::reference as r;
use common::{assert_close, ctx, randn, to64, Guarded, AWKWARD};
use pagetrain::kernels::{self, activation::Activation, matmul::Gemm, reduce::SumSpec, MatmulVariant};
use pagetrain::rng::Rng;
