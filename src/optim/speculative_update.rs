//! The host AdamW's update run during backward, on the bet that the step will not be clipped.
//!
//! Why: exact AdamW cannot start a step's update before the global norm is known, at backward's
//! end, and the next forward then waits for the host's pass layer by layer (GPT-2 small in f16
//! at a quarter of its footprint: ~10 ms a step on an H100, BENCHMARKS stop 49). But the clip
//! factor is 1 whenever the norm is within `max_grad_norm`, as it is for most steps of a run
//! past its first hundred; then each parameter's update needs only its own gradient, and the
//! host share's f16 gradients come down early in backward (the last layers' first). So while
//! backward runs, a thread updates each parameter whose f16 gradient has landed into twins of
//! its value, moments and f16 copy. At the step's end, with a finite norm and a clip factor of
//! exactly 1 the bet is kept: each parameter's twins are swapped in ([`Pager::swap_host`]: no
//! byte moves) just before the next forward reads it, so the step's end does not wait for the
//! thread's last updates (those of the first layers, whose gradients land last); otherwise the
//! twins are dropped and the step takes the usual way. The arithmetic is the usual update's,
//! chunk for chunk (`adamw_update_from`): the values are the same bits either way.
//!
//! The host optimizer bets only after a step that was not clipped, so a run whose steps clip
//! loses one bet and then none. Parameters without an f16 copy, whose f32 value the GPU reads,
//! are updated at the step's end as before: biases and gains, a few thousand values a layer,
//! but also the token embedding where the host updates it (38.6 M values in GPT-2 small: at a
//! tenth of its footprint, 9 ms a step on the main thread). The twins cost 14 bytes of host
//! store a parameter with an f16 copy.
//! `PAGETRAIN_SPECULATE=0` turns the bets off; `=1` keeps them where a paged run would otherwise
//! time them first (`train::bet_trial`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::half_grads::{split_tail, HalfGrads};
use super::host_kernels::{adamw_update_from, AdamWSlices, AdamWStep, GradSlice};
use super::host_values::{pods, F32sMut, PodsMut};
use crate::autograd::GradientAdded;
use crate::clock::Stopwatch;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::Param;
use crate::pager::{HostLoan, Pager};
use crate::tensor::{Tensor, TensorId};

/// The longest the step's end waits for the gradients of a bet to land before giving it up
/// (they are on their way: only a GPU that stopped makes this wait end so).
const LANDING_TIMEOUT_S: f64 = 30.0;

/// Backward hands landed gradients over at most this often: each look polls the device, and
/// backward reports a few hundred gradient additions a step.
const POLL_EVERY_S: f64 = 250e-6;

/// What one parameter's bet reads and writes in the host store.
struct Plan {
    /// Its value, first and second moment and f16 gradient (read; the gradient's scale comes
    /// down after its values: `half_grads::EXPONENT_TAIL`).
    reads: [TensorId; 4],
    /// Twins of its value, moments and f16 weight copy (written).
    twins: [Tensor; 4],
    /// Its f16 weight copy, which the last twin replaces.
    half: TensorId,
    /// Its weight decay.
    decay: f32,
}

/// One parameter's update for the thread: its index, its weight decay, and its bytes (reads,
/// then twins).
type Work = (usize, f32, HostLoan);

/// A parameter's update done by the thread: its index, its bytes back, and how it went.
type Done = (usize, HostLoan, Result<()>);

/// A bet under way: the step it updates for, and the thread updating into the twins.
struct Bet {
    step: AdamWStep,
    /// Per parameter: handed to the thread.
    sent: Vec<bool>,
    /// Per parameter: handed to the thread and not back yet.
    with_thread: Vec<bool>,
    /// `None` once the bet is kept: the thread ends when it has done what it was handed.
    work: Option<mpsc::Sender<Work>>,
    done: mpsc::Receiver<Done>,
    thread: JoinHandle<()>,
}

impl Bet {
    /// Whether the bet is kept and still has twins to swap in ([`Speculation::settle`]).
    fn kept(&self) -> bool {
        self.work.is_none()
    }
}

