//! Host AdamW's global gradient norm: from the GPU's sums of squares where the gradients come
//! down in f16, else one pass over them on all cores once they are down.

use std::borrow::Cow;

use super::super::host_kernels::{sum_of_squares, worker_threads};
use super::super::host_values::pods;
use super::HostAdamW;
use crate::clock::Stopwatch;
use crate::context::Context;
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::TensorId;

impl HostAdamW {
    /// What the norm of `params`' gradients is taken from on the host: the GPU's sums of
    /// squares with f16 gradients, else the gradients.
    fn norm_inputs(&self, params: &[&Param]) -> Vec<TensorId> {
        match &self.half_grads {
            Some(h) => vec![h.sums_id()],
            None => params.iter().map(|p| p.grad.id()).collect(),
        }
    }

    /// The global norm of the gradients times `grad_scale`: from the GPU's sums of squares with
    /// f16 gradients (f64, in parameter order), else [`HostAdamW::grad_norm`].
    pub(super) fn norm(&self, ctx: &Context, params: &[&Param], grad_scale: f32) -> Result<f32> {
        match &self.half_grads {
            Some(h) => {
                let total: f64 = h.sums(ctx)?.iter().map(|&s| s as f64).sum();
                Ok((total.sqrt() * grad_scale.abs() as f64) as f32)
            }
            None => Self::grad_norm(ctx, params, grad_scale),
        }
    }

    /// The global norm of the gradients times `grad_scale` (one GPU round trip, then one pass
    /// on all cores, f64 sums in a fixed order: the same on every machine).
    pub fn grad_norm(ctx: &Context, params: &[&Param], grad_scale: f32) -> Result<f32> {
        let ids: Vec<_> = params.iter().map(|p| p.grad.id()).collect();
        ctx.pager.sync_to_host(&ids)?;
        let sumsq = ctx.pager.update_host(&ids, &[], |s| {
            let grads: Vec<Cow<[f32]>> = s.iter().map(|b| pods(b)).collect();
            let grads: Vec<&[f32]> = grads.iter().map(|g| &**g).collect();
            sum_of_squares(&grads, grad_scale, worker_threads())
        })?;
        Ok(sumsq.sqrt() as f32)
    }

    /// [`HostAdamW::grad_norm`] (after any deferred update still pending), kept as `last_norm`
    /// for a step that follows with the same gradients and `grad_scale` (see
    /// [`HostAdamW::defer`]).
    /// `also`: tensors the caller reads next, brought down in the same round trip (the split
    /// optimizer's GPU share's norm: one wait for the GPU at a step's end, not two).
    pub fn note_norm(&mut self, ctx: &Context, params: &[&Param], grad_scale: f32, also: &[TensorId]) -> Result<f32> {
        self.apply_deferred(ctx, params)?;
        // The wait for the gradients is the GPU's time, not the host passes'.
        let mut inputs = self.norm_inputs(params);
        inputs.extend_from_slice(also);
        if let Some(s) = &self.speculation {
            // (the bet's gradients go to its thread as they land, while the GPU finishes)
            s.pump(ctx)?;
        }
        ctx.pager.sync_to_host(&inputs)?;
        let start = Stopwatch::start();
        self.last_norm = self.norm(ctx, params, grad_scale)?;
        self.host_seconds += start.seconds();
        Ok(self.last_norm)
    }
}
