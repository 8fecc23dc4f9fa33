//! Reverse-mode autodiff: ops record backward nodes on a tape in the forward pass; `backward`
//! replays them in reverse. Every backward kernel accumulates (`+=`) into gradient tensors, so
//! gradient accumulation over micro-batches and shared (tied) weights need no extra code.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::elementwise;
use crate::tensor::{Tensor, TensorId};

/// The backward half of an op: reads the gradients of its outputs, adds to those of its inputs.
pub trait Backward {
    fn name(&self) -> &'static str;
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()>;
}

struct Node {
    outputs: Vec<TensorId>,
    op: Box<dyn Backward>,
}

/// The ops recorded since the last `backward` or `clear`.
#[derive(Default)]
pub struct Tape {
    nodes: Vec<Node>,
}

impl Tape {
    pub(crate) fn push(&mut self, outputs: Vec<TensorId>, op: Box<dyn Backward>) {
        self.nodes.push(Node { outputs, op });
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Forgets every node (and the saved tensors they hold).
    pub fn clear(&mut self) {
        self.nodes.clear();
    }

    /// Names of the recorded ops, in forward order.
    pub fn op_names(&self) -> Vec<&'static str> {
        self.nodes.iter().map(|n| n.op.name()).collect()
    }
}

/// Told of each persistent (parameter) gradient an op added to, right after the op's backward
/// was recorded: the gradient is still on the GPU then (gradient clipping takes its sum of
/// squares there instead of bringing every gradient back after backward).
pub trait GradientAdded {
    fn added(&self, ctx: &Context, grad: &Tensor) -> Result<()>;
}

/// Gradients by tensor id. Persistent entries (parameter gradients) survive `backward` and keep
/// accumulating; the others are dropped as soon as the node that produced their tensor is done.
#[derive(Default)]
pub struct Grads {
    map: HashMap<TensorId, Tensor>,
    persistent: HashSet<TensorId>,
    /// See [`Grads::watch`]; with the persistent gradients the running op asked for.
    watcher: Option<Rc<dyn GradientAdded>>,
    touched: Vec<Tensor>,
    /// Gradient tensors handed on as they are ([`Grads::pass_on`]), which may be the gradient of
    /// several tensors at once: an op adding to one copies it first.
    passed: HashSet<TensorId>,
}

impl Grads {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `grad` as the accumulating gradient of `param`.
    pub fn insert_persistent(&mut self, param: &Tensor, grad: Tensor) {
        self.persistent.insert(param.id());
        self.map.insert(param.id(), grad);
    }

    /// Tells `watcher` of every persistent gradient each op of the coming backward adds to, once
    /// that op is recorded (again after each later op that adds to it).
    pub fn watch(&mut self, watcher: Rc<dyn GradientAdded>) {
        self.watcher = Some(watcher);
    }

    /// Tells the watcher of the persistent gradients the op just recorded asked for.
    fn report_touched(&mut self, ctx: &Context) -> Result<()> {
        let touched = std::mem::take(&mut self.touched);
        if let Some(w) = &self.watcher {
            let mut seen = HashSet::new();
            for g in touched.iter().filter(|g| seen.insert(g.id())) {
                w.added(ctx, g)?;
            }
        }
        Ok(())
    }

    /// The gradient of `t`, if anything has been added to it.
    pub fn get(&self, t: &Tensor) -> Option<Tensor> {
        self.map.get(&t.id()).cloned()
    }

    /// The gradient of `t` (of `t`'s element type), created as zeros on first use, for an op to
    /// add to. `None` when `t` needs no gradient.
    pub fn of(&mut self, ctx: &Context, t: &Tensor) -> Result<Option<Tensor>> {
        if !t.requires_grad() {
            return Ok(None);
        }
        if let Some(g) = self.map.get(&t.id()).cloned() {
            if self.passed.contains(&g.id()) && self.map.values().filter(|h| h.id() == g.id()).count() > 1 {
                // the gradient of another tensor too: this one adds to a copy of its own
                let own = ctx.empty("grad", t.shape(), t.dtype(), false)?;
                let _op = ctx.op();
                elementwise::scale_forward(&ctx.kernels, &ctx.write(&own)?, &ctx.read(&g)?, 1.0, g.len())?;
                self.map.insert(t.id(), own.clone());
                return Ok(Some(own));
            }
            if self.watcher.is_some() && self.persistent.contains(&t.id()) {
                self.touched.push(g.clone());
            }
            return Ok(Some(g));
        }
        let g = ctx.zeros_of("grad", t.shape(), t.dtype(), false)?;
        self.map.insert(t.id(), g.clone());
        Ok(Some(g))
    }

