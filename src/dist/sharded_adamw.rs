//! AdamW sharded over ranks (ZeRO stage 2's idea, on the host): gradients come down from the GPU
//! bucket by bucket and are reduce-scattered as each bucket is filled, so a rank receives the
//! summed gradients of its shard only; it keeps the moments of its shard alone (1/N of the
//! single-process state) in its host store, updates its shard of the parameters, and the updated
//! parameters are all-gathered back into every rank's store. The arithmetic is
//! [`crate::optim::HostAdamW`]'s, element for element.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use super::buckets::ShardLayout;
use super::Dist;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::nn::{Module, Param};
use crate::optim::{update_slice, AdamWConfig, F32sMut};
use crate::tensor::{Tensor, TensorId};
use crate::train::tensor_file::TensorFile;

/// Both moments of a range of one parameter's elements.
pub struct MomentPiece {
    /// Index of the parameter in `Module::params` order, and the range's first element.
    pub param: usize,
    pub offset: usize,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

pub struct ShardedAdamW {
    pub config: AdamWConfig,
    /// First and second moments of this rank's shard (`layout.shard_len()` values), host only.
    pub m: Tensor,
    pub v: Tensor,
    pub t: u64,
    /// Global gradient norm of the last exchange.
    pub last_norm: f32,
    pub layout: ShardLayout,
    /// Where each bucket's owned values start in the shard.
    shard_at: Vec<usize>,
    dist: Rc<Dist>,
    n_params: usize,
    /// This rank's chunk of the summed gradients, per bucket, from the last exchange.
    reduced: Option<Vec<Vec<f32>>>,
}

/// Copies elements `offset..offset + dst.len()` of a tensor's host bytes into `dst`.
fn read_elems(bytes: &[u8], offset: usize, dst: &mut [f32]) {
    let n = dst.len();
    bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&bytes[offset * 4..(offset + n) * 4]);
}

/// Copies `src` into elements `offset..offset + src.len()` of a tensor's host bytes.
fn write_elems(bytes: &mut [u8], offset: usize, src: &[f32]) {
    bytes[offset * 4..(offset + src.len()) * 4].copy_from_slice(bytemuck::cast_slice(src));
}

impl ShardedAdamW {
    pub fn new(ctx: &Context, model: &impl Module, config: AdamWConfig, dist: Rc<Dist>) -> Result<Self> {
        if config.lr.is_nan() || config.lr <= 0.0 {
            return Err(Error::invalid("AdamW config", format!("need lr > 0: {config:?}")));
        }
        let params = model.params();
        if let Some(p) = params.iter().find(|p| p.value.dtype() != crate::tensor::DType::F32) {
            return Err(Error::invalid("sharded AdamW", format!("`{}` is not an f32 parameter", p.name)));
        }
        let sizes: Vec<usize> = params.iter().map(|p| p.value.len()).collect();
        let layout = ShardLayout::new(&sizes, dist.size(), dist.rank(), dist.bucket_values)?;
        let n = layout.shard_len().max(1);
        let m = ctx.zeros(&format!("adamw.shard{}.exp_avg", dist.rank()), &[n], false)?;
        let v = ctx.zeros(&format!("adamw.shard{}.exp_avg_sq", dist.rank()), &[n], false)?;
        let mut shard_at = Vec::with_capacity(layout.owned.len());
        let mut at = 0;
        for pieces in &layout.owned {
            shard_at.push(at);
            at += pieces.iter().map(|p| p.len).sum::<usize>();
        }
        let n_params = params.len();
        Ok(ShardedAdamW { config, m, v, t: 0, last_norm: 0.0, layout, shard_at, dist, n_params, reduced: None })
    }

    /// Bytes of optimizer state this rank keeps in its host store.
    pub fn state_bytes(&self, ctx: &Context) -> u64 {
        [&self.m, &self.v].iter().filter_map(|t| ctx.pager.host_range(t.id())).map(|r| r.len as u64).sum()
    }

