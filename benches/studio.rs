//! How long the studio takes to build a frame with GPT-2 small's tensors on the map: the real
//! model and its AdamW state on the host store, the activations of a forward pass alive, and a
//! thousand steps of history on the timelines. `cargo bench --bench studio`. The UI's own work
//! per frame (layout and tessellation, not the GPU's drawing) bounds its frame rate: 30 frames/s
//! leave 33 ms.

use criterion::{criterion_group, criterion_main, Criterion};
use eframe::egui;
use egui_kittest::Harness;
use pagetrain::nn::{Gpt, GptConfig, Module};
use pagetrain::optim::{AdamW, AdamWConfig};
use pagetrain::studio::{Dashboard, Event, HostMemory, RunInfo, RunSetup, StepInfo, StudioApp};
use pagetrain::train::TrainConfig;
use pagetrain::{Context, ContextOptions};

/// A dashboard as a GPT-2 small run shows it after `steps` steps, its map snapshot taken after
/// a forward pass (batch 1 × 8 tokens on whatever adapter is here: lavapipe takes seconds).
fn gpt2_dashboard(steps: u64) -> Dashboard {
    let ctx = pollster::block_on(Context::new(&ContextOptions::default())).expect("a GPU adapter");
    let model = Gpt::new(&ctx, GptConfig::preset("gpt2-124m", 50257).expect("preset"), 1).expect("GPT-2 small");
    let _opt = AdamW::new(&ctx, &model, AdamWConfig::default()).expect("AdamW state");
    let tokens = ctx.from_u32("tokens", &[1, 8], &[464, 3290, 318, 257, 1332, 286, 262, 1110]).expect("tokens");
    let _loss = model.loss(&ctx, &tokens, &[3290, 318, 257, 1332, 286, 262, 1110, 13]).expect("forward");
    let snapshot = ctx.pager.snapshot();
    let mut dash = Dashboard::default();
    let info = RunInfo {
        model: "12 layers, 12 heads, 768 channels, block 1024, vocab 50257".into(),
        params: model.num_params(),
        data: "bench".into(),
        adapter: ctx.gpu.describe(),
        optimizer: "gpu".into(),
        precision: "f32".into(),
        store: "memory".into(),
        first_step: 0,
        last_step: steps,
        tokens_per_step: 8192,
    };
    dash.apply(Event::Started(info));
    for step in 1..=steps {
        let loss = 11.0 - 8.0 * (step as f32 / steps as f32).sqrt();
        let s =
            StepInfo { step, loss, seconds: 0.2, tokens_per_s: 40960.0, bytes_uploaded: 2 << 30, ..Default::default() };
        dash.apply(Event::Step(s));
        if step % 100 == 0 {
            dash.apply(Event::Eval { step, loss });
        }
    }
    let host = HostMemory::measure(&snapshot);
    dash.apply(Event::Snapshot { step: steps, snapshot: Box::new(snapshot), host });
    dash
}

fn frame(c: &mut Criterion) {
    let dash = gpt2_dashboard(1000);
    let tensors = dash.snapshot.as_ref().map_or(0, |s| s.tensors.len());
    let setup =
        RunSetup { train: TrainConfig::default(), budget: None, store: Default::default(), device: Default::default() };
    let mut app = StudioApp::new(&setup, Box::new(|_, _| unreachable!("the bench starts no run")));
    app.dash = dash;
    let mut h = Harness::builder()
        .with_size([1440.0, 900.0])
        .build_ui_state(|ui: &mut egui::Ui, app: &mut StudioApp| app.panels(ui), app);
    h.run();
    let mut group = c.benchmark_group("studio");
    group.sample_size(20);
    group.bench_function(format!("frame, GPT-2 small ({tensors} tensors, 1000 steps)"), |b| b.iter(|| h.step()));
    group.finish();
}

criterion_group!(benches, frame);
criterion_main!(benches);