pub(super) struct Speculation {
    pager: Rc<Pager>,
    halves: Rc<HalfGrads>,
    /// Per parameter of the host optimizer: its plan, or `None` where it has no f16 copy.
    plans: Vec<Option<Plan>>,
    bet: RefCell<Option<Bet>>,
    threads: usize,
    /// When backward last polled for landed gradients (see [`POLL_EVERY_S`]).
    polled: Cell<Option<Stopwatch>>,
    /// Steps whose bet was kept, and lost (clipped, overflowed, or not taken up).
    pub won: Cell<u64>,
    pub lost: Cell<u64>,
}

impl Speculation {
    /// Twins for every one of `params` with an f16 copy; `m`, `v` their moments, `decays` their
    /// weight decays, `halves` where their f16 gradients come down.
    pub fn new(
        ctx: &Context,
        params: &[&Param],
        m: &[Tensor],
        v: &[Tensor],
        decays: &[f32],
        halves: Rc<HalfGrads>,
        threads: usize,
    ) -> Result<Self> {
        if m.len() != params.len() || v.len() != params.len() || decays.len() != params.len() {
            return Err(Error::shape("speculative update", params.len(), m.len().min(v.len()).min(decays.len())));
        }
        let mut plans = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let Some(half) = &p.half else {
                plans.push(None);
                continue;
            };
            let twin = |t: &Tensor| ctx.empty(&format!("{} (bet)", t.name()), t.shape(), t.dtype(), false);
            plans.push(Some(Plan {
                reads: [p.value.id(), m[i].id(), v[i].id(), halves.halves[i].id()],
                twins: [twin(&p.value)?, twin(&m[i])?, twin(&v[i])?, twin(half)?],
                half: half.id(),
                decay: decays[i],
            }));
        }
        Ok(Speculation {
            pager: ctx.pager.clone(),
            halves,
            plans,
            bet: RefCell::new(None),
            threads,
            polled: Cell::new(None),
            won: Cell::new(0),
            lost: Cell::new(0),
        })
    }

    /// Bets on `step` (its `scale` the gradients' factor with no clip): from now on each
    /// parameter whose f16 gradient has landed is updated into its twins. A bet still open is
    /// given up first.
    pub fn begin(&self, step: AdamWStep) -> Result<()> {
        self.end()?;
        let (work, jobs) = mpsc::channel::<Work>();
        let (send, done) = mpsc::channel();
        let threads = self.threads;
        let spawned = std::thread::Builder::new().name("host AdamW bet".into()).spawn(move || {
            let mut waiting = Vec::new();
            while let Some((i, decay, mut loan)) = next_first_in_forward(&jobs, &mut waiting, |w| w.0) {
                let result = update_into(&mut loan.slices(), decay, step, threads);
                if send.send((i, loan, result)).is_err() {
                    return;
                }
            }
        });
        let thread =
            spawned.map_err(|e| Error::invalid("host AdamW", format!("cannot start its bet's thread: {e}")))?;
        let n = self.plans.len();
        *self.bet.borrow_mut() =
            Some(Bet { step, sent: vec![false; n], with_thread: vec![false; n], work: Some(work), done, thread });
        Ok(())
    }

    /// Whether a bet is open (placed, and neither kept nor lost yet).
    pub fn is_open(&self) -> bool {
        self.bet.borrow().as_ref().is_some_and(|b| !b.kept())
    }

    /// Whether a kept bet still has twins to swap in.
    pub fn is_settling(&self) -> bool {
        self.bet.borrow().as_ref().is_some_and(|b| b.kept())
    }

    /// The parameters of `bet` whose gradients are cast and not yet handed to its thread.
    fn due(&self, bet: &Bet) -> Vec<usize> {
        (0..self.plans.len()).filter(|&i| self.plans[i].is_some() && !bet.sent[i] && self.halves.is_cast(i)).collect()
    }

    /// Hands the thread every parameter of the open bet whose f16 gradient has landed in the
    /// host store (after delivering the write-backs done so far).
    fn send_landed(&self) -> Result<()> {
        let mut bet = self.bet.borrow_mut();
        let Some(bet) = bet.as_mut() else { return Ok(()) };
        let Some(work) = &bet.work else { return Ok(()) };
        let due = self.due(bet);
        if due.is_empty() {
            return Ok(());
        }
        self.pager.poll()?;
        for i in due {
            let plan = self.plans[i].as_ref().expect("filtered");
            if !self.pager.landed(&[plan.reads[3]]) {
                continue;
            }
            let twins: Vec<TensorId> = plan.twins.iter().map(|t| t.id()).collect();
            let ids: Vec<TensorId> = plan.reads.iter().copied().chain(twins.iter().copied()).collect();
            let loan = self.pager.lend_host(&ids, &twins)?;
            if let Err(mpsc::SendError((_, _, loan))) = work.send((i, plan.decay, loan)) {
                self.pager.return_host(loan)?;
                return Err(Error::invalid("host AdamW", "the bet's thread stopped"));
            }
            // Its backward is done and its f16 copy is about to be replaced: uploading it ahead
            // for the next forward would be wasted (and the swap would wait for that upload).
            self.pager.expect_host_update(&[plan.half]);
            bet.sent[i] = true;
            bet.with_thread[i] = true;
        }
        Ok(())
    }

    /// At backward's end, before the norm is read: hands the thread every parameter of the open
    /// bet as its gradient lands, polling until all are handed over (the GPU may still be
    /// running backward: the host updates the landed ones meanwhile).
    pub fn pump(&self, ctx: &Context) -> Result<()> {
        if !self.is_open() {
            return Ok(());
        }
        ctx.recorder.flush();
        let start = Stopwatch::start();
        loop {
            self.send_landed()?;
            // (every gradient is cast once backward is done: `HalfGrads::finish`)
            let all_sent = self.bet.borrow().as_ref().is_none_or(|b| self.due(b).is_empty());
            if all_sent {
                return Ok(());
            }
            if start.seconds() > LANDING_TIMEOUT_S {
                log::warn!("host AdamW: the bet's gradients did not land in {LANDING_TIMEOUT_S} s; the step's update runs as usual");
                return self.end();
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// The step's end, once its norm is known: if the open bet was on `step` (the update the
    /// step takes, clip factor included), keeps it and returns the parameters it updates: each
    /// one's twins are swapped in by [`Speculation::settle`] before its next use (the thread
    /// may still be updating the last to land, the first the next forward reads after the
    /// GPU's share). Otherwise gives the bet up and returns `None`.
    pub fn collect(&self, ctx: &Context, step: &AdamWStep) -> Result<Option<Vec<usize>>> {
        let matches = self.bet.borrow().as_ref().is_some_and(|b| !b.kept() && same_step(&b.step, step));
        if !matches {
            self.end()?;
            return Ok(None);
        }
        // Every gradient is on the host by now (the norm was read after them): the rest go.
        let rest: Vec<TensorId> = self.plans.iter().flatten().map(|p| p.reads[3]).collect();
        ctx.pager.sync_to_host(&rest)?;
        self.send_landed()?;
        let missing = {
            let bet = self.bet.borrow();
            let sent = &bet.as_ref().expect("checked").sent;
            self.plans.iter().zip(sent).any(|(p, &s)| p.is_some() && !s)
        };
        if missing {
            self.end()?;
            return Ok(None);
        }
        // The f16 copies are clean on the GPU (they were made there only before the first step).
        let halves: Vec<TensorId> = self.plans.iter().flatten().map(|p| p.half).collect();
        ctx.pager.sync_to_host(&halves)?;
        let updated = {
            let mut bet = self.bet.borrow_mut();
            let bet = bet.as_mut().expect("checked");
            bet.work = None;
            (0..self.plans.len()).filter(|&i| bet.sent[i]).collect()
        };
        self.won.set(self.won.get() + 1);
        // (what the thread has done already is swapped in now)
        self.settle(&[])?;
        Ok(Some(updated))
    }

    /// Swaps in the twins of those of `params` (indices) a kept bet still holds, waiting for
    /// the thread's updates of them, and of any others it has finished; then forgets their f16
    /// gradients. A no-op without a kept bet.
    pub fn settle(&self, params: &[usize]) -> Result<()> {
        let mut slot = self.bet.borrow_mut();
        let Some(bet) = slot.as_mut().filter(|b| b.kept()) else { return Ok(()) };
        let waited_for = |bet: &Bet| params.iter().any(|&i| bet.with_thread.get(i).copied().unwrap_or(false));
        let mut arrived: Vec<Done> = bet.done.try_iter().collect();
        let mut first = Ok(());
        loop {
            for (i, loan, result) in arrived.drain(..) {
                bet.with_thread[i] = false;
                let back = self.pager.return_host(loan);
                if first.is_ok() {
                    first = back.and(result).and_then(|()| self.swap_in(i));
                }
            }
            if !waited_for(bet) {
                break;
            }
            match bet.done.recv() {
                Ok(d) => arrived.push(d),
                Err(_) => break,
            }
        }
        if waited_for(bet) && first.is_ok() {
            first = Err(Error::invalid("host AdamW", "the bet's thread stopped before its last update"));
        }
        if !bet.with_thread.contains(&true) {
            let bet = slot.take().expect("checked");
            let _ = bet.thread.join();
        }
        first
    }

    /// Parameter `i`'s twins in place of its value, moments and f16 copy; its f16 gradient is
    /// used up.
    fn swap_in(&self, i: usize) -> Result<()> {
        let plan = self.plans[i]
            .as_ref()
            .ok_or_else(|| Error::invalid("host AdamW", "a bet on a parameter without an f16 copy"))?;
        let targets = [plan.reads[0], plan.reads[1], plan.reads[2], plan.half];
        for (target, twin) in targets.iter().zip(&plan.twins) {
            self.pager.swap_host(*target, twin.id())?;
        }
        self.pager.forget(plan.reads[3])?;
        Ok(())
    }

    /// Ends a bet: a kept one's last twins are swapped in; an open one is given up, its thread
    /// finishing what it has and the bytes going back to the pager.
    pub fn end(&self) -> Result<()> {
        if self.is_settling() {
            let all: Vec<usize> = (0..self.plans.len()).collect();
            return self.settle(&all);
        }
        let Some(bet) = self.bet.borrow_mut().take() else { return Ok(()) };
        self.lost.set(self.lost.get() + 1);
        finish(&self.pager, bet)
    }
}

impl Drop for Speculation {
    fn drop(&mut self) {
        if let Some(bet) = self.bet.borrow_mut().take() {
            let _ = finish(&self.pager, bet);
        }
    }
}

/// Stops handing out work, waits for what the thread has, and gives every loan back; the
/// first error found, after all loans are back.
fn finish(pager: &Pager, bet: Bet) -> Result<()> {
    let Bet { work, done, thread, with_thread, .. } = bet;
    drop(work);
    let mut outstanding = with_thread.iter().filter(|&&w| w).count();
    let mut back = Vec::with_capacity(outstanding);
    let mut first = Ok(());
    while outstanding > 0 {
        match done.recv() {
            Ok((_, loan, result)) => {
                outstanding -= 1;
                back.push(loan);
                if first.is_ok() {
                    first = result;
                }
            }
            Err(_) => {
                if first.is_ok() {
                    first = Err(Error::invalid("host AdamW", "the bet's thread stopped before its last update"));
                }
                break;
            }
        }
    }
    let _ = thread.join();
    for loan in back {
        pager.return_host(loan)?;
    }
    first
}

/// Of the work handed over and not yet done (`waiting`, topped up from `jobs`), the parameter
/// the next forward reads first (the lowest index), blocking while there is none; `None` once
/// `jobs` is closed and all is done. Gradients land in backward's order, the reverse of the
/// forward's: in the order handed over, the last to land — the first the next forward reads
/// after the GPU's share — would be updated last, and that forward would wait for all of the
/// thread's backlog.
fn next_first_in_forward<W>(jobs: &mpsc::Receiver<W>, waiting: &mut Vec<W>, index: impl Fn(&W) -> usize) -> Option<W> {
    if waiting.is_empty() {
        waiting.push(jobs.recv().ok()?);
    }
    waiting.extend(jobs.try_iter());
    let first = (0..waiting.len()).min_by_key(|&k| index(&waiting[k]))?;
    Some(waiting.swap_remove(first))
}

/// Whether two steps update with the same bits.
fn same_step(a: &AdamWStep, b: &AdamWStep) -> bool {
    a.lr.to_bits() == b.lr.to_bits() && a.scale.to_bits() == b.scale.to_bits() && a.t == b.t
}

/// One parameter's update from its value, moments and f16 gradient (times the unscale its tail
/// carries, `split_tail`) into the twins of its value, moments and f16 copy: `slices` in the
/// loan's order.
fn update_into(slices: &mut [&mut [u8]], decay: f32, step: AdamWStep, threads: usize) -> Result<()> {
    let [p, m, v, g, p2, m2, v2, h2] = slices else {
        return Err(Error::invalid("host AdamW", format!("a bet's update takes 8 host slices, not {}", slices.len())));
    };
    let (p, m, v) = (pods::<f32>(p), pods::<f32>(m), pods::<f32>(v));
    let (g, unscale) = split_tail(g, p.len())?;
    let g = pods::<half::f16>(g);
    let (mut p2, mut m2, mut v2, mut h2) = (F32sMut::new(p2), F32sMut::new(m2), F32sMut::new(v2), PodsMut::new(h2));
    let into = AdamWSlices {
        p: p2.values(),
        m: m2.values(),
        v: v2.values(),
        g: GradSlice::F16 { values: &g, unscale },
        decay,
        half: Some(h2.values()),
    };
    adamw_update_from(vec![[&p, &m, &v]], vec![into], &step, threads)?;
    p2.finish();
    m2.finish();
    v2.finish();
    h2.finish();
    Ok(())
}

/// What the last micro-batch's backward reports to while a bet is open: the f16 casts, then
/// the bet's thread is handed what has landed.
pub(super) struct Betting {
    pub halves: Rc<HalfGrads>,
    pub speculation: Rc<Speculation>,
}

impl GradientAdded for Betting {
    fn added(&self, ctx: &Context, grad: &Tensor) -> Result<()> {
        self.halves.added(ctx, grad)?;
        let s = &self.speculation;
        if s.polled.get().is_some_and(|at| at.seconds() < POLL_EVERY_S) {
            return Ok(());
        }
        s.polled.set(Some(Stopwatch::start()));
        s.send_landed()
    }
}

/// Whether the host optimizer bets on unclipped steps: where its updates run ahead on a thread
/// (`super::update_ahead::enabled`), unless `PAGETRAIN_SPECULATE=0`.
pub(super) fn enabled(threads: usize) -> bool {
    super::update_ahead::enabled(threads) && std::env::var("PAGETRAIN_SPECULATE").map_or(true, |v| v != "0")
}

/// Whether `PAGETRAIN_SPECULATE=1` asks for bets whatever a trial would measure (for
/// measuring them: a paged run's bet trial, `train::bet_trial`, is then skipped).
pub fn forced() -> bool {
    std::env::var("PAGETRAIN_SPECULATE").is_ok_and(|v| v == "1")
}

/// Threads a bet's updates run on, of the host's `all`: `PAGETRAIN_BET_THREADS`, else all.
pub(super) fn threads(all: usize) -> usize {
    let asked = std::env::var("PAGETRAIN_BET_THREADS").ok().and_then(|v| v.parse::<usize>().ok());
    asked.unwrap_or(all).clamp(1, all.max(1))
}

#[cfg(test)]
mod tests {
    use super::next_first_in_forward;
    use std::sync::mpsc;

    #[test]
    fn the_thread_takes_the_parameter_the_forward_reads_first_of_what_is_waiting() {
        let (give, jobs) = mpsc::channel();
        let mut waiting = Vec::new();
        let next = |waiting: &mut Vec<usize>| next_first_in_forward(&jobs, waiting, |&i| i);
        for i in [7, 3, 9] {
            give.send(i).unwrap();
        }
        assert_eq!(next(&mut waiting), Some(3));
        // handed over later but read earlier by the forward: it goes before those waiting
        give.send(1).unwrap();
        assert_eq!(next(&mut waiting), Some(1));
        assert_eq!(next(&mut waiting), Some(7));
        drop(give);
        assert_eq!(next(&mut waiting), Some(9), "what waits is done after the sender closes");
        assert_eq!(next(&mut waiting), None);
    }
}
