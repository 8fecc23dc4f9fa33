//! The host AdamW's deferred updates, run ahead on a thread of their own. A deferred step
//! (`HostAdamW::defer`) updates each layer just before the next forward reaches it; on the main
//! thread that pass (GPT-2 small: 40 ms a step on 16 cores) adds to the time the main thread
//! spends recording and paging the forward. Once a step has shown in which groups, and in which
//! order, the forward asks for its parameters, the next deferred step lends those groups' host
//! bytes (`Pager::lend_host`) to a thread that updates them in that order, while the main thread
//! goes on; the forward then waits only for a group the thread has not reached yet.
//!
//! The arithmetic is [`update_in_place`] either way, on the same bytes: the results are the same
//! bits as updating on the main thread.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::host_kernels::{adamw_update, AdamWSlices, AdamWStep, GradSlice};
use super::host_values::{pods, F32sMut, PodsMut};
use crate::clock::Stopwatch;
use crate::error::{Error, Result};
use crate::pager::{HostLoan, Pager};

/// What one parameter's update needs besides its bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct ParamUpdate {
    pub decay: f32,
    /// Multiplies its f16 gradient (`None`: the gradient is f32).
    pub unscale: Option<f32>,
    /// It has an f16 copy, written from the updated values.
    pub has_half: bool,
}

/// A gradient's host bytes as the update reads them (f16 with what to multiply it by).
enum GradBytes<'a> {
    F32(Cow<'a, [f32]>),
    F16(Cow<'a, [half::f16]>, f32),
}

/// One AdamW update, in place, of the parameters whose host bytes are `slices`: per parameter
/// its value, moments, gradient and (where `has_half`) f16 copy, in that order.
pub(super) fn update_in_place(
    slices: &mut [&mut [u8]],
    params: &[ParamUpdate],
    step: AdamWStep,
    threads: usize,
) -> Result<()> {
    let mut views = Vec::with_capacity(params.len());
    let mut rest = slices;
    for u in params {
        let fewer = || Error::invalid("host AdamW", "fewer host slices than parameters");
        let (mine, tail) =
            std::mem::take(&mut rest).split_at_mut_checked(4 + usize::from(u.has_half)).ok_or_else(fewer)?;
        rest = tail;
        let [p, m, v, g, half @ ..] = mine else { return Err(fewer()) };
        let half = half.first_mut().map(|h| PodsMut::<half::f16>::new(h));
        let g = match u.unscale {
            Some(unscale) => {
                let (values, carried) = super::half_grads::split_tail(g, p.len() / std::mem::size_of::<f32>())?;
                if carried != unscale {
                    return Err(Error::invalid(
                        "host AdamW",
                        format!("an f16 gradient came down scaled by 1/{carried}, its sum of squares says 1/{unscale}"),
                    ));
                }
                GradBytes::F16(pods(values), unscale)
            }
            None => GradBytes::F32(pods(g)),
        };
        views.push((F32sMut::new(p), F32sMut::new(m), F32sMut::new(v), g, half));
    }
    let tensors = views
        .iter_mut()
        .zip(params)
        .map(|((p, m, v, g, half), u)| AdamWSlices {
            p: p.values(),
            m: m.values(),
            v: v.values(),
            g: match g {
                GradBytes::F16(values, unscale) => GradSlice::F16 { values, unscale: *unscale },
                GradBytes::F32(values) => GradSlice::F32(values),
            },
            decay: u.decay,
            half: half.as_mut().map(|h| h.values()),
        })
        .collect();
    adamw_update(tensors, &step, threads)?;
    for (p, m, v, _, half) in views {
        p.finish();
        m.finish();
        v.finish();
        if let Some(h) = half {
            h.finish();
        }
    }
    Ok(())
}

/// A group of parameters the thread updates at once.
pub(super) struct Group {
    /// Their indices in the optimizer.
    pub params: Vec<usize>,
    pub updates: Vec<ParamUpdate>,
    pub loan: HostLoan,
}

/// The thread updating a deferred step's groups in order, and the groups it has finished.
pub(super) struct UpdateAhead {
    pager: Rc<Pager>,
    /// Per parameter index: its group.
    group_of: Vec<Option<usize>>,
    /// Per group: its parameters, and its loan once the thread is done with it.
    groups: Vec<(Vec<usize>, Option<HostLoan>)>,
    done: mpsc::Receiver<(usize, HostLoan, Result<()>)>,
    thread: Option<JoinHandle<()>>,
}

impl UpdateAhead {
    /// Starts the thread on `groups`, in order, with `threads` workers for each pass.
    pub fn start(pager: Rc<Pager>, groups: Vec<Group>, step: AdamWStep, threads: usize, params: usize) -> Result<Self> {
        let mut group_of = vec![None; params];
        for (g, group) in groups.iter().enumerate() {
            for &i in &group.params {
                group_of[i] = Some(g);
            }
        }
        let listed = groups.iter().map(|g| (g.params.clone(), None)).collect();
        // The work goes over a channel once the thread runs: a thread that cannot start leaves
        // the loans here, to be given back.
        let (give, work) = mpsc::channel::<(Vec<ParamUpdate>, HostLoan)>();
        let (send, done) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("host AdamW ahead".into()).spawn(move || {
            let first = Stopwatch::start();
            for (g, (updates, mut loan)) in work.iter().enumerate() {
                let (began, this) = (first.seconds(), Stopwatch::start());
                let result = update_in_place(&mut loan.slices(), &updates, step, threads);
                // (`RUST_LOG=pagetrain::optim=debug`: how fast each layer's pass runs, and when)
                log::debug!("host AdamW ahead: group {g} from {:.2} ms, {:.2} ms", began * 1e3, this.seconds() * 1e3);
                if send.send((g, loan, result)).is_err() {
                    return;
                }
            }
        });
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                for g in groups {
                    pager.return_host(g.loan)?;
                }
                return Err(Error::invalid("host AdamW", format!("cannot start its thread: {e}")));
            }
        };
        for g in groups {
            // (a thread that stopped early hands the work back: its loan returns now, and
            // `finish` reports the stop)
            if let Err(mpsc::SendError((_, loan))) = give.send((g.updates, g.loan)) {
                pager.return_host(loan)?;
            }
        }
        Ok(UpdateAhead { pager, group_of, groups: listed, done, thread: Some(thread) })
    }

    /// Waits until the thread has updated every group holding one of `params`, gives those
    /// groups' bytes back to the pager and returns their parameters (all of them, which may be
    /// more than `params`). A parameter in no group is an error.
    pub fn finish(&mut self, params: &[usize]) -> Result<Vec<usize>> {
        let mut wanted = Vec::new();
        for &i in params {
            let g = self.group_of.get(i).copied().flatten().ok_or_else(|| {
                Error::invalid("host AdamW", format!("parameter {i} is in no group of the update run ahead"))
            })?;
            if !wanted.contains(&g) {
                wanted.push(g);
            }
        }
        let waiting = Stopwatch::start();
        while wanted.iter().any(|&g| self.groups[g].1.is_none() && !self.groups[g].0.is_empty()) {
            let (g, loan, result) = self
                .done
                .recv()
                .map_err(|_| Error::invalid("host AdamW", "the thread updating ahead stopped before its last group"))?;
            if let Err(e) = result {
                self.pager.return_host(loan)?;
                return Err(e);
            }
            self.groups[g].1 = Some(loan);
        }
        log::debug!("host AdamW ahead: waited {:.2} ms for groups {wanted:?}", waiting.seconds() * 1e3);
        let mut finished = Vec::new();
        for g in wanted {
            if let Some(loan) = self.groups[g].1.take() {
                self.pager.return_host(loan)?;
                finished.append(&mut self.groups[g].0);
            }
        }
        for &i in &finished {
            self.group_of[i] = None;
        }
        Ok(finished)
    }

    /// Whether every group's parameters were handed back by [`UpdateAhead::finish`].
    pub fn is_finished(&self) -> bool {
        self.groups.iter().all(|(params, _)| params.is_empty())
    }
}

