//! AdamW on the host (ZeRO-Offload's idea): the moments never leave host memory, gradients come
//! down and updated parameters go up — about 8 bytes per parameter on the bus each step instead
//! of the ~28 a GPU optimizer moves when nothing stays resident. The norm and the update each run
//! as one pass over every tensor on all cores ([`super::host_kernels`]).

use std::collections::HashMap;
use std::rc::Rc;

use super::delayed_update::DelayedUpdate;
use super::grads_down::GradsDown;
use super::half_grads::HalfGrads;
use super::host_kernels::{adamw_update, sum_of_squares, worker_threads, AdamWSlices, AdamWStep};
use super::speculative_update::{self, Speculation};
use super::update_ahead::{self, update_in_place, Group, ParamUpdate, UpdateAhead};
use super::AdamWConfig;
use crate::clock::Stopwatch;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::{Module, Param};
use crate::tensor::{Tensor, TensorId};

mod bets;
mod norm;

use bets::BetClosed;

pub struct HostAdamW {
    /// The twins and thread of the bets on unclipped steps (`super::speculative_update`), made
    /// at the first; first, so that a dropped optimizer joins its thread before its tensors go.
    speculation: Option<Rc<Speculation>>,
    /// The delayed update running on its thread (`super::delayed_update`); first, so that a
    /// dropped optimizer joins it before its tensors go.
    delayed: Option<DelayedUpdate>,
    /// The deferred step's updates running ahead on their own thread (`super::update_ahead`);
    /// first, so that a dropped optimizer joins it before its tensors go.
    ahead: Option<UpdateAhead>,
    pub config: AdamWConfig,
    /// First and second moments, pager tensors that are only ever touched on the host.
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub t: u64,
    /// Global gradient norm of the last step (or of the last [`HostAdamW::note_norm`]).
    pub last_norm: f32,
    /// Host seconds the main thread spent in the optimizer's passes over the host bytes (norms
    /// and updates, the pager's bookkeeping for them included; for updates run ahead, its waits
    /// for them), summed over all steps.
    pub host_seconds: f64,
    /// Index in `m`/`v` of each parameter, by its value's tensor id.
    index: HashMap<TensorId, usize>,
    /// A step begun by [`HostAdamW::defer`] whose updates have not all been applied.
    deferred: Option<Deferred>,
    /// Where the gradients come down in f16 ([`HostAdamW::send_gradients_in_f16`]).
    half_grads: Option<Rc<HalfGrads>>,
    /// Where they come down in f32: each on its way as backward finishes it (made at the first
    /// [`HostAdamW::gradient_watcher`]).
    grads_down: Option<Rc<GradsDown>>,
    /// The groups of parameter indices `apply_deferred` was asked for during this deferred
    /// step, in order, and those of the last step that asked for every parameter once: the
    /// groups and order the next step's updates run ahead in.
    asked: Vec<Vec<usize>>,
    groups: Option<Vec<Vec<usize>>>,
    /// Per parameter, what its update zeroes and forgets, while its update runs ahead.
    after: Vec<AfterUpdate>,
    /// Deferred steps run their updates ahead on a thread of their own once a step has shown
    /// the order the forward asks for them (`super::update_ahead`; the same bits either way).
    /// On by default; `PAGETRAIN_HOST_UPDATE_AHEAD=0` turns it off.
    pub update_ahead: bool,
    /// Deferred steps whose updates ran ahead.
    pub steps_run_ahead: u64,
    /// ZeRO-Offload's delayed parameter update after this many steps (`None`: never): each
    /// later update runs during the whole next step, whose forward reads the weights of the
    /// step before (`super::delayed_update`). Needs a second core.
    pub delay_after: Option<u64>,
    /// Steps whose updates were delayed.
    pub steps_delayed: u64,
    /// Whether steps after an unclipped one bet that they are unclipped too and update during
    /// backward (`super::speculative_update`; the same bits either way). On where updates run
    /// ahead (`update_ahead`); `PAGETRAIN_SPECULATE=0` turns it off.
    pub speculate: bool,
}

/// (zeroed, forgotten) after a parameter's update: its gradient, and its f16 gradient if any.
type AfterUpdate = (TensorId, Option<TensorId>);

/// A step whose norm is taken and whose updates wait for each parameter's next use.
struct Deferred {
    lr: f32,
    /// Multiplies the gradients: the clip factor times 1 / loss scale.
    scale: f32,
    t: u64,
    /// Per parameter: still waiting for its update.
    pending: Vec<bool>,
    /// With f16 gradients: per parameter, what its f16 gradient is multiplied by.
    unscales: Option<Vec<f32>>,
}

