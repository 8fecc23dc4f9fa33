//! Data-parallel training over several ranks (one process and one GPU each), ZeRO-style: every
//! rank trains on its slice of each batch under its own GPU budget; gradients are reduce-scattered
//! from host memory so each rank holds the sum of its shard only; each rank keeps 1/N of the
//! AdamW moments in its host store, updates its shard and the updated parameters are all-gathered.
//!
//! The exchange goes through a [`Collective`]: MPI (`mpi` cargo feature, [`mpi`] module, for
//! `mpirun -n N pagetrain train …`) or [`Solo`] (one rank; what tests use without MPI). Nothing
//! here assumes one host: a hostfile spreads the ranks over machines.

pub mod buckets;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shard_files;
pub mod sharded_adamw;

use std::cell::Cell;

use crate::error::{Error, Result};
use crate::nn::GptConfig;
use crate::tensor::Tensor;
use crate::train::{Dataset, Precision, TrainConfig};

pub use buckets::{Bucket, Piece, ShardLayout};
pub use sharded_adamw::ShardedAdamW;

/// Seconds and bytes of communication, summed over the steps since the last [`Dist::take_comm`].
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CommStats {
    /// Bytes this rank sends on the wire, counted as a ring algorithm moves them:
    /// (N−1)/N of each bucket per reduce-scatter and per all-gather.
    #[serde(rename = "comm_bytes")]
    pub bytes: u64,
    /// Wall time from posting a phase's first collective to the completion of its last.
    #[serde(rename = "comm_s")]
    pub seconds: f64,
    /// Of that, the time the host only waited on the network (communication not overlapped).
    #[serde(rename = "comm_exposed_s")]
    pub exposed_s: f64,
}

impl CommStats {
    pub fn add(&mut self, o: CommStats) {
        self.bytes += o.bytes;
        self.seconds += o.seconds;
        self.exposed_s += o.exposed_s;
    }

    /// The mean over `steps` steps.
    pub fn per_step(&self, steps: u64) -> CommStats {
        let n = steps.max(1);
        CommStats { bytes: self.bytes / n, seconds: self.seconds / n as f64, exposed_s: self.exposed_s / n as f64 }
    }
}

/// Bytes the host store holds for `tensors` (what optimizer state costs a rank).
pub fn host_bytes<'a>(ctx: &crate::context::Context, tensors: impl IntoIterator<Item = &'a Tensor>) -> u64 {
    tensors.into_iter().filter_map(|t| ctx.pager.host_range(t.id())).map(|r| r.len as u64).sum()
}

/// What every rank of a run must agree on, as text ([`Dist::check_agree`] compares it).
pub fn describe_setup(c: &TrainConfig, model: &GptConfig, precision: Precision, data: &Dataset, step: u64) -> String {
    format!(
        "steps {}, batch {} × accum {}, seq len {}, lr {} → {:?} after {} warm-up, decay {}, clip {}, seed {}, \
         {precision:?}, {model:?}, data {} ({} tokens), out {}, at step {step}",
        c.steps,
        c.batch_size,
        c.accum,
        c.seq_len,
        c.lr,
        c.min_lr,
        c.warmup_steps,
        c.weight_decay,
        c.grad_clip,
        c.seed,
        data.path.display(),
        data.len(),
        c.out.display()
    )
}

/// Fills bucket `i`'s send buffer (its whole length, padding included).
pub type Fill<'a> = dyn FnMut(usize, &mut [f32]) -> Result<()> + 'a;
/// Receives bucket `i` once its collective has completed.
pub type Consume<'a> = dyn FnMut(usize, &[f32]) -> Result<()> + 'a;

/// The collectives data parallelism needs, over f32 buckets. Bucket `i` is `chunks[i] × size()`
/// values; rank r owns its `r`-th chunk. Implementations start each bucket's collective as soon
/// as it is filled (non-blocking) so later buckets are prepared while earlier ones travel.
pub trait Collective {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sums every rank's buckets; `recv[i]` (`chunks[i]` values) gets this rank's chunk of the sum.
    fn reduce_scatter(&self, chunks: &[usize], fill: &mut Fill, recv: &mut [Vec<f32>]) -> Result<CommStats>;
    /// `own(i, chunk)` writes this rank's chunk of bucket `i`; `done(i, bucket)` gets the whole
    /// bucket (every rank's chunk, in rank order) once gathered.
    fn all_gather(&self, chunks: &[usize], own: &mut Fill, done: &mut Consume) -> Result<CommStats>;
    /// Element-wise sum over ranks, in place (blocking).
    fn all_reduce_sum(&self, values: &mut [f64]) -> Result<()>;
    fn barrier(&self);
    /// Stops every rank (MPI_Abort); `code` becomes the exit status.
    fn abort(&self, code: i32) -> !;
}