    /// The gradient of `t` for an op that writes every element of it: with the factor (`beta`)
    /// to keep what it holds by, 1 where earlier ops have added to it, and 0 for a new one, which
    /// then takes no zero fill (a product with beta 0 neither clears nor reads its output).
    pub fn of_written(&mut self, ctx: &Context, t: &Tensor) -> Result<Option<(Tensor, f32)>> {
        if !t.requires_grad() || self.map.contains_key(&t.id()) {
            return Ok(self.of(ctx, t)?.map(|g| (g, 1.0)));
        }
        let g = ctx.empty("grad", t.shape(), t.dtype(), false)?;
        self.map.insert(t.id(), g.clone());
        Ok(Some((g, 0.0)))
    }

    /// Makes `dout` itself the gradient of `t`, with no copy, for an op whose gradient for `t` is
    /// its output's unchanged (a residual add). Only where `t` has no gradient yet and takes
    /// `dout`'s type and shape; false otherwise, and the op adds `dout` to [`Grads::of`] itself.
    pub fn pass_on(&mut self, t: &Tensor, dout: &Tensor) -> bool {
        if !t.requires_grad()
            || self.map.contains_key(&t.id())
            || t.dtype() != dout.dtype()
            || t.shape() != dout.shape()
        {
            return false;
        }
        self.passed.insert(dout.id());
        self.map.insert(t.id(), dout.clone());
        true
    }

    /// Moves `from`'s gradient to `to`, which has none, of the same type and shape; false (and
    /// nothing moved) otherwise, or where `from`'s is a parameter's.
    fn hand_over(&mut self, from: &Tensor, to: &Tensor) -> bool {
        let movable = to.requires_grad()
            && !self.map.contains_key(&to.id())
            && !self.persistent.contains(&from.id())
            && (from.dtype(), from.shape()) == (to.dtype(), to.shape());
        if !movable {
            return false;
        }
        match self.map.remove(&from.id()) {
            Some(g) => {
                self.map.insert(to.id(), g);
                true
            }
            None => false,
        }
    }

    fn release(&mut self, id: TensorId) {
        if self.persistent.contains(&id) {
            return;
        }
        if let Some(g) = self.map.remove(&id) {
            if self.passed.contains(&g.id()) && !self.map.values().any(|h| h.id() == g.id()) {
                self.passed.remove(&g.id());
            }
        }
    }
}

/// Activation checkpointing: runs `f(x)` keeping none of its intermediate tensors but those it
/// asks its [`Replay`] to keep; backward runs `f(x)` again, this time recording, and
/// backpropagates through that. Memory for one block's input (and what it keeps) instead of all
/// its activations, for one more forward of the block.
pub fn checkpoint(
    ctx: &Context,
    x: &Tensor,
    f: impl Fn(&Context, &Tensor, &Replay) -> Result<Tensor> + 'static,
) -> Result<Tensor> {
    let replay = Replay::default();
    if !ctx.grad_enabled() {
        return f(ctx, x, &replay);
    }
    let outer = std::mem::take(&mut ctx.tape().nodes);
    let result = f(ctx, x, &replay);
    let held = ctx.pager.live_bytes().0;
    // Putting the outer nodes back drops the ones `f` recorded, and the tensors they saved.
    ctx.tape().nodes = outer;
    ctx.pager.note_recompute(held.saturating_sub(ctx.pager.live_bytes().0));
    let out = result?;
    if out.requires_grad() {
        ctx.record(&[&out], Recompute { x: x.clone(), out: out.clone(), f: Box::new(f), replay });
    }
    Ok(out)
}

/// What a checkpointed function's first run keeps for its run again in backward, and which ops
/// that run may leave out (see [`checkpoint`]). Either way the run again records the same
/// backward nodes over the same bits.
#[derive(Default)]
pub struct Replay {
    again: Cell<bool>,
    /// What the first run kept, in the order it kept it; the run again takes it in that order.
    kept: RefCell<VecDeque<Vec<Tensor>>>,
}

impl Replay {
    /// Whether this is the run again in backward.
    pub fn again(&self) -> bool {
        self.again.get()
    }

    /// For an op that costs more to run again than its outputs cost to keep: `make(None)` on
    /// the first run, its `N` tensors kept; on the run again, `make(Some(kept))`, which records
    /// the op's backward over the kept tensors instead of computing them.
    pub fn keep<const N: usize>(
        &self,
        make: impl FnOnce(Option<[Tensor; N]>) -> Result<[Tensor; N]>,
    ) -> Result<[Tensor; N]> {
        if !self.again() {
            let made = make(None)?;
            self.kept.borrow_mut().push_back(made.to_vec());
            return Ok(made);
        }
        let kept = self.kept.borrow_mut().pop_front().and_then(|k| <[Tensor; N]>::try_from(k).ok());
        match kept {
            Some(kept) => make(Some(kept)),
            None => Err(Error::invalid(
                "recompute",
                "the run again in backward asked for other kept tensors than the first run kept",
            )),
        }
    }

    /// `f()`, whose ops on the run again record their backward but dispatch no kernel: for the
    /// last ops of the function, whose outputs no backward reads (the run again's output is
    /// only the root its gradient starts from).
    pub fn unread<T>(&self, ctx: &Context, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.again() {
            ctx.kernels.without_dispatches(f)
        } else {
            f()
        }
    }
}

