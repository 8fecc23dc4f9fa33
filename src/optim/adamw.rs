//! AdamW (decoupled weight decay, bias correction) as one fused kernel per parameter tensor.

use std::collections::HashMap;

use super::GradClip;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::optim::{self, AdamWStep};
use crate::nn::{Module, Param};
use crate::tensor::{Tensor, TensorId};

#[derive(Clone, Copy, Debug)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Applied to tensors of 2 or more dims (matrices, embeddings), not to biases and gains.
    pub weight_decay: f32,
    /// Global grad-norm clip; ≤ 0 turns clipping off.
    pub max_grad_norm: f32,
}

impl AdamWConfig {
    /// What the gradients are multiplied by for a global norm of `norm`: at most 1, as the clip
    /// kernel computes it (shaders/optim.wgsl `clip_scale`).
    pub fn clip_factor(&self, norm: f32) -> f32 {
        if self.max_grad_norm > 0.0 {
            (self.max_grad_norm / (norm + 1e-6)).min(1.0)
        } else {
            1.0
        }
    }
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, max_grad_norm: 1.0 }
    }
}

pub struct AdamW {
    pub config: AdamWConfig,
    /// First and second moments, one per parameter, in `Module::params` order.
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
    /// Steps taken so far.
    pub t: u64,
    pub clip: GradClip,
    /// Index in `m`/`v` of each parameter, by its value's tensor id.
    index: HashMap<TensorId, usize>,
    /// A step begun by [`AdamW::defer`] whose updates have not all been applied.
    deferred: Option<Deferred>,
}

struct Deferred {
    lr: f32,
    grad_scale: f32,
    t: u64,
    /// Per parameter: still waiting for its update.
    pending: Vec<bool>,
}

impl AdamW {
    pub fn new(ctx: &Context, model: &impl Module, config: AdamWConfig) -> Result<Self> {
        Self::for_params(ctx, &model.params(), config)
    }

    /// AdamW over `params` only (a split optimizer's GPU share, `super::SplitAdamW`).
    pub fn for_params(ctx: &Context, params: &[&Param], config: AdamWConfig) -> Result<Self> {
        if config.lr.is_nan()
            || config.lr <= 0.0
            || !(0.0..1.0).contains(&config.beta1)
            || !(0.0..1.0).contains(&config.beta2)
        {
            return Err(Error::invalid("AdamW config", format!("need lr > 0 and betas in [0,1): {config:?}")));
        }
        let (m, v) = super::zero_moments(ctx, params)?;
        let index = params.iter().enumerate().map(|(i, p)| (p.value.id(), i)).collect();
        Ok(AdamW { config, m, v, t: 0, clip: GradClip::new(ctx, params)?, index, deferred: None })
    }

    /// One update of every parameter from its accumulated gradient at the configured lr.
    pub fn step(&mut self, ctx: &Context, model: &impl Module) -> Result<()> {
        let lr = self.config.lr;
        self.step_lr(ctx, &model.params(), lr, 1.0)
    }

    /// One update at learning rate `lr`, gradients multiplied by `grad_scale` first. Parameters
    /// with an f16 copy get it rewritten by the same kernel.
    pub fn step_lr(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        // A deferred step still pending reads the clip factor about to be replaced.
        self.apply_deferred(ctx, params)?;
        self.clip.compute(ctx, params, self.config.max_grad_norm, grad_scale)?;
        self.step_clipped(ctx, params, lr, grad_scale)
    }

    /// [`AdamW::step_lr`] with the clip factor already computed by `self.clip` for these params
    /// and this `grad_scale` (after an overflow check took the norm, say).
    pub fn step_clipped(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(Error::shape("AdamW step", self.m.len(), params.len()));
        }
        self.apply_deferred(ctx, params)?;
        self.t += 1;
        // Backwards from the norm pass, whose last gradients are still on the GPU when paged.
        for (i, p) in params.iter().enumerate().rev() {
            self.update(ctx, i, p, lr, grad_scale, self.t)?;
        }
        ctx.pager.end_step();
        Ok(())
    }

    /// Begins a step without touching the parameters yet: the clip factor is taken now (unless
    /// `clipped`: already computed for this `grad_scale`), and each parameter gets its update —
    /// and its gradient zeroed — from [`AdamW::apply_deferred`], just before its next use. When
    /// the parameters do not all fit the GPU, an update's transfers then overlap the compute of
    /// the layers before it instead of making a phase of their own. The result is the same as
    /// [`AdamW::step_lr`]'s: every update reads only its own parameter's tensors.
    pub fn defer(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32, clipped: bool) -> Result<()> {
        self.defer_within_step(ctx, params, lr, grad_scale, clipped)?;
        ctx.pager.end_step();
        Ok(())
    }

    /// [`AdamW::defer`] without ending the pager's step: for a caller that ends it itself.
    pub(super) fn defer_within_step(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        lr: f32,
        grad_scale: f32,
        clipped: bool,
    ) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(Error::shape("AdamW step", self.m.len(), params.len()));
        }
        self.apply_deferred(ctx, params)?;
        if !clipped {
            self.clip.compute(ctx, params, self.config.max_grad_norm, grad_scale)?;
        }
        self.t += 1;
        self.deferred = Some(Deferred { lr, grad_scale, t: self.t, pending: vec![true; self.m.len()] });
        Ok(())
    }

    /// Applies the deferred update to those of `params` still waiting for it and zeroes their
    /// gradients (a no-op without a deferred step).
    pub fn apply_deferred(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        let Some(mut d) = self.deferred.take() else { return Ok(()) };
        for p in params {
            let i = *self
                .index
                .get(&p.value.id())
                .ok_or_else(|| Error::invalid("AdamW", format!("`{}` is not a parameter of this optimizer", p.name)))?;
            if d.pending[i] {
                let applied = self.update(ctx, i, p, d.lr, d.grad_scale, d.t).and_then(|_| ctx.pager.zero(p.grad.id()));
                if let Err(e) = applied {
                    self.deferred = Some(d);
                    return Err(e);
                }
                d.pending[i] = false;
            }
        }
        if d.pending.iter().any(|&w| w) {
            self.deferred = Some(d);
        }
        Ok(())
    }

    /// Whether `p` is one of the parameters this optimizer updates.
    pub(super) fn updates(&self, p: &Param) -> bool {
        self.index.contains_key(&p.value.id())
    }

    /// Whether a deferred step still has updates to apply.
    pub fn has_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// One fused update of parameter `i` (and of its f16 copy, if it has one).
    fn update(&self, ctx: &Context, i: usize, p: &Param, lr: f32, grad_scale: f32, t: u64) -> Result<()> {
        let c = self.config;
        let decay = if p.value.shape().len() >= 2 { c.weight_decay } else { 0.0 };
        let s = AdamWStep { lr, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weight_decay: decay, t, grad_scale };
        let _op = ctx.op();
        let (pv, mv, vv) = (ctx.modify(&p.value)?, ctx.modify(&self.m[i])?, ctx.modify(&self.v[i])?);
        let (gv, clip) = (ctx.read(&p.grad)?, ctx.read(&self.clip.clip)?);
        let half = p.half.as_ref().map(|h| ctx.write(h)).transpose()?;
        optim::adamw(&ctx.kernels, &pv, &mv, &vv, &gv, &clip, half.as_ref(), p.value.len(), s)
    }
}