/// One AdamW update of a slice of a parameter (the sharded optimizer's unit, `crate::dist`):
/// `p`, `m`, `v`, `g` the same length; `decay` this tensor's weight decay, `scale` multiplies
/// the gradient, `t` the step (from 1). The same arithmetic as [`HostAdamW`], on worker threads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn update_slice(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    c: &AdamWConfig,
    lr: f32,
    decay: f32,
    scale: f32,
    t: u64,
) -> Result<()> {
    let step = AdamWStep { config: *c, lr, scale, t };
    adamw_update(vec![AdamWSlices { p, m, v, g: g.into(), decay, half: None }], &step, worker_threads())
}

impl HostAdamW {
    /// Parameters per second this host's step takes (norm and update, all threads), timed on
    /// `n` parameters in tensors of 4 Mi: pick `n` well above the caches. The arrays are swept
    /// once untimed first, so page faults are not counted.
    pub fn measure_rate(n: usize) -> f64 {
        let (mut p, mut m, mut v, g) = (vec![0.1f32; n], vec![0f32; n], vec![0f32; n], vec![0.01f32; n]);
        let c = AdamWConfig::default();
        let threads = worker_threads();
        const PIECE: usize = 1 << 22;
        let mut pass = || {
            let start = Stopwatch::start();
            let grads: Vec<&[f32]> = g.chunks(PIECE).collect();
            let norm = sum_of_squares(&grads, 1.0, threads).sqrt() as f32;
            let scale = (c.max_grad_norm / (norm + 1e-6)).min(1.0);
            let parts = p.chunks_mut(PIECE).zip(m.chunks_mut(PIECE)).zip(v.chunks_mut(PIECE)).zip(g.chunks(PIECE));
            let tensors =
                parts.map(|(((p, m), v), g)| AdamWSlices { p, m, v, g: g.into(), decay: 0.1, half: None }).collect();
            let step = AdamWStep { config: c, lr: 1e-3, scale, t: 1 };
            adamw_update(tensors, &step, threads).map(|()| start.seconds())
        };
        match pass().and_then(|_| pass()) {
            Ok(s) => n as f64 / s.max(1e-9),
            Err(_) => 0.0,
        }
    }

    pub fn new(ctx: &Context, model: &impl Module, config: AdamWConfig) -> Result<Self> {
        Self::for_params(ctx, &model.params(), config)
    }

    /// Host AdamW over `params` only (a split optimizer's host share, `super::SplitAdamW`).
    pub fn for_params(ctx: &Context, params: &[&Param], config: AdamWConfig) -> Result<Self> {
        if config.lr.is_nan() || config.lr <= 0.0 {
            return Err(Error::invalid("AdamW config", format!("need lr > 0: {config:?}")));
        }
        let (m, v) = super::zero_moments(ctx, params)?;
        let index = params.iter().enumerate().map(|(i, p)| (p.value.id(), i)).collect();
        Ok(HostAdamW {
            speculation: None,
            delayed: None,
            ahead: None,
            config,
            m,
            v,
            t: 0,
            last_norm: 0.0,
            host_seconds: 0.0,
            index,
            deferred: None,
            half_grads: None,
            grads_down: None,
            asked: Vec::new(),
            groups: None,
            after: Vec::new(),
            update_ahead: update_ahead::enabled(worker_threads()),
            steps_run_ahead: 0,
            delay_after: None,
            steps_delayed: 0,
            speculate: speculative_update::enabled(worker_threads()),
        })
    }

    /// From the next step on, the gradients come down in f16, scaled per tensor, and the norm
    /// from the GPU's sums of squares (`optim::half_grads`): for mixed precision, where the
    /// products already read f16. Backward must report to [`HostAdamW::half_grads`].
    pub fn send_gradients_in_f16(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        self.half_grads = Some(Rc::new(HalfGrads::new(ctx, params)?));
        Ok(())
    }

    /// What the last micro-batch's backward reports to, when gradients come down in f16.
    pub fn half_grads(&self) -> Option<Rc<HalfGrads>> {
        self.half_grads.clone()
    }

    /// What it reports to when they come down in f32 (after the first backward watched).
    pub fn grads_down(&self) -> Option<Rc<GradsDown>> {
        self.grads_down.clone()
    }

