//! ZeRO-Offload's delayed parameter update: the host AdamW's update of step N runs on a thread
//! of its own during the whole of step N + 1, whose forward and backward read the weights of
//! step N − 1. The host pass (GPT-2 small: ~29 ms a step of memory traffic on 16 cores) then
//! never holds up the GPU, and the step's end needs no wait for the norm before the next
//! forward can be recorded.
//!
//! Everything the GPU touches during step N + 1 is double-buffered in the host store, so the
//! thread and the pager never share bytes:
//! - the weights the GPU reads (the f16 copy where a parameter has one, else its value) have a
//!   twin the thread writes; the twins are exchanged when the update lands
//!   ([`Pager::swap_host`]: no byte moves);
//! - a parameter without an f16 copy gets a private master the thread updates in place (its
//!   value is what the GPU reads); one with an f16 copy updates its value, which the GPU does
//!   not read;
//! - the step's gradients are taken aside into a twin the same way, so the next backward
//!   writes its own.
//!
//! The arithmetic is the host AdamW's (`update_in_place`): landing at once after starting gives
//! the bits of an update that was not delayed.

use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::host_kernels::{copy_on_threads, AdamWStep};
use super::update_ahead::{update_in_place, ParamUpdate};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::Param;
use crate::pager::{HostLoan, Pager};
use crate::tensor::{Tensor, TensorId};

/// One parameter's buffers for the delayed update.
struct Twins {
    /// What the GPU reads: the f16 copy, or the value where there is none.
    visible: TensorId,
    /// What the update changes as the weights: the value where the GPU reads an f16 copy, else
    /// `own_master`.
    master: TensorId,
    /// A private copy of the value, for a parameter whose value the GPU reads.
    own_master: Option<Tensor>,
    /// The next `visible`, written by the thread.
    next: Tensor,
    /// The gradient the update reads, taken aside from the one the next backward writes.
    taken: Tensor,
}

/// The thread running an update: it hands its loan back with the outcome.
type Running = JoinHandle<Option<(HostLoan, Result<()>)>>;

pub(super) struct DelayedUpdate {
    pager: Rc<Pager>,
    twins: Vec<Twins>,
    running: Option<Running>,
}

impl DelayedUpdate {
    /// The twins of `params`, whose updates read the gradients `grads` (one per parameter, f16
    /// or f32); private masters start as copies of the values.
    pub fn new(ctx: &Context, params: &[&Param], grads: &[&Tensor]) -> Result<Self> {
        if grads.len() != params.len() {
            return Err(Error::shape("delayed update gradients", params.len(), grads.len()));
        }
        let mut twins = Vec::with_capacity(params.len());
        for (p, g) in params.iter().zip(grads) {
            let visible = p.half.as_ref().unwrap_or(&p.value);
            let own_master = match p.half {
                Some(_) => None,
                None => {
                    Some(ctx.empty(&format!("{} (delayed master)", p.name), p.value.shape(), p.value.dtype(), false)?)
                }
            };
            twins.push(Twins {
                visible: visible.id(),
                master: own_master.as_ref().map_or(p.value.id(), |m| m.id()),
                next: ctx.empty(&format!("{} (next)", visible.name()), visible.shape(), visible.dtype(), false)?,
                taken: ctx.empty(&format!("{} (taken)", g.name()), g.shape(), g.dtype(), false)?,
                own_master,
            });
        }
        let values: Vec<TensorId> = params.iter().map(|p| p.value.id()).collect();
        ctx.pager.sync_to_host(&values)?;
        for (t, p) in twins.iter().zip(params) {
            if let Some(m) = &t.own_master {
                ctx.pager.update_host(&[p.value.id(), m.id()], &[m.id()], |s| {
                    let [value, master] = s else { unreachable!("two tensors asked") };
                    master.copy_from_slice(value);
                })?;
            }
        }
        Ok(DelayedUpdate { pager: ctx.pager.clone(), twins, running: None })
    }

