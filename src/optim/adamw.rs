//! AdamW (decoupled weight decay, bias correction) as one fused kernel per parameter tensor.

use super::GradClip;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::optim::{self, AdamWStep};
use crate::nn::{Module, Param};
use crate::tensor::Tensor;

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
}

impl AdamW {
    pub fn new(ctx: &Context, model: &impl Module, config: AdamWConfig) -> Result<Self> {
        if !(config.lr > 0.0) || !(0.0..1.0).contains(&config.beta1) || !(0.0..1.0).contains(&config.beta2) {
            return Err(Error::invalid("AdamW config", format!("need lr > 0 and betas in [0,1): {config:?}")));
        }
        let params = model.params();
        let mut m = Vec::with_capacity(params.len());
        let mut v = Vec::with_capacity(params.len());
        for p in &params {
            m.push(ctx.zeros(&format!("{}.exp_avg", p.name), p.value.shape(), false)?);
            v.push(ctx.zeros(&format!("{}.exp_avg_sq", p.name), p.value.shape(), false)?);
        }
        Ok(AdamW { config, m, v, t: 0, clip: GradClip::new(ctx, params.len())? })
    }

    /// One update of every parameter from its accumulated gradient at the configured lr.
    pub fn step(&mut self, ctx: &Context, model: &impl Module) -> Result<()> {
        let lr = self.config.lr;
        self.step_lr(ctx, &model.params(), lr, 1.0)
    }

    /// One update at learning rate `lr`, gradients multiplied by `grad_scale` first. Parameters
    /// with an f16 copy get it rewritten by the same kernel.
    pub fn step_lr(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        self.clip.compute(ctx, params, self.config.max_grad_norm, grad_scale)?;
        self.step_clipped(ctx, params, lr, grad_scale)
    }

    /// [`AdamW::step_lr`] with the clip factor already computed by `self.clip` for these params
    /// and this `grad_scale` (after an overflow check took the norm, say).
    pub fn step_clipped(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(Error::shape("AdamW step", self.m.len(), params.len()));
        }
        self.t += 1;
        let c = self.config;
        // Backwards from the norm pass, whose last gradients are still on the GPU when paged.
        for (i, p) in params.iter().enumerate().rev() {
            let decay = if p.value.shape().len() >= 2 { c.weight_decay } else { 0.0 };
            let s = AdamWStep {
                lr,
                beta1: c.beta1,
                beta2: c.beta2,
                eps: c.eps,
                weight_decay: decay,
                t: self.t,
                grad_scale,
            };
            let _op = ctx.op();
            let (pv, mv, vv) = (ctx.modify(&p.value)?, ctx.modify(&self.m[i])?, ctx.modify(&self.v[i])?);
            let (gv, clip) = (ctx.read(&p.grad)?, ctx.read(&self.clip.clip)?);
            let half = p.half.as_ref().map(|h| ctx.write(h)).transpose()?;
            optim::adamw(&ctx.kernels, &pv, &mv, &vv, &gv, &clip, half.as_ref(), p.value.len(), s)?;
        }
        Ok(())
    }
}