    fn grad_ids(params: &[&Param], which: &[usize]) -> Vec<TensorId> {
        which.iter().map(|&i| params[i].grad.id()).collect()
    }

    /// Brings the gradients down bucket by bucket and reduce-scatters each as soon as it is
    /// filled; returns the global norm of the mean gradient times `grad_scale` (and keeps this
    /// rank's summed chunk for [`ShardedAdamW::step_lr`]).
    pub fn exchange(&mut self, ctx: &Context, params: &[&Param], grad_scale: f32) -> Result<f32> {
        if params.len() != self.n_params {
            return Err(Error::shape("sharded AdamW step", self.n_params, params.len()));
        }
        let chunks = self.layout.chunks();
        let mut recv: Vec<Vec<f32>> = chunks.iter().map(|&c| vec![0.0; c]).collect();
        let buckets = &self.layout.buckets;
        let stats = self.dist.comm.reduce_scatter(
            &chunks,
            &mut |i, send| {
                let b = &buckets[i];
                let which = b.params();
                let ids = Self::grad_ids(params, &which);
                ctx.pager.sync_to_host(&ids)?;
                ctx.pager.update_host(&ids, &[], |s| {
                    for p in &b.pieces {
                        let k = which.iter().position(|&w| w == p.param).expect("listed");
                        read_elems(s[k], p.offset, &mut send[p.at..p.at + p.len]);
                    }
                })?;
                send[b.len..].fill(0.0);
                Ok(())
            },
            &mut recv,
        )?;
        self.dist.note_comm(stats);
        // Each rank's gradients are the mean over its own rows: their sum is N × the global mean.
        let scale = grad_scale as f64 / self.dist.size() as f64;
        let mut sumsq = [0.0f64];
        for (pieces, chunk) in self.layout.owned.iter().zip(&recv) {
            for p in pieces {
                sumsq[0] += chunk[p.at..p.at + p.len].iter().map(|&g| (g as f64 * scale).powi(2)).sum::<f64>();
            }
        }
        self.dist.comm.all_reduce_sum(&mut sumsq)?;
        self.reduced = Some(recv);
        self.last_norm = sumsq[0].sqrt() as f32;
        Ok(self.last_norm)
    }

    /// One update at learning rate `lr` (gradients times `grad_scale`, clipped to the configured
    /// global norm): exchanges the gradients unless [`ShardedAdamW::exchange`] just did, updates
    /// this rank's shard, all-gathers the parameters into the host store. Zeroing the gradients
    /// is the caller's.
    pub fn step_lr(&mut self, ctx: &Context, params: &[&Param], lr: f32, grad_scale: f32) -> Result<()> {
        let reduced = match self.reduced.take() {
            Some(r) => r,
            None => {
                self.exchange(ctx, params, grad_scale)?;
                self.reduced.take().expect("just exchanged")
            }
        };
        let norm = self.last_norm;
        let c = self.config;
        let clip = c.clip_factor(norm);
        let scale = clip * grad_scale / self.dist.size() as f32;
        self.t += 1;
        let t = self.t;
        let values: Vec<TensorId> = params.iter().map(|p| p.value.id()).collect();
        ctx.pager.sync_to_host(&values)?;
        let (layout, shard_at, mv) = (&self.layout, &self.shard_at, [self.m.id(), self.v.id()]);
        let stats = self.dist.comm.all_gather(
            &layout.chunks(),
            &mut |i, chunk| {
                let owned = &layout.owned[i];
                let mut ids = vec![mv[0], mv[1]];
                ids.extend(owned.iter().map(|p| params[p.param].value.id()));
                ctx.pager.update_host(&ids, &mv, |s| -> Result<()> {
                    let (mvs, ps) = s.split_at_mut(2);
                    let (ms, vs) = mvs.split_at_mut(1);
                    let (mut m, mut v) = (F32sMut::new(ms[0]), F32sMut::new(vs[0]));
                    let updated = owned.iter().enumerate().try_for_each(|(k, p)| {
                        let out = &mut chunk[p.at..p.at + p.len];
                        read_elems(ps[k], p.offset, out);
                        let at = shard_at[i] + p.at;
                        let decay = if params[p.param].value.shape().len() >= 2 { c.weight_decay } else { 0.0 };
                        let g = &reduced[i][p.at..p.at + p.len];
                        let (m, v) = (&mut m.values()[at..at + p.len], &mut v.values()[at..at + p.len]);
                        update_slice(out, m, v, g, &c, lr, decay, scale, t)
                    });
                    m.finish();
                    v.finish();
                    updated
                })??;
                let used: usize = owned.iter().map(|p| p.len).sum();
                chunk[used..].fill(0.0);
                Ok(())
            },
            &mut |i, bucket| {
                let b = &layout.buckets[i];
                let which = b.params();
                let ids: Vec<TensorId> = which.iter().map(|&w| params[w].value.id()).collect();
                ctx.pager.update_host(&ids, &ids, |s| {
                    for p in &b.pieces {
                        let k = which.iter().position(|&w| w == p.param).expect("listed");
                        write_elems(s[k], p.offset, &bucket[p.at..p.at + p.len]);
                    }
                })
            },
        )?;
        self.dist.note_comm(stats);
        ctx.pager.end_step();
        Ok(())
    }