    /// Starts the update of the gradients `grads` (those given to `new`, in order, with their
    /// newest values on the GPU or the host) on a thread: they are taken aside first, so the
    /// caller may zero or forget them at once. `m`, `v`: the moments; `updates`: per parameter,
    /// what its update needs (`has_half`: its f16 copy is what the GPU reads). Land the update
    /// before starting another ([`DelayedUpdate::land`]).
    pub fn start(
        &mut self,
        grads: &[TensorId],
        m: &[Tensor],
        v: &[Tensor],
        updates: Vec<ParamUpdate>,
        step: AdamWStep,
        threads: usize,
    ) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::invalid("delayed update", "the last update has not landed"));
        }
        let n = self.twins.len();
        if [grads.len(), m.len(), v.len(), updates.len()].iter().any(|&l| l != n) {
            return Err(Error::shape("delayed update parameters", n, grads.len()));
        }
        if self.twins.iter().zip(&updates).any(|(t, u)| u.has_half == t.own_master.is_some()) {
            return Err(Error::invalid("delayed update", "an f16 copy is asked for where the GPU reads the value"));
        }
        let pager = &self.pager;
        let visible = self.twins.iter().map(|t| t.visible);
        let masters = self.twins.iter().map(|t| t.master);
        pager.sync_to_host(&grads.iter().copied().chain(visible).chain(masters).collect::<Vec<_>>())?;
        for (t, &g) in self.twins.iter().zip(grads) {
            pager.swap_host(g, t.taken.id())?;
        }
        // The loan: per parameter its master, moments, gradient and, where the GPU reads an f16
        // copy, the next copy (as `update_in_place` reads them); then the f32 `next` of the
        // others, copied from their masters after the update.
        let mut ids = Vec::with_capacity(5 * n);
        let mut written = Vec::with_capacity(4 * n);
        let mut copied_masters = Vec::new();
        for (i, t) in self.twins.iter().enumerate() {
            let quad = [t.master, m[i].id(), v[i].id(), t.taken.id()];
            match t.own_master {
                Some(_) => copied_masters.push(ids.len()),
                None => written.push(t.next.id()),
            }
            ids.extend(quad);
            written.extend(&quad[..3]);
            if t.own_master.is_none() {
                ids.push(t.next.id());
            }
        }
        let update_slices = ids.len();
        for t in self.twins.iter().filter(|t| t.own_master.is_some()) {
            ids.push(t.next.id());
            written.push(t.next.id());
        }
        let loan = pager.lend_host(&ids, &written)?;
        // The loan goes over a channel once the thread runs: a thread that cannot start leaves
        // it here, to be given back.
        let (give, work) = mpsc::channel::<HostLoan>();
        let spawned = std::thread::Builder::new().name("host AdamW delayed".into()).spawn(move || {
            let mut loan = work.recv().ok()?;
            let mut slices = loan.slices();
            let (update, copies) = slices.split_at_mut(update_slices);
            let result = update_in_place(update, &updates, step, threads);
            if result.is_ok() {
                let pairs =
                    copies.iter_mut().zip(&copied_masters).map(|(next, &m)| (&mut **next, &*update[m])).collect();
                copy_on_threads(pairs, threads);
            }
            drop(slices);
            Some((loan, result))
        });
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                pager.return_host(loan)?;
                return Err(Error::invalid("delayed update", format!("cannot start its thread: {e}")));
            }
        };
        if let Err(mpsc::SendError(loan)) = give.send(loan) {
            pager.return_host(loan)?;
            return Err(Error::invalid("delayed update", "its thread stopped before the update"));
        }
        self.running = Some(thread);
        Ok(())
    }

    /// Whether an update is running (started and not landed).
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Waits for the running update, if any, and swaps the weights it wrote in where the GPU
    /// reads them.
    pub fn land(&mut self) -> Result<()> {
        let Some(running) = self.running.take() else { return Ok(()) };
        let stopped = || Error::invalid("delayed update", "the thread updating the weights stopped");
        let (loan, result) = running.join().map_err(|_| stopped())?.ok_or_else(stopped)?;
        self.pager.return_host(loan)?;
        result?;
        for t in &self.twins {
            self.pager.swap_host(t.visible, t.next.id())?;
        }
        Ok(())
    }
}

impl Drop for DelayedUpdate {
    /// The thread writes host bytes the pager owns: it finishes before they can go, and its
    /// loan goes back (the weights it wrote are not swapped in: a dropped optimizer's last
    /// update is lost, as an update not yet applied would be).
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            if let Ok(Some((loan, _))) = running.join() {
                let _ = self.pager.return_host(loan);
            }
        }
    }
}
