//! SGD with momentum (PyTorch's form, L2 weight decay) as one fused kernel per parameter tensor.

use super::GradClip;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::optim;
use crate::nn::{Module, Param};
use crate::tensor::Tensor;

#[derive(Clone, Copy, Debug)]
pub struct SgdConfig {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub max_grad_norm: f32,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig { lr: 1e-2, momentum: 0.9, weight_decay: 0.0, max_grad_norm: 0.0 }
    }
}

pub struct Sgd {
    pub config: SgdConfig,
    pub momentum: Vec<Tensor>,
    pub clip: GradClip,
}

impl Sgd {
    pub fn new(ctx: &Context, model: &impl Module, config: SgdConfig) -> Result<Self> {
        if config.lr.is_nan() || config.lr <= 0.0 || !(0.0..1.0).contains(&config.momentum) {
            return Err(Error::invalid("SGD config", format!("need lr > 0 and momentum in [0,1): {config:?}")));
        }
        let params = model.params();
        let momentum = params
            .iter()
            .map(|p| ctx.zeros(&format!("{}.momentum", p.name), p.value.shape(), false))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sgd { config, momentum, clip: GradClip::new(ctx, &params)? })
    }

    pub fn step(&mut self, ctx: &Context, model: &impl Module) -> Result<()> {
        self.step_params(ctx, &model.params())
    }

    pub fn step_params(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        if params.len() != self.momentum.len() {
            return Err(Error::shape("SGD step", self.momentum.len(), params.len()));
        }
        let c = self.config;
        self.clip.compute(ctx, params, c.max_grad_norm, 1.0)?;
        for (p, buf) in params.iter().zip(&self.momentum) {
            let _op = ctx.op();
            let (pv, bv, gv, clip) =
                (ctx.modify(&p.value)?, ctx.modify(buf)?, ctx.read(&p.grad)?, ctx.read(&self.clip.clip)?);
            optim::sgd(&ctx.kernels, &pv, &bv, &gv, &clip, p.value.len(), c.lr, c.momentum, c.weight_decay, 1.0)?;
        }
        ctx.pager.end_step();
        Ok(())
    }
}
