//! Criterion benchmarks of the pager's transfers, each reported as bytes per second next to its
//! peer: uploads through the staging ring (and the ring in pinned host memory, on Vulkan) vs
//! `queue.write_buffer`, and write-backs through the readback ring. `cargo bench --bench
//! transfers`; `pagetrain bench` prints the same figures, `benches/peers/torch_transfers.py`
//! CUDA's.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pagetrain::bench::{host_tensors, upload_ring, upload_write_buffer, writeback};
use pagetrain::pager::UploadPath;
use pagetrain::{Context, ContextOptions};

const TENSORS: usize = 4;
const BYTES: usize = 16 << 20;

fn transfers(c: &mut Criterion) {
    let ctx = pollster::block_on(Context::new(&ContextOptions::default())).expect("a GPU adapter");
    let tensors = host_tensors(&ctx, TENSORS, BYTES).expect("host tensors");
    let mut group = c.benchmark_group(format!("transfers on {}", ctx.gpu.describe()));
    group.throughput(Throughput::Bytes((TENSORS * BYTES) as u64));
    group.sample_size(10);
    ctx.pager.set_upload_path(UploadPath::Ring);
    group.bench_function("upload: staging ring", |b| b.iter(|| upload_ring(&ctx, &tensors).expect("upload")));
    ctx.pager.set_upload_path(UploadPath::Pinned);
    if ctx.pager.upload_path_kind() == UploadPath::Pinned {
        group.bench_function("upload: pinned host memory (DMA)", |b| {
            b.iter(|| upload_ring(&ctx, &tensors).expect("upload"))
        });
    }
    ctx.pager.set_upload_path(UploadPath::Ring);
    group.bench_function("upload: queue.write_buffer (peer)", |b| {
        b.iter(|| upload_write_buffer(&ctx, TENSORS, BYTES).expect("write_buffer"))
    });
    group.bench_function("write-back: readback ring", |b| b.iter(|| writeback(&ctx, &tensors).expect("write-back")));
    group.finish();
}

criterion_group!(benches, transfers);
criterion_main!(benches);
