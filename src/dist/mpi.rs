//! The [`Collective`] over MPI (rsmpi, the `mpi` cargo feature): non-blocking reduce-scatter and
//! all-gather per bucket (`MPI_Ireduce_scatter_block`, `MPI_Iallgather`), posted as soon as a
//! bucket is ready, so the host prepares the next bucket while the earlier ones travel.

use std::rc::Rc;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;

use super::{launcher_world_size, Collective, CommStats, Consume, Dist, Fill};
use crate::error::{Error, Result};

pub struct MpiComm {
    world: SimpleCommunicator,
    /// Finalizes MPI when dropped (after `world`).
    _universe: Universe,
}

/// Joins the MPI job this process was started in (`mpirun -n N …`); None when it was not
/// started by a launcher or is alone in its job (then it trains as a single process).
pub fn init() -> Result<Option<Rc<Dist>>> {
    if launcher_world_size().is_none() {
        return Ok(None);
    }
    // Only the main thread calls MPI; the pager's copy threads and the prefetcher never do.
    let (universe, _) = mpi::initialize_with_threading(Threading::Funneled)
        .ok_or_else(|| Error::invalid("MPI", "initialized twice in one process".to_string()))?;
    let world = universe.world();
    if world.size() < 2 {
        return Ok(None);
    }
    let local_rank = world.split_shared(world.rank()).rank() as usize;
    Ok(Some(Rc::new(Dist::new(Box::new(MpiComm { world, _universe: universe }), local_rank))))
}

/// Waits for `req` without keeping a core busy: a short spin of tests, then a sleep between
/// tests. MPI's own wait spins, which starves a rank that shares the cores with the waiting
/// one (several ranks on one host, or a CPU driver such as lavapipe doing the "GPU" work).
fn wait_gently<'a, D: ?Sized, S: Scope<'a>>(mut req: Request<'a, D, S>) -> &'a D {
    for tries in 0u32.. {
        match req.test_with_data() {
            Ok((_, data)) => return data,
            Err(r) => req = r,
        }
        if tries < 200 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    unreachable!("the loop returns")
}

impl MpiComm {
    /// Bytes a ring algorithm sends per rank for one collective over `values` f32.
    fn ring_bytes(&self, values: usize) -> u64 {
        let n = self.size() as u64;
        (values as u64 * 4) * (n - 1) / n
    }
}

impl Collective for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn reduce_scatter(&self, chunks: &[usize], fill: &mut Fill, recv: &mut [Vec<f32>]) -> Result<CommStats> {
        let n = self.size();
        let mut sends: Vec<Vec<f32>> = chunks.iter().map(|&c| vec![0.0; c * n]).collect();
        let mut stats = CommStats::default();
        let mut first_post = None;
        let outcome = mpi::request::scope(|scope| {
            let mut pending = Vec::with_capacity(chunks.len());
            let mut failed = None;
            for ((i, send), r) in sends.iter_mut().enumerate().zip(recv.iter_mut()) {
                if let Err(e) = fill(i, send) {
                    failed = Some(e);
                    break;
                }
                r.resize(chunks[i], 0.0);
                let send: &[f32] = send;
                first_post.get_or_insert_with(Instant::now);
                stats.bytes += self.ring_bytes(send.len());
                pending.push(Some(self.world.immediate_reduce_scatter_block_into(
                    scope,
                    send,
                    &mut r[..],
                    SystemOperation::sum(),
                )));
                // MPI progresses non-blocking collectives inside MPI calls: test the ones in flight.
                for p in pending.iter_mut() {
                    if let Some(req) = p.take() {
                        *p = req.test().err();
                    }
                }
            }
            let waiting = Instant::now();
            for req in pending.into_iter().flatten() {
                wait_gently(req);
            }
            stats.exposed_s = waiting.elapsed().as_secs_f64();
            failed.map_or(Ok(()), Err)
        });
        stats.seconds = first_post.map_or(0.0, |t: Instant| t.elapsed().as_secs_f64());
        outcome.map(|_| stats)
    }

    fn all_gather(&self, chunks: &[usize], own: &mut Fill, done: &mut Consume) -> Result<CommStats> {
        let n = self.size();
        let mut owns: Vec<Vec<f32>> = chunks.iter().map(|&c| vec![0.0; c]).collect();
        let mut wholes: Vec<Vec<f32>> = chunks.iter().map(|&c| vec![0.0; c * n]).collect();
        let mut stats = CommStats::default();
        let mut first_post = None;
        let outcome = mpi::request::scope(|scope| {
            let mut pending = Vec::with_capacity(chunks.len());
            let mut failed = None;
            for ((i, mine), whole) in owns.iter_mut().enumerate().zip(wholes.iter_mut()) {
                if let Err(e) = own(i, mine) {
                    failed = Some(e);
                    break;
                }
                let mine: &[f32] = mine;
                first_post.get_or_insert_with(Instant::now);
                stats.bytes += self.ring_bytes(whole.len());
                pending.push(self.world.immediate_all_gather_into(scope, mine, &mut whole[..]));
            }
            // Each bucket lands in the host store while the later ones are still in flight.
            for (i, req) in pending.into_iter().enumerate() {
                let waiting = Instant::now();
                let whole = wait_gently(req);
                stats.exposed_s += waiting.elapsed().as_secs_f64();
                if failed.is_none() {
                    if let Err(e) = done(i, whole) {
                        failed = Some(e);
                    }
                }
            }
            failed.map_or(Ok(()), Err)
        });
        stats.seconds = first_post.map_or(0.0, |t: Instant| t.elapsed().as_secs_f64());
        outcome.map(|_| stats)
    }

    fn all_reduce_sum(&self, values: &mut [f64]) -> Result<()> {
        let mine = values.to_vec();
        mpi::request::scope(|scope| {
            wait_gently(self.world.immediate_all_reduce_into(scope, &mine[..], values, SystemOperation::sum()));
        });
        Ok(())
    }

    fn barrier(&self) {
        wait_gently(self.world.immediate_barrier());
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