/// One rank alone: every collective is a copy.
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn reduce_scatter(&self, chunks: &[usize], fill: &mut Fill, recv: &mut [Vec<f32>]) -> Result<CommStats> {
        for (i, &c) in chunks.iter().enumerate() {
            recv[i].resize(c, 0.0);
            fill(i, &mut recv[i])?;
        }
        Ok(CommStats::default())
    }
    fn all_gather(&self, chunks: &[usize], own: &mut Fill, done: &mut Consume) -> Result<CommStats> {
        for (i, &c) in chunks.iter().enumerate() {
            let mut buf = vec![0.0; c];
            own(i, &mut buf)?;
            done(i, &buf)?;
        }
        Ok(CommStats::default())
    }
    fn all_reduce_sum(&self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) {}
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// This process's place in a data-parallel run, and the communication it has done.
pub struct Dist {
    pub comm: Box<dyn Collective>,
    /// Index of this rank among those on its host (picks its adapter).
    pub local_rank: usize,
    /// Values per bucket of the gradient exchange (16 MiB of f32 by default).
    pub bucket_values: usize,
    comm_stats: Cell<CommStats>,
}

/// Values per bucket by default: 4 Mi f32 (16 MiB), large enough for the network's bandwidth,
/// small enough that the first bucket travels while the rest are prepared.
pub const BUCKET_VALUES: usize = 1 << 22;

impl Dist {
    pub fn new(comm: Box<dyn Collective>, local_rank: usize) -> Dist {
        Dist { comm, local_rank, bucket_values: BUCKET_VALUES, comm_stats: Cell::new(CommStats::default()) }
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Whether this rank prints, evaluates, samples and writes the model (rank 0).
    pub fn is_lead(&self) -> bool {
        self.rank() == 0
    }

    /// This rank's rows of a global batch of `x` (every rank `rows` values), in rank order: the
    /// data of one process with the global batch, split.
    pub fn my_rows<'a>(&self, x: &'a [u32], rows: usize) -> &'a [u32] {
        &x[self.rank() * rows..(self.rank() + 1) * rows]
    }

    /// The mean of `v` over ranks (every rank gets it).
    pub fn mean(&self, v: f32) -> Result<f32> {
        let mut s = [v as f64];
        self.comm.all_reduce_sum(&mut s)?;
        Ok((s[0] / self.size() as f64) as f32)
    }

    /// Every rank's `v`, in rank order (every rank gets them).
    pub fn gather_u64(&self, v: u64) -> Result<Vec<u64>> {
        let mut slots = vec![0.0f64; self.size()];
        slots[self.rank()] = v as f64;
        self.comm.all_reduce_sum(&mut slots)?;
        Ok(slots.into_iter().map(|x| x as u64).collect())
    }

    /// Checks that every rank describes its run as `setup` does here (what must agree: batch,
    /// schedule, seed, model, data, --out…); an error names the ranks that differ from rank 0.
    pub fn check_agree(&self, setup: &str) -> Result<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        setup.hash(&mut h);
        // 52 bits survive the f64 all-reduce exactly.
        let all = self.gather_u64(h.finish() >> 12)?;
        let differ: Vec<usize> = (1..all.len()).filter(|&r| all[r] != all[0]).collect();
        if differ.is_empty() {
            return Ok(());
        }
        Err(Error::invalid(
            "data-parallel run",
            format!("ranks {differ:?} are set up differently from rank 0; this rank has {setup}"),
        ))
    }

    pub(crate) fn note_comm(&self, s: CommStats) {
        let mut c = self.comm_stats.get();
        c.add(s);
        self.comm_stats.set(c);
    }

    /// The communication since the last call.
    pub fn take_comm(&self) -> CommStats {
        self.comm_stats.take()
    }

    /// An error on this rank, named so the message says where it happened.
    pub fn describe_error(&self, e: &Error) -> String {
        format!("rank {} of {}: {e}", self.rank(), self.size())
    }
}

/// The launcher's world size when this process was started by `mpirun`/`srun` (from their
/// environment), so a build without the `mpi` feature can refuse to run N copies of one run.
pub fn launcher_world_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"].iter().find_map(|k| std::env::var(k).ok()?.parse().ok())
}
