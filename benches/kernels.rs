//! Criterion benchmarks of the kernels a training step spends its time in: matmul (f32, and f16
//! on cooperative matrices where the adapter has them), fused attention forward and backward,
//! LayerNorm forward and AdamW. Each reports elements or FLOPs per second; sizes stay small so a
//! CPU adapter (lavapipe) finishes in seconds. `cargo bench --bench kernels`; `pagetrain bench`
//! times the 4096³ products and the training step against PyTorch.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pagetrain::bench::kernels::{buffer, picked, AttentionBuffers};
use pagetrain::kernels::optim::AdamWStep;
use pagetrain::kernels::{attention, layernorm, matmul, optim};
use pagetrain::tensor::DType;
use pagetrain::{Context, ContextOptions};

fn kernels(c: &mut Criterion) {
    let ctx = pollster::block_on(Context::new(&ContextOptions::default())).expect("a GPU adapter");
    let on_cpu = ctx.gpu.info.device_type == wgpu::DeviceType::Cpu;
    let mut group = c.benchmark_group(format!("kernels on {}", ctx.gpu.describe()));
    group.sample_size(10);
    let run = |f: &dyn Fn() -> pagetrain::Result<()>| {
        f().expect("dispatch");
        ctx.sync().expect("sync");
    };
    let dummy = buffer(&ctx, 4, 9, DType::F32);

    let n = if on_cpu { 256 } else { 2048 };
    let g = matmul::Gemm::new(n, n, n);
    group.throughput(Throughput::Elements(2 * (n * n * n) as u64));
    let mut dtypes = vec![DType::F32];
    if ctx.gpu.features.contains(wgpu::Features::SHADER_F16) {
        dtypes.push(DType::F16);
    }
    for dt in dtypes {
        let (a, b, out) = (buffer(&ctx, n * n, 1, dt), buffer(&ctx, n * n, 2, dt), buffer(&ctx, n * n, 3, DType::F32));
        let variant = picked(&ctx, &g, dt);
        group.bench_function(format!("matmul {n}³ {dt:?} ({variant:?}), FLOP"), |bch| {
            bch.iter(|| run(&|| matmul::matmul_variant(&ctx.kernels, variant, &out, &a, &b, None, &dummy, g)))
        });
    }

    let (b, t, h, d) = if on_cpu { (1, 128, 2, 64) } else { (8, 1024, 12, 64) };
    let dims = attention::Dims { b, t, h, d, scale: 1.0 / (d as f32).sqrt() };
    let attn = AttentionBuffers::new(&ctx, dims, DType::F32);
    // causal: half of the T² scores, 2 products of D each (forward), 5 in backward
    let causal_flop = (b * h * t * t * d) as u64 * 2;
    group.throughput(Throughput::Elements(causal_flop));
    group.bench_function(format!("attention forward {b}x{t}x{h}x{d}, FLOP"), |bch| {
        bch.iter(|| run(&|| attention::forward(&ctx.kernels, &attn.out, &attn.lse, &attn.qkv, dims)))
    });
    group.throughput(Throughput::Elements(causal_flop * 5 / 2));
    group.bench_function(format!("attention backward {b}x{t}x{h}x{d}, FLOP"), |bch| {
        bch.iter(|| {
            run(&|| {
                attention::backward(
                    &ctx.kernels,
                    &attn.dqkv,
                    &attn.delta,
                    &attn.qkv,
                    &attn.out,
                    &attn.dout,
                    &attn.lse,
                    dims,
                    true,
                )
            })
        })
    });

    let (rows, cols) = if on_cpu { (256, 768) } else { (8192, 768) };
    let x = buffer(&ctx, rows * cols, 10, DType::F32);
    let (y, w, bias) = (
        buffer(&ctx, rows * cols, 11, DType::F32),
        buffer(&ctx, cols, 12, DType::F32),
        buffer(&ctx, cols, 13, DType::F32),
    );
    let (mean, rstd) = (buffer(&ctx, rows, 14, DType::F32), buffer(&ctx, rows, 15, DType::F32));
    group.throughput(Throughput::Bytes((2 * rows * cols * 4) as u64));
    group.bench_function(format!("layernorm forward {rows}x{cols}, bytes"), |bch| {
        bch.iter(|| run(&|| layernorm::forward(&ctx.kernels, &y, &mean, &rstd, &x, &w, &bias, rows, cols, 1e-5)))
    });

    let params = if on_cpu { 1 << 18 } else { 124 << 20 };
    let (p, m, v, grad) = (
        buffer(&ctx, params, 16, DType::F32),
        buffer(&ctx, params, 17, DType::F32),
        buffer(&ctx, params, 18, DType::F32),
        buffer(&ctx, params, 19, DType::F32),
    );
    let clip = buffer(&ctx, 2, 20, DType::F32);
    let step = AdamWStep { lr: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, t: 1, grad_scale: 1.0 };
    // reads param, m, v, grad and writes param, m, v
    group.throughput(Throughput::Bytes((7 * params * 4) as u64));
    group.bench_function(format!("adamw {params} parameters, bytes"), |bch| {
        bch.iter(|| run(&|| optim::adamw(&ctx.kernels, &p, &m, &v, &grad, &clip, None, params, step)))
    });
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
