//! Criterion benchmark of the host AdamW pass (`optim::adamw_update`) that paged training runs
//! every step when AdamW lives on the host: f32 values and moments, gradients in f16 (as they
//! come down under `--precision f16`) or f32, and the f16 copies of the values written in the
//! same pass. Reports bytes per second: 28 a parameter with f16 gradients and copies, 32 with
//! f32 gradients; and the bets' pass out of place (`optim::adamw_update_from`: values and
//! moments read from one place, the update written to twins), 28 bytes a parameter too. On the
//! H200 machine's 16 cores the pass streams ~120 GB/s, about what a plain read-modify-write
//! reaches there: it is bound by memory, not arithmetic (BENCHMARKS round 20).
//! `cargo bench --bench host_optimizer`; `PAGETRAIN_BENCH_PARAMS` sets the parameter count
//! (default 16 Mi: beyond any cache).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::f16;
use pagetrain::optim::{
    adamw_update, adamw_update_from, worker_threads, AdamWConfig, AdamWSlices, AdamWStep, GradSlice,
};

fn host_adamw(c: &mut Criterion) {
    let n: usize = std::env::var("PAGETRAIN_BENCH_PARAMS").ok().and_then(|v| v.parse().ok()).unwrap_or(16 << 20);
    let (mut p, mut m, mut v) = (vec![0.01f32; n], vec![1e-3f32; n], vec![1e-4f32; n]);
    let (g16, g32, mut half) = (vec![f16::from_f32(0.25); n], vec![0.25f32; n], vec![f16::ZERO; n]);
    // the twins of p, m and v
    let (mut p2, mut m2, mut v2) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let step = AdamWStep { config: AdamWConfig::default(), lr: 3e-4, scale: 1.0, t: 10 };
    let mut group = c.benchmark_group("host adamw");
    group.sample_size(10);
    let mut thread_counts = vec![1, worker_threads()];
    thread_counts.dedup();
    for threads in thread_counts {
        group.throughput(Throughput::Bytes(28 * n as u64));
        group.bench_function(format!("{n} parameters, f16 gradients and copies, {threads} threads, bytes"), |b| {
            b.iter(|| {
                let g = GradSlice::F16 { values: &g16, unscale: 1.0 };
                let t = AdamWSlices { p: &mut p, m: &mut m, v: &mut v, g, decay: 0.1, half: Some(&mut half) };
                adamw_update(vec![t], &step, threads).expect("same lengths")
            })
        });
        group.bench_function(
            format!("{n} parameters, f16 gradients and copies, out of place, {threads} threads, bytes"),
            |b| {
                b.iter(|| {
                    let g = GradSlice::F16 { values: &g16, unscale: 1.0 };
                    let t = AdamWSlices { p: &mut p2, m: &mut m2, v: &mut v2, g, decay: 0.1, half: Some(&mut half) };
                    adamw_update_from(vec![[&p, &m, &v]], vec![t], &step, threads).expect("same lengths")
                })
            },
        );
        group.throughput(Throughput::Bytes(32 * n as u64));
        group.bench_function(format!("{n} parameters, f32 gradients, {threads} threads, bytes"), |b| {
            b.iter(|| {
                let t =
                    AdamWSlices { p: &mut p, m: &mut m, v: &mut v, g: GradSlice::F32(&g32), decay: 0.1, half: None };
                adamw_update(vec![t], &step, threads).expect("same lengths")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, host_adamw);
criterion_main!(benches);