    /// After the last micro-batch's backward: f16 gradients not cast during it are cast now;
    /// its additions are the record the next backward's watch goes by.
    pub fn backward_done(&self, ctx: &Context) -> Result<()> {
        if let Some(g) = &self.grads_down {
            g.finish();
        }
        match &self.half_grads {
            Some(h) => h.finish(ctx),
            None => Ok(()),
        }
    }

    /// One update at learning rate `lr`; gradients are multiplied by `grad_scale` and clipped to
    /// the configured global norm first.
    pub async fn step_lr(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        self.defer(ctx, params, lr, grad_scale, None)?;
        self.land(ctx, params)
    }

    /// Begins a step: one GPU round trip brings every gradient down and one pass takes their
    /// norm (unless `norm` gives it: what `grad_norm` found for these gradients and this
    /// `grad_scale`); each parameter then gets its update — its gradient zeroed and its f16
    /// copy rewritten — from [`HostAdamW::apply_deferred`], just before its next use. The host
    /// passes of the next step's later layers then run while the GPU computes the earlier
    /// ones. The result is [`HostAdamW::step_lr`]'s: each update reads only its own tensors.
    ///
    /// Past `delay_after` steps the update is delayed instead: it runs on a thread until
    /// [`HostAdamW::land_delayed`] (the trainer calls it as the next step starts; `defer` and
    /// [`HostAdamW::land`] do too) swaps its weights in, and the gradients are zeroed at once.
    pub fn defer(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        lr: f32,
        grad_scale: f32,
        norm: Option<f32>,
    ) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(Error::shape("host AdamW step", self.m.len(), params.len()));
        }
        self.apply_deferred(ctx, params)?;
        self.land_delayed()?;
        let norm = match self.close_bet(ctx, params, lr, grad_scale, norm)? {
            BetClosed::Kept => return Ok(()),
            BetClosed::Lost { norm } => norm,
        };
        let halves = params.iter().filter_map(|p| p.half.as_ref().map(|h| h.id()));
        let values: Vec<_> = params.iter().map(|p| p.value.id()).chain(halves).collect();
        // (An f16 copy is dirty on the GPU only where the GPU made it: before the first step.)
        // f16 gradients come down layer by layer, as their updates need them (`update`).
        let grads = params.iter().filter(|_| self.half_grads.is_none()).map(|p| p.grad.id());
        let ids: Vec<_> = grads.chain(values.iter().copied()).collect();
        ctx.pager.sync_to_host(&ids)?;
        let norm = match norm {
            Some(n) => n,
            None => {
                let start = Stopwatch::start();
                let n = self.norm(ctx, params, grad_scale)?;
                self.host_seconds += start.seconds();
                n
            }
        };
        let unscales = match &self.half_grads {
            Some(h) => Some(h.unscales(ctx)?),
            None => None,
        };
        self.last_norm = norm;
        let c = self.config;
        let clip = c.clip_factor(norm);
        let delay = self.delays_next_update();
        self.t += 1;
        if delay {
            return self.start_delayed(
                ctx,
                params,
                AdamWStep { config: c, lr, scale: clip * grad_scale, t: self.t },
                unscales,
            );
        }
        let pending = vec![true; self.m.len()];
        self.deferred = Some(Deferred { lr, scale: clip * grad_scale, t: self.t, pending, unscales });
        ctx.pager.expect_host_update(&values);
        ctx.pager.end_step();
        if self.update_ahead {
            if let Some(groups) = self.groups.clone() {
                self.start_ahead(ctx, params, groups)?;
            }
        }
        Ok(())
    }

    /// Starts this step's update on the delayed update's thread (see `super::delayed_update`)
    /// and zeroes the gradients it took aside.
    fn start_delayed(
        &mut self,
        ctx: &Context,
        params: &[&Param],
        step: AdamWStep,
        unscales: Option<Vec<f32>>,
    ) -> Result<()> {
        let grads: Vec<&Tensor> =
            (0..params.len()).map(|i| self.half_grads.as_ref().map_or(&params[i].grad, |h| &h.halves[i])).collect();
        if self.delayed.is_none() {
            self.delayed = Some(DelayedUpdate::new(ctx, params, &grads)?);
        }
        let grad_ids: Vec<TensorId> = grads.iter().map(|g| g.id()).collect();
        let updates = params.iter().enumerate().map(|(i, p)| self.param_update(i, p, unscales.as_deref())).collect();
        let delayed = self.delayed.as_mut().expect("made above");
        delayed.start(&grad_ids, &self.m, &self.v, updates, step, worker_threads())?;
        for (i, p) in params.iter().enumerate() {
            ctx.pager.zero(p.grad.id())?;
            if let Some(h) = self.half_grad(i) {
                ctx.pager.forget(h)?;
            }
        }
        self.steps_delayed += 1;
        ctx.pager.end_step();
        Ok(())
    }

    /// Whether the next step's update is delayed (see `delay_after`; not with one core).
    pub fn delays_next_update(&self) -> bool {
        self.delay_after.is_some_and(|after| self.t >= after) && worker_threads() > 1
    }

    /// Waits for a delayed update still running and swaps its weights in.
    pub fn land_delayed(&mut self) -> Result<()> {
        let Some(delayed) = self.delayed.as_mut().filter(|d| d.is_running()) else { return Ok(()) };
        let start = Stopwatch::start();
        delayed.land()?;
        self.host_seconds += start.seconds();
        Ok(())
    }

    /// Applies every update still pending, delayed or deferred: call before reading the weights
    /// or the moments (evaluation, sampling, saving).
    pub fn land(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        if let Some(s) = &self.speculation {
            s.end()?;
        }
        self.land_delayed()?;
        self.apply_deferred(ctx, params)
    }

    /// Lends the host bytes of the deferred step's updates, in `groups`, to a thread that applies
    /// them in that order (see `super::update_ahead`).
    fn start_ahead(&mut self, ctx: &Context, params: &[&Param], groups: Vec<Vec<usize>>) -> Result<()> {
        let d = self.deferred.as_ref().expect("a step was just deferred");
        if let Some(h) = &self.half_grads {
            // (the backward is done: the last of them are on their way down)
            ctx.pager.sync_to_host(&h.halves.iter().map(|t| t.id()).collect::<Vec<_>>())?;
        }
        let step = AdamWStep { config: self.config, lr: d.lr, scale: d.scale, t: d.t };
        let mut lent = Vec::with_capacity(groups.len());
        for group in groups {
            let due: Vec<(usize, &Param)> = group.iter().map(|&i| (i, params[i])).collect();
            let (ids, written, updates) = self.update_plan(&due, d);
            match ctx.pager.lend_host(&ids, &written) {
                Ok(loan) => lent.push(Group { params: group, updates, loan }),
                Err(e) => {
                    // (what was lent goes back before the error does)
                    for g in lent {
                        ctx.pager.return_host(g.loan)?;
                    }
                    return Err(e);
                }
            }
        }
        self.after = params.iter().enumerate().map(|(i, p)| (p.grad.id(), self.half_grad(i))).collect();
        // (all cores: on the H200 16 threads beat 8, which left more to the pager, by 10 ms a step)
        self.ahead = Some(UpdateAhead::start(ctx.pager.clone(), lent, step, worker_threads(), params.len())?);
        self.steps_run_ahead += 1;
        Ok(())
    }

    /// Parameter `i`'s f16 gradient, where the gradients come down so.
    fn half_grad(&self, i: usize) -> Option<TensorId> {
        self.half_grads.as_ref().map(|h| h.halves[i].id())
    }

    /// Applies the deferred update to those of `params` still waiting for it (one pass over
    /// them on all cores, which also rewrites their f16 copies) and zeroes their gradients; a
    /// no-op without a deferred step.
    pub fn apply_deferred(&mut self, ctx: &Context, params: &[&Param]) -> Result<()> {
        if let Some(s) = self.speculation.as_ref().filter(|s| s.is_settling()) {
            let start = Stopwatch::start();
            s.settle(&self.indices(params)?)?;
            self.host_seconds += start.seconds();
            log::debug!("host AdamW: waited {:.2} ms for the kept bet's updates", start.seconds() * 1e3);
        }
        let Some(d) = self.deferred.as_ref() else { return Ok(()) };
        let due: Vec<(usize, &Param)> =
            self.indices(params)?.into_iter().zip(params.iter().copied()).filter(|&(i, _)| d.pending[i]).collect();
        if due.is_empty() {
            return Ok(());
        }
        let asked: Vec<usize> = due.iter().map(|&(i, _)| i).collect();
        // What is recorded for the layers before runs on the GPU while the host updates these.
        ctx.recorder.flush();
        if let (None, Some(h)) = (&self.ahead, &self.half_grads) {
            // Waiting for the GPU to write them back is the pager's stall, not the host pass.
            ctx.pager.sync_to_host(&due.iter().map(|&(i, _)| h.halves[i].id()).collect::<Vec<_>>())?;
        }
        let start = Stopwatch::start();
        let done: Vec<(usize, AfterUpdate)> = match self.ahead.as_mut() {
            // (waiting for the thread counts as the host pass: it is what the main thread loses)
            Some(ahead) => ahead.finish(&asked)?.into_iter().map(|i| (i, self.after[i])).collect(),
            None => {
                self.update(ctx, &due, d)?;
                due.iter().map(|&(i, p)| (i, (p.grad.id(), self.half_grad(i)))).collect()
            }
        };
        self.host_seconds += start.seconds();
        self.asked.push(asked);
        for (i, (grad, half_grad)) in done {
            ctx.pager.zero(grad)?;
            if let Some(h) = half_grad {
                // Read: the next cast writes it whole, so nothing may upload it before then.
                ctx.pager.forget(h)?;
            }
            if let Some(d) = self.deferred.as_mut() {
                d.pending[i] = false;
            }
        }
        if self.deferred.as_ref().is_some_and(|d| !d.pending.contains(&true)) {
            self.deferred = None;
            self.groups = update_ahead::groups_if_complete(&std::mem::take(&mut self.asked), self.m.len());
            if self.ahead.as_ref().is_some_and(|a| a.is_finished()) {
                self.ahead = None;
            }
        }
        Ok(())
    }

    /// Each of `params`' index in `m`/`v`.
    fn indices(&self, params: &[&Param]) -> Result<Vec<usize>> {
        let index = |p: &&Param| {
            self.index.get(&p.value.id()).copied().ok_or_else(|| {
                Error::invalid("host AdamW", format!("`{}` is not a parameter of this optimizer", p.name))
            })
        };
        params.iter().map(index).collect()
    }

    /// Whether a deferred step still has updates to apply, a delayed one is running, or a kept
    /// bet has twins to swap in.
    pub fn has_deferred(&self) -> bool {
        self.deferred.is_some()
            || self.delayed.as_ref().is_some_and(|d| d.is_running())
            || self.speculation.as_ref().is_some_and(|s| s.is_settling())
    }

    /// One AdamW update of the parameters `due` (index in `m`/`v`, parameter), gradients times
    /// `scale`, in one pass in place in the host store. Under mixed precision the pass also
    /// writes each f16 copy from the host, so the f32 master never goes up to the GPU: the bus
    /// carries 2 bytes a parameter up instead of 4, and the copy is clean where it is evicted.
    fn update(&self, ctx: &Context, due: &[(usize, &Param)], d: &Deferred) -> Result<()> {
        let (ids, written, updates) = self.update_plan(due, d);
        let step = AdamWStep { config: self.config, lr: d.lr, scale: d.scale, t: d.t };
        ctx.pager.update_host(&ids, &written, |s| update_in_place(s, &updates, step, worker_threads()))?
    }

    /// The host bytes the update of `due` reads and writes — per parameter its value, moments,
    /// gradient (its f16 copy where the gradients come down so), then its f16 weight copy if it
    /// has one; all but the gradient are written — and what each update needs besides.
    fn update_plan(&self, due: &[(usize, &Param)], d: &Deferred) -> (Vec<TensorId>, Vec<TensorId>, Vec<ParamUpdate>) {
        let mut ids = Vec::with_capacity(5 * due.len());
        let mut written = Vec::with_capacity(4 * due.len());
        let mut updates = Vec::with_capacity(due.len());
        for &(i, p) in due {
            let grad = self.half_grad(i).unwrap_or(p.grad.id());
            let quad = [p.value.id(), self.m[i].id(), self.v[i].id(), grad];
            ids.extend(quad);
            written.extend(&quad[..3]);
            if let Some(half) = &p.half {
                ids.push(half.id());
                written.push(half.id());
            }
            updates.push(self.param_update(i, p, d.unscales.as_deref()));
        }
        (ids, written, updates)
    }

    /// What parameter `i`'s update needs besides its bytes (`unscales`: per parameter, what its
    /// f16 gradient is multiplied by).
    fn param_update(&self, i: usize, p: &Param, unscales: Option<&[f32]>) -> ParamUpdate {
        let decay = if p.value.shape().len() >= 2 { self.config.weight_decay } else { 0.0 };
        ParamUpdate { decay, unscale: unscales.map(|u| u[i]), has_half: p.half.is_some() }
    }
}