type Forward = Box<dyn Fn(&Context, &Tensor, &Replay) -> Result<Tensor>>;

struct Recompute {
    x: Tensor,
    out: Tensor,
    f: Forward,
    replay: Replay,
}

impl Backward for Recompute {
    fn name(&self) -> &'static str {
        "recompute"
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        let Some(dout) = grads.get(&self.out) else { return Ok(()) };
        // The outer tape is being replayed and is empty now: `f` records onto a fresh one.
        self.replay.again.set(true);
        let again = (self.f)(ctx, &self.x, &self.replay)?;
        // The output's gradient becomes the run again's, moved rather than copied: nothing
        // else reads it.
        if grads.hand_over(&self.out, &again) {
            ctx.replay(&again, grads, None)
        } else {
            ctx.backward_from(&again, &dout, grads)
        }
    }
}

/// Selective recompute: the `saved` tensors, which no backward reads before the last op recorded
/// (the one that made `reader_out`) — a Linear's input that GELU or LayerNorm made from a
/// tensor kept anyway — are let go now (`Pager::discard`: no budget, no write-back) and made
/// again by `remake` just before that op's backward runs. For ops whose outputs cost the bus
/// more than the kernels cost to run again. A no-op unless that op is the last one recorded.
pub fn remake_for_backward(
    ctx: &Context,
    saved: &[&Tensor],
    reader_out: &Tensor,
    remake: impl Fn(&Context) -> Result<()> + 'static,
) -> Result<()> {
    if !ctx.grad_enabled() {
        return Ok(());
    }
    {
        let mut tape = ctx.tape();
        if !tape.nodes.last().is_some_and(|n| n.outputs.contains(&reader_out.id())) {
            return Ok(());
        }
        let node = tape.nodes.pop().expect("just seen");
        let op = Box::new(Remade { op: node.op, remake: Box::new(remake) });
        tape.nodes.push(Node { outputs: node.outputs, op });
    }
    for t in saved {
        let bytes = ctx.pager.discard(t.id())?;
        ctx.pager.note_recompute(bytes);
    }
    Ok(())
}

/// Writes tensors let go for backward again (see [`remake_for_backward`]).
type Remake = Box<dyn Fn(&Context) -> Result<()>>;

/// A backward node whose saved input is made again first (see [`remake_for_backward`]).
struct Remade {
    op: Box<dyn Backward>,
    remake: Remake,
}

impl Backward for Remade {
    fn name(&self) -> &'static str {
        self.op.name()
    }
    fn backward(&self, ctx: &Context, grads: &mut Grads) -> Result<()> {
        (self.remake)(ctx)?;
        self.op.backward(ctx, grads)
    }
}

impl Context {
    /// Backpropagates from the scalar `loss` (d loss = `seed`), replaying the tape in reverse,
    /// then clears the tape. Parameter gradients in `grads` are accumulated into.
    pub fn backward(&self, loss: &Tensor, grads: &mut Grads, seed: f32) -> Result<()> {
        if let Some(dloss) = grads.of(self, loss)? {
            let _op = self.op();
            elementwise::fill(&self.kernels, &self.write(&dloss)?, seed, dloss.len())?;
        }
        self.replay(loss, grads, Some(seed))
    }

    /// Backpropagates from `out` whose gradient is `dout` (same shape), then clears the tape.
    pub fn backward_from(&self, out: &Tensor, dout: &Tensor, grads: &mut Grads) -> Result<()> {
        if out.shape() != dout.shape() {
            return Err(crate::error::Error::shape("backward_from", out.shape(), dout.shape()));
        }
        if let Some(g) = grads.of(self, out)? {
            let _op = self.op();
            elementwise::axpy(&self.kernels, &self.modify(&g)?, &self.read(dout)?, 1.0, g.len())?;
        }
        self.replay(out, grads, None)
    }

    /// Replays the tape from `loss`, whose gradient a scalar `seed` gave where one did
    /// ([`Context::backward_root`] while it runs).
    fn replay(&self, loss: &Tensor, grads: &mut Grads, seed: Option<f32>) -> Result<()> {
        let outer = self.replace_backward_root(seed.map(|s| (loss.id(), s)));
        let replayed = self.replay_tape(loss, grads);
        self.replace_backward_root(outer);
        replayed
    }

    fn replay_tape(&self, loss: &Tensor, grads: &mut Grads) -> Result<()> {
        let nodes = std::mem::take(&mut self.tape().nodes);
        for node in nodes.into_iter().rev() {
            if node.outputs.iter().any(|id| grads.map.contains_key(id)) {
                node.op.backward(self, grads)?;
                grads.report_touched(self)?;
            }
            for id in &node.outputs {
                grads.release(*id);
            }
        }
        grads.release(loss.id());
        Ok(())
    }
}