impl Drop for UpdateAhead {
    /// The thread writes host bytes the pager owns: it finishes before they can go, and what it
    /// updated goes back to the pager (without the optimizer's bookkeeping: a dropped optimizer
    /// leaves its last step's gradients as they are).
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for (_, loan, _) in self.done.try_iter() {
            let _ = self.pager.return_host(loan);
        }
        for (_, loan) in &mut self.groups {
            if let Some(loan) = loan.take() {
                let _ = self.pager.return_host(loan);
            }
        }
    }
}

/// The groups in which the forward asked for a deferred step's parameters, in order, once they
/// cover every parameter exactly once (see the module docs).
pub(super) fn groups_if_complete(asked: &[Vec<usize>], params: usize) -> Option<Vec<Vec<usize>>> {
    let mut seen = vec![false; params];
    for &i in asked.iter().flatten() {
        if i >= params || std::mem::replace(&mut seen[i], true) {
            return None;
        }
    }
    seen.iter().all(|&s| s).then(|| asked.to_vec())
}

/// Whether deferred updates run ahead on their own thread: not in the browser (no threads), not
/// with one core, not where `PAGETRAIN_HOST_UPDATE_AHEAD=0`.
pub(super) fn enabled(threads: usize) -> bool {
    !cfg!(target_arch = "wasm32")
        && threads > 1
        && std::env::var("PAGETRAIN_HOST_UPDATE_AHEAD").map_or(true, |v| v != "0")
}

#[cfg(test)]
mod tests {
    use super::groups_if_complete;

    #[test]
    fn groups_count_only_when_they_cover_every_parameter_once() {
        let asked = vec![vec![2, 0], vec![1], vec![3]];
        assert_eq!(groups_if_complete(&asked, 4), Some(asked.clone()));
        // a parameter missing, asked twice, or past the end: the order is not known
        assert_eq!(groups_if_complete(&asked, 5), None);
        assert_eq!(groups_if_complete(&[vec![0, 1], vec![1, 2]], 3), None);
        assert_eq!(groups_if_complete(&[vec![0, 1], vec![2, 7]], 3), None);
        assert_eq!(groups_if_complete(&[], 0), Some(vec![]));
    }
}