    /// This rank's moments piece by piece, for checkpoints.
    pub fn shard_pieces(&self, ctx: &Context) -> Result<Vec<MomentPiece>> {
        ctx.pager.sync_to_host(&[self.m.id(), self.v.id()])?;
        let (m, v) = (ctx.pager.read_now(self.m.id())?, ctx.pager.read_now(self.v.id())?);
        let mut out = Vec::new();
        for (i, pieces) in self.layout.owned.iter().enumerate() {
            for p in pieces {
                let at = self.shard_at[i] + p.at;
                let (mut pm, mut pv) = (vec![0.0; p.len], vec![0.0; p.len]);
                read_elems(&m, at, &mut pm);
                read_elems(&v, at, &mut pv);
                out.push(MomentPiece { param: p.param, offset: p.offset, m: pm, v: pv });
            }
        }
        Ok(out)
    }

    /// Fills this rank's moments from whole ones (`<param>.exp_avg`, `<param>.exp_avg_sq`, as a
    /// checkpoint holds them, read from `path`), whatever number of ranks wrote them.
    pub fn load_moments(&self, ctx: &Context, params: &[&Param], moments: &TensorFile, path: &Path) -> Result<()> {
        let bad = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
        let mut whole: HashMap<String, Vec<f32>> = HashMap::new();
        let mut get = |name: String, want: &[usize]| -> Result<()> {
            match moments.shape(&name) {
                Some(s) if s == want => {
                    if let std::collections::hash_map::Entry::Vacant(e) = whole.entry(name) {
                        let data = moments.read_f32(e.key())?;
                        e.insert(data);
                    }
                    Ok(())
                }
                Some(s) => Err(bad(format!("tensor `{name}` has shape {s:?}, the model needs {want:?}"))),
                None => Err(bad(format!("missing tensor `{name}`"))),
            }
        };
        for owned in &self.layout.owned {
            for p in owned {
                let (name, shape) = (&params[p.param].name, params[p.param].value.shape());
                get(format!("{name}.exp_avg"), shape)?;
                get(format!("{name}.exp_avg_sq"), shape)?;
            }
        }
        let mv = [self.m.id(), self.v.id()];
        let mut pieces = Vec::new();
        for (i, owned) in self.layout.owned.iter().enumerate() {
            for p in owned {
                let name = &params[p.param].name;
                let (m, v) = (&whole[&format!("{name}.exp_avg")], &whole[&format!("{name}.exp_avg_sq")]);
                pieces.push((self.shard_at[i] + p.at, &m[p.offset..p.offset + p.len], &v[p.offset..p.offset + p.len]));
            }
        }
        ctx.pager.update_host(&mv, &mv, |s| {
            for (at, m, v) in pieces {
                write_elems(s[0], at, m);
                write_elems(s[1], at, v);
            }
        })
    }
}
