//! The sharded optimizer without MPI: one rank ([`Solo`]) with buckets much smaller than the
//! parameters (so parameters straddle buckets) must train exactly as AdamW on the host, and its
//! checkpoint (a shard file per rank) must resume as a plain single-process run.
//! The N-rank runs over MPI are in tests/distributed.rs (`--features mpi`).

mod common;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use common::ctx;
use pagetrain::dist::{shard_files, Dist, Solo};
use pagetrain::train::{checkpoint, OptimizerOn, TrainConfig, Trainer};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-sharded-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cfg(out: &Path) -> TrainConfig {
    TrainConfig {
        steps: 6,
        batch_size: 4,
        seq_len: 16,
        lr: 3e-3,
        warmup_steps: 2,
        sample_len: 0,
        eval_batches: 1,
        out: out.to_path_buf(),
        seed: 11,
        optimizer_on: OptimizerOn::Host,
        ..Default::default()
    }
}

fn solo(bucket_values: usize) -> Rc<Dist> {
    let mut d = Dist::new(Box::new(Solo), 0);
    d.bucket_values = bucket_values;
    Rc::new(d)
}

fn losses(t: &mut Trainer, ctx: &pagetrain::Context, n: usize) -> Vec<f32> {
    (0..n).map(|_| pollster::block_on(t.train_step(ctx)).unwrap()).collect()
}

#[test]
fn one_sharded_rank_trains_as_host_adamw_bit_for_bit() {
    let ctx = ctx();
    let (a, b) = (tmpdir("host"), tmpdir("solo"));
    let host = losses(&mut Trainer::new(&ctx, cfg(&a), None).unwrap(), &ctx, 6);
    let mut sharded = Trainer::with_dist(&ctx, cfg(&b), None, Some(solo(1000))).unwrap();
    assert_eq!(sharded.opt.name(), "host, sharded over ranks");
    let got = losses(&mut sharded, &ctx, 6);
    println!("host {host:?}\nsharded {got:?}");
    assert_eq!(got, host);
    // Same state bytes as the host optimizer's (one rank owns everything).
    let full = Trainer::new(&ctx, cfg(&a), None).unwrap().opt.state_bytes(&ctx);
    assert_eq!(sharded.opt.state_bytes(&ctx), full);
}

#[test]
fn a_sharded_checkpoint_resumes_in_a_single_process_and_merges() {
    let ctx = ctx();
    let (a, b) = (tmpdir("straight"), tmpdir("ckpt"));
    let straight = losses(&mut Trainer::new(&ctx, cfg(&a), None).unwrap(), &ctx, 6);
    let mut first = Trainer::with_dist(&ctx, cfg(&b), None, Some(solo(777))).unwrap();
    losses(&mut first, &ctx, 3);
    let saved = pollster::block_on(first.save(&ctx, &b)).unwrap();
    assert!(saved.join(shard_files::shard_file(0, 1)).exists());
    assert!(!saved.join(checkpoint::OPTIMIZER_FILE).exists());
    drop(first);
    // Resumed as a plain process on the GPU optimizer, and as a sharded rank with other buckets.
    for (i, dist) in [None, Some(solo(50_000))].into_iter().enumerate() {
        let out = tmpdir(&format!("resumed{i}"));
        let c = TrainConfig { resume: Some(b.clone()), out, optimizer_on: OptimizerOn::Gpu, ..cfg(&b) };
        let mut resumed = Trainer::with_dist(&ctx, c, None, dist).unwrap();
        assert_eq!(resumed.step, 3);
        let rest = losses(&mut resumed, &ctx, 3);
        for (g, w) in rest.iter().zip(&straight[3..]) {
            assert!((g - w).abs() <= 1e-5, "resumed {rest:?} vs straight {:?}", &straight[3..]);
        }
    }
    // merge-shards writes the usual optimizer file, equal to what the shards hold.
    let merged = shard_files::merge(&b).unwrap();
    let from_shards = checkpoint::load(&b).unwrap().optimizer.unwrap();
    std::fs::remove_file(saved.join(shard_files::shard_file(0, 1))).unwrap();
    let from_merged = checkpoint::load(&b).unwrap().optimizer.unwrap();
    assert!(merged.exists());
    assert_eq!(from_shards.1, from_merged.1);
    assert_eq!(from_shards.0.len(), from_merged.0.len());
    for k in from_shards.0.names() {
        assert_eq!(from_shards.0.read_f32(k).unwrap(), from_merged.0.read_f32(k).unwrap(), "{k}");
    }
}

#[test]
fn missing_or_torn_shards_are_errors_naming_the_checkpoint() {
    let ctx = ctx();
    let b = tmpdir("torn");
    let mut t = Trainer::with_dist(&ctx, cfg(&b), None, Some(solo(1000))).unwrap();
    losses(&mut t, &ctx, 1);
    let saved = pollster::block_on(t.save(&ctx, &b)).unwrap();
    // A second shard file of another world size: the set is incomplete.
    std::fs::copy(saved.join(shard_files::shard_file(0, 1)), saved.join(shard_files::shard_file(1, 2))).unwrap();
    let err = checkpoint::load(&b).err().expect("an error").to_string();
    assert!(err.contains("shards incomplete"), "{err}");
    std::fs::remove_file(saved.join(shard_files::shard_file(1, 2))).unwrap();
    // A shard of another step.
    losses(&mut t, &ctx, 1);
    let next = pollster::block_on(t.save(&ctx, &tmpdir("torn-next"))).unwrap();
    std::fs::copy(next.join(shard_files::shard_file(0, 1)), saved.join(shard_files::shard_file(0, 1))).unwrap();
    let err = checkpoint::load(&b).err().expect("an error").to_string();
    assert!(err.contains("torn checkpoint") && err.contains(&shard_files::shard_file(0, 1)), "{err}");
}
