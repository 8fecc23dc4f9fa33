//! The studio as a person sees it: panels rendered with egui_kittest's wgpu renderer (lavapipe in
//! CI) from a scripted telemetry stream, and real runs on their thread steered from the window.
#![cfg(feature = "studio")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use eframe::egui::{self, Color32, Pos2};
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use pagetrain::pager::{Counters, Location, Snapshot, TensorInfo};
use pagetrain::studio::{
    describe_text, location_color, pool_fraction, squarify, CellContent, Command, Dashboard, Driver, Event, Level,
    MarkerKind, NativeRun, ResidencyMap, RunSetup, RunStatus, StepInfo, StudioApp,
};
use pagetrain::train::TrainConfig;
use pagetrain::StoreKind;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-studio-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tensor(id: u64, name: &str, shape: &[usize], location: Location) -> TensorInfo {
    TensorInfo {
        id,
        name: name.into(),
        bytes: 4 * shape.iter().product::<usize>() as u64,
        location,
        dirty: false,
        in_flight: false,
        shape: shape.to_vec(),
        dtype: "f32",
        uploads: 3,
        last_use: 100 + id,
        next_use: Some(7),
    }
}

fn snapshot(tensors: Vec<TensorInfo>, budget: u64) -> Snapshot {
    let gpu_bytes = tensors.iter().filter(|t| t.location == Location::Gpu).map(|t| t.bytes).sum();
    Snapshot {
        budget,
        gpu_bytes,
        peak_gpu_bytes: gpu_bytes,
        host_bytes: tensors.iter().map(|t| t.bytes).sum(),
        staging_bytes: 16 << 20,
        staging_pinned: false,
        counters: Counters::default(),
        last_step: None,
        tensors,
    }
}

/// Two GPT blocks' parameters, gradients and moments, and `activations` small activations.
fn model_snapshot(activations: usize) -> Snapshot {
    let mut ts = Vec::new();
    let locs = [Location::Gpu, Location::HostRam, Location::Disk, Location::Nowhere];
    for l in 0..2 {
        for (k, (name, shape)) in [("attn.c_attn.weight", [64, 192]), ("mlp.c_fc.weight", [64, 256])].iter().enumerate()
        {
            let p = format!("transformer.h.{l}.{name}");
            for (j, suffix) in ["", ".grad", ".exp_avg", ".exp_avg_sq"].iter().enumerate() {
                let id = ts.len() as u64;
                ts.push(tensor(id, &format!("{p}{suffix}"), shape, locs[(l + k + j) % 4]));
            }
        }
    }
    for i in 0..activations {
        let id = ts.len() as u64;
        let shape = [1 + i % 7, 16];
        ts.push(tensor(id, &format!("transformer.h.{}/matmul", i % 2), &shape, locs[i % 3]));
    }
    snapshot(ts, 8 << 20)
}

type MapState = (ResidencyMap, Snapshot);

fn map_harness(snap: Snapshot) -> Harness<'static, MapState> {
    Harness::builder()
        .with_size([900.0, 600.0])
        .wgpu()
        .build_ui_state(|ui, state: &mut MapState| state.0.show(ui, Some(&state.1)), (ResidencyMap::default(), snap))
}

fn pixel(harness: &mut Harness<'_, MapState>, at: Pos2) -> Color32 {
    let image = harness.render().expect("rendering");
    let ppp = harness.ctx.pixels_per_point();
    let p = image.get_pixel((at.x * ppp) as u32, (at.y * ppp) as u32).0;
    Color32::from_rgba_unmultiplied(p[0], p[1], p[2], p[3])
}

fn near(a: Color32, b: Color32) -> bool {
    a.to_array().iter().zip(b.to_array()).all(|(x, y)| x.abs_diff(y) <= 3)
}

#[test]
fn treemap_layout_holds_on_random_weights() {
    // Unit tests cover the algorithm; here: a layout as big as GPT-2 small's tensor count.
    let area = egui::Rect::from_min_size(Pos2::ZERO, egui::vec2(1200.0, 700.0));
    let weights: Vec<f64> = (0..3000).map(|i| ((i * 2654435761u64) % 100_000 + 1) as f64).collect();
    let rects = squarify(&weights, area);
    let covered: f32 = rects.iter().filter(|r| r.is_positive()).map(|r| r.area()).sum();
    assert!((covered - area.area()).abs() / area.area() < 1e-3, "covered {covered} of {}", area.area());
}

#[test]
fn a_cell_changes_colour_when_its_tensor_moves() {
    let snap = model_snapshot(0);
    let id = snap.tensors.iter().find(|t| t.name == "transformer.h.1.mlp.c_fc.weight").unwrap().id;
    let mut h = map_harness(snap);
    h.run();
    for loc in [Location::Gpu, Location::HostRam, Location::Disk, Location::Remade, Location::Nowhere, Location::Gpu] {
        {
            let (_, snap) = h.state_mut();
            snap.tensors.iter_mut().find(|t| t.id == id).unwrap().location = loc;
        }
        h.run();
        let (map, snap) = h.state();
        let rect = map.cell_of(snap, id).expect("the tensor has a cell").rect;
        let got = pixel(&mut h, rect.center() + egui::vec2(0.0, rect.height() / 4.0));
        assert!(near(got, location_color(loc)), "{loc:?}: pixel {got:?}, want {:?}", location_color(loc));
    }
}

#[test]
fn hover_shows_the_tensor_and_many_small_tensors_aggregate_and_expand() {
    let snap = model_snapshot(3000);
    let mut h = map_harness(snap);
    h.run();
    let (map, snap) = h.state();
    // 3000 activations must not become 3000 cells.
    assert!(map.cells.len() < 200, "{} cells", map.cells.len());
    let weight = snap.tensors.iter().find(|t| t.name == "transformer.h.0.attn.c_attn.weight").unwrap();
    let cell = map.cell_of(snap, weight.id).expect("the weight has its own cell").clone();
    let text = describe_text(&cell, snap);
    for part in [
        "transformer.h.0.attn.c_attn.weight",
        "shape [64, 192]",
        "f32",
        "48.0 KiB",
        "uploads: 3",
        "access 7 of the step",
    ] {
        assert!(text.contains(part), "`{part}` missing from {text}");
    }
    h.hover_at(cell.rect.center());
    h.run();
    h.get_by_label(&text); // the tooltip shows exactly that text

    let (map, _) = h.state();
    let aggregate =
        map.cells.iter().find(|c| matches!(&c.content, CellContent::Aggregate { .. })).expect("an aggregate").clone();
    let CellContent::Aggregate { tensors, by_location, .. } = &aggregate.content else { unreachable!() };
    assert!(tensors.len() > 100, "{} tensors aggregated", tensors.len());
    assert!(by_location.iter().filter(|b| **b > 0).count() >= 2, "the stripes split by location: {by_location:?}");
    h.hover_at(aggregate.rect.center());
    h.run();
    let text = describe_text(&aggregate, &h.state().1);
    assert!(text.contains("small tensors") && text.contains("host RAM:"), "{text}");
    h.get_by_label(&text); // the aggregate's tooltip
    let at = aggregate.rect.center();
    for pressed in [true, false] {
        h.event(egui::Event::PointerButton {
            pos: at,
            button: egui::PointerButton::Primary,
            pressed,
            modifiers: Default::default(),
        });
        h.run();
    }
    let (map, snap) = h.state();
    assert_eq!(map.expanded, Some(aggregate.group.clone()), "a click on the aggregate shows its group");
    let own = map.cells.iter().filter(|c| matches!(c.content, CellContent::Tensor(_))).count();
    assert!(own > 100, "expanded: {own} tensors drawn one by one");
    assert!(map.cells.iter().all(|c| c.group == aggregate.group), "only that group: {:?}", snap.tensors.len());
    h.get_by_label("< all tensors").click();
    h.run();
    assert_eq!(h.state().0.expanded, None);
}

#[test]
fn the_pool_gauge_never_shows_more_than_the_budget() {
    let mut dash = Dashboard::default();
    let mut snap = model_snapshot(10);
    // A scripted stream: the budget is cut, the pool follows at the next step.
    for (budget, gpu) in [(8u64 << 20, 6u64 << 20), (4 << 20, 6 << 20), (4 << 20, 3 << 20), (1 << 20, 1 << 20)] {
        snap.budget = budget;
        snap.gpu_bytes = gpu;
        let f = pool_fraction(&snap);
        assert!((0.0..=1.0).contains(&f), "fraction {f}");
        if gpu <= budget {
            assert!((f as f64 - gpu as f64 / budget as f64).abs() < 1e-6);
        }
        dash.apply(Event::Snapshot { step: 1, snapshot: Box::new(snap.clone()), host: Default::default() });
        let mut h = Harness::builder()
            .with_size([800.0, 200.0])
            .build_ui_state(|ui, d: &mut Dashboard| pagetrain::studio::show_gauges(ui, d), std::mem::take(&mut dash));
        h.run();
        let over = h.query_by_label("over budget").is_some();
        assert_eq!(over, gpu > budget, "budget {budget}, pool {gpu}");
        let text = pagetrain::studio::pool_text(&snap);
        assert!(text.contains(&pagetrain::train::format_bytes(budget)), "{text}");
        dash = h.into_state();
    }
}

#[test]
fn the_bus_gauge_shows_the_last_steps_traffic() {
    let mut dash = Dashboard::default();
    let mut snap = model_snapshot(3);
    snap.last_step = Some(pagetrain::pager::StepTransfers {
        bytes_up: 3 << 30,
        bytes_down: 1 << 30,
        seconds: 0.5,
        exposed_s: 0.125,
        fill_s: 0.0,
    });
    let text = pagetrain::studio::bus_text(&snap);
    assert!(text.contains("3.00 GiB up") && text.contains("1.00 GiB back"), "{text}");
    assert!(text.contains("8.6 GB/s") && text.contains("125 ms"), "(4 GiB in 0.5 s) {text}");
    dash.apply(Event::Snapshot { step: 2, snapshot: Box::new(snap), host: Default::default() });
    let mut h = Harness::builder()
        .with_size([800.0, 200.0])
        .build_ui_state(|ui, d: &mut Dashboard| pagetrain::studio::show_gauges(ui, d), dash);
    h.run();
    assert!(h.query_by_label_contains("GiB up").is_some(), "the gauge is drawn");
}

#[test]
fn an_out_of_memory_shrink_appears_on_the_timeline() {
    let mut dash = Dashboard::default();
    let step = |step, shrinks, skipped| StepInfo {
        step,
        loss: 3.0,
        seconds: 0.1,
        shrinks,
        skipped,
        micro_batch: 4,
        ..Default::default()
    };
    dash.apply(Event::Step(step(1, 0, false)));
    dash.apply(Event::Step(step(2, 1, false)));
    dash.apply(Event::Step(step(3, 0, true)));
    dash.apply(Event::Checkpoint { step: 3, path: "runs/x/step-3".into() });
    dash.apply(Event::Step(step(4, 0, false)));
    dash.apply(Event::Checkpoint { step: 4, path: "runs/x/step-4".into() });
    let said: Vec<&str> = dash.log.iter().map(|(_, line)| line.as_str()).collect();
    assert!(said.contains(&"step 2: out of GPU memory; micro-batch now 4"), "{said:?}");
    let kinds: Vec<(u64, MarkerKind)> = dash.markers.iter().map(|m| (m.step, m.kind)).collect();
    assert_eq!(
        kinds,
        vec![(2, MarkerKind::Shrink), (3, MarkerKind::Skip), (3, MarkerKind::Checkpoint), (4, MarkerKind::Checkpoint)]
    );
    let mut h = Harness::builder()
        .with_size([1000.0, 600.0])
        .wgpu()
        .build_ui_state(|ui, d: &mut Dashboard| pagetrain::studio::show_timelines(ui, d), dash);
    h.run();
    // Each timeline's legend names each kind once, however many markers it has.
    assert_eq!(h.query_all_by_label("micro-batch shrink").count(), 4);
    assert_eq!(h.query_all_by_label("checkpoint").count(), 4);
    h.snapshot("timelines_with_markers");
}

#[test]
fn the_log_says_when_backward_begins_making_values_again() {
    let mut dash = Dashboard::default();
    let step = |step, began_remaking| StepInfo { step, loss: 3.0, seconds: 0.1, began_remaking, ..Default::default() };
    for (n, began) in [(1, false), (2, true), (3, false)] {
        dash.apply(Event::Step(step(n, began)));
    }
    let said: Vec<&str> = dash.log.iter().map(|(_, line)| line.as_str()).filter(|l| l.contains("made again")).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("step 2: evicted to stay in the GPU budget"), "{said:?}");
}

#[test]
fn the_log_says_what_the_recompute_trial_measured_and_kept() {
    let mut dash = Dashboard::default();
    let decided = pagetrain::train::RecomputeDecision { on: true, recomputed_ms: 121.3, kept_ms: 152.4 };
    for (n, recompute_decided) in [(11, None), (12, Some(decided)), (13, None)] {
        dash.apply(Event::Step(StepInfo { step: n, loss: 3.0, seconds: 0.1, recompute_decided, ..Default::default() }));
    }
    let said: Vec<&str> = dash.log.iter().map(|(_, line)| line.as_str()).filter(|l| l.contains("recompute")).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("step 12: recompute on"), "{said:?}");
    assert!(said[0].contains("121.3 ms a step recomputed, 152.4 ms kept"), "{said:?}");
}

#[test]
fn the_log_says_what_the_upload_trial_measured_and_kept() {
    let mut dash = Dashboard::default();
    let decided = pagetrain::train::UploadDecision { pinned: true, pinned_ms: 114.7, ring_ms: 126.3 };
    for (n, upload_decided) in [(20, None), (21, Some(decided)), (22, None)] {
        dash.apply(Event::Step(StepInfo { step: n, loss: 3.0, seconds: 0.1, upload_decided, ..Default::default() }));
    }
    let said: Vec<&str> = dash.log.iter().map(|(_, line)| line.as_str()).filter(|l| l.contains("uploads")).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("step 21: uploads through pinned host memory"), "{said:?}");
    assert!(
        said[0].contains("114.7 ms a step by DMA from pinned memory, 126.3 ms through the staging ring"),
        "{said:?}"
    );
}

#[test]
fn residency_map_snapshot() {
    let mut snap = model_snapshot(400);
    snap.tensors[1].dirty = true;
    snap.tensors[2].in_flight = true;
    let mut h = map_harness(snap);
    h.run();
    h.snapshot("residency_map");
}

// ---- real runs on lavapipe ----

fn tiny_setup(name: &str) -> RunSetup {
    let out = dir(name);
    let train = TrainConfig {
        steps: 4,
        batch_size: 4,
        seq_len: 16,
        eval_batches: 1,
        sample_len: 0,
        out: out.join("run"),
        ..TrainConfig::default()
    };
    RunSetup { train, budget: None, store: StoreKind::Memory, device: Default::default() }
}

/// A run's events as they arrive, read in order.
struct Watch<'a> {
    run: &'a NativeRun,
    seen: Vec<Event>,
    read: usize,
}

impl<'a> Watch<'a> {
    fn new(run: &'a NativeRun) -> Self {
        Watch { run, seen: Vec::new(), read: 0 }
    }

    /// The next event for which `until` holds, or panics after two minutes.
    fn wait_for(&mut self, until: impl Fn(&Event) -> bool) -> Event {
        let t0 = Instant::now();
        loop {
            while self.read < self.seen.len() {
                self.read += 1;
                if until(&self.seen[self.read - 1]) {
                    return self.seen[self.read - 1].clone();
                }
            }
            self.seen.extend(self.run.poll());
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "timed out; saw {:?}",
                self.seen.iter().map(short).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn short(e: &Event) -> String {
    format!("{e:?}").chars().take(120).collect()
}

#[test]
fn a_run_on_its_thread_is_steered_by_commands() {
    let mut setup = tiny_setup("steer");
    setup.train.steps = 1000;
    let run = NativeRun::start(setup, egui::Context::default(), Duration::ZERO);
    let mut w = Watch::new(&run);
    w.wait_for(|e| matches!(e, Event::Step(s) if s.step == 2));
    run.send(Command::Pause);
    w.wait_for(|e| matches!(e, Event::Paused));
    let paused_at = w.seen.iter().filter(|e| matches!(e, Event::Step(_))).count();
    std::thread::sleep(Duration::from_millis(300));
    w.seen.extend(run.poll());
    assert_eq!(w.seen.iter().filter(|e| matches!(e, Event::Step(_))).count(), paused_at, "a paused run takes no steps");
    // A budget below the largest tensor is refused with a message; the run goes on.
    run.send(Command::SetBudget(1024));
    let e = w.wait_for(|e| matches!(e, Event::Error(_) | Event::Budget { .. }));
    let Event::Error(msg) = e else { panic!("a 1 KiB budget was accepted") };
    assert!(msg.contains("below the largest tensor") && msg.contains("transformer.h."), "{msg}");
    run.send(Command::SetBudget(64 << 20));
    w.wait_for(|e| matches!(e, Event::Budget { bytes, .. } if *bytes == 64 << 20));
    let e = w.wait_for(|e| matches!(e, Event::Snapshot { .. }));
    let Event::Snapshot { snapshot, .. } = e else { unreachable!() };
    assert_eq!(snapshot.budget, 64 << 20);
    run.send(Command::Sample { prompt: "One day".into(), tokens: 20, temperature: 0.8, seed: 3 });
    let Event::Sample(text) = w.wait_for(|e| matches!(e, Event::Sample(_))) else { unreachable!() };
    assert_eq!(text.chars().count(), 20, "{text:?}");
    run.send(Command::Save);
    let Event::Checkpoint { path, .. } = w.wait_for(|e| matches!(e, Event::Checkpoint { .. })) else { unreachable!() };
    assert!(PathBuf::from(&path).join("model.safetensors").is_file(), "{path}");
    run.send(Command::Resume);
    w.wait_for(|e| matches!(e, Event::Step(s) if s.step as usize > paused_at + 1));
    run.send(Command::Stop);
    w.wait_for(|e| matches!(e, Event::Stopped { .. }));
    // Mid-step snapshots show the activations saved for backward, named by their layer.
    let activations = w.seen.iter().any(|e| {
        matches!(e, Event::Snapshot { snapshot, .. } if snapshot.tensors.iter().any(|t| t.name.starts_with("transformer.h.1/")))
    });
    assert!(activations, "no snapshot held a block's activations");
}

#[test]
fn bad_input_fails_with_a_message_and_loses_nothing() {
    let d = dir("bad");
    let empty = d.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let mut cases: Vec<(RunSetup, &str)> = Vec::new();
    let mut s = tiny_setup("bad-empty");
    s.train.data = Some(empty.clone());
    cases.push((s, "empty.txt"));
    let mut s = tiny_setup("bad-missing");
    s.train.data = Some(d.join("nope.bin"));
    cases.push((s, "nope.bin"));
    let mut s = tiny_setup("bad-budget");
    s.budget = Some(4096);
    cases.push((s, "budget"));
    let mut s = tiny_setup("bad-adapter");
    s.device.backends = Some(wgpu::Backends::METAL);
    cases.push((s, "adapter"));
    // A checkpoint of another model: trained on a corpus with another alphabet.
    let other = d.join("other.txt");
    std::fs::write(&other, "xyz zyx ".repeat(400)).unwrap();
    let mut s = tiny_setup("bad-other");
    s.train.data = Some(other);
    s.train.steps = 1;
    let run = NativeRun::start(s.clone(), egui::Context::default(), Duration::ZERO);
    Watch::new(&run).wait_for(|e| matches!(e, Event::Finished { .. }));
    drop(run);
    let mut r = tiny_setup("bad-resume");
    r.train.resume = Some(s.train.out.join("latest"));
    cases.push((r, "vocabulary"));
    for (setup, needle) in cases {
        let run = NativeRun::start(setup, egui::Context::default(), Duration::ZERO);
        let Event::Failed(msg) = Watch::new(&run).wait_for(|e| matches!(e, Event::Failed(_) | Event::Step(_))) else {
            panic!("expected a failure about {needle}, it trained")
        };
        assert!(msg.to_lowercase().contains(needle), "`{needle}` not in: {msg}");
        assert!(
            run.ended() || {
                std::thread::sleep(Duration::from_millis(200));
                run.ended()
            },
            "the thread ends"
        );
    }
}

#[derive(Debug)]
struct Dropped(PathBuf);
impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

/// A driver whose run is scripted, for the window's own logic.
struct Scripted(std::sync::mpsc::Receiver<Event>);
impl Driver for Scripted {
    fn send(&self, _: Command) {}
    fn poll(&self) -> Vec<Event> {
        self.0.try_iter().collect()
    }
}

#[test]
fn the_window_shows_a_failure_and_a_fixed_setup_restarts_without_restarting_the_app() {
    let d = dir("window");
    let empty = d.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let mut setup = tiny_setup("window-run");
    setup.train.data = Some(empty.clone());
    let starter = Box::new(|s: RunSetup, ui: egui::Context| {
        Box::new(NativeRun::start(s, ui, Duration::from_millis(33))) as Box<dyn Driver>
    });
    let app = StudioApp::new(&setup, starter);
    let mut h =
        Harness::builder().with_size([1400.0, 900.0]).build_ui_state(|ui, app: &mut StudioApp| app.panels(ui), app);
    h.get_by_label("Start").click();
    let t0 = Instant::now();
    while !matches!(h.state().dash.status, RunStatus::Failed(_)) {
        assert!(t0.elapsed() < Duration::from_secs(120), "no failure shown: {:?}", h.state().dash.status);
        h.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    h.run();
    assert!(h.query_all_by_label_contains("is empty").count() >= 1, "the message is on screen");
    assert_eq!(std::fs::read(&empty).unwrap(), b"", "the data file is untouched");
    // Fix the setup (the built-in corpus) and start again in the same window.
    h.state_mut().setup.data.clear();
    h.run();
    h.get_by_label("Start").click();
    let t0 = Instant::now();
    while h.state().dash.steps.len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(120), "the second run did not train: {:?}", h.state().dash.status);
        h.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(h.state().dash.steps.iter().all(|s| s.loss.is_finite()));
    assert!(
        h.state().dash.log.iter().any(|(l, m)| *l == Level::Error && m.contains("is empty")),
        "the log keeps the error"
    );
    // Let it finish (it saves a checkpoint), stop it, and resume from that checkpoint.
    let wait = |h: &mut Harness<'_, StudioApp>, what: &str, done: &dyn Fn(&StudioApp) -> bool| {
        let t0 = Instant::now();
        while !done(h.state()) {
            assert!(t0.elapsed() < Duration::from_secs(120), "{what}: {:?}", h.state().dash.status);
            h.step();
            std::thread::sleep(Duration::from_millis(20));
        }
        h.run();
    };
    wait(&mut h, "finishing", &|a| a.dash.status == RunStatus::Finished);
    h.get_by_label("Stop").click();
    wait(&mut h, "stopping", &|a| a.dash.status == RunStatus::Stopped);
    h.get_by_label("Resume from the checkpoint of step 4").click();
    h.run();
    assert!(h.state().setup.resume.ends_with("step-00000004"), "{}", h.state().setup.resume);
    h.get_by_label("Start").click();
    wait(&mut h, "resuming", &|a| a.dash.info.as_ref().is_some_and(|i| i.first_step == 4));
}

#[test]
fn dropped_files_become_the_dataset() {
    let (tx, rx) = std::sync::mpsc::channel();
    let setup = tiny_setup("drop");
    let mut starter_rx = Some(rx);
    let starter = Box::new(move |_: RunSetup, _: egui::Context| {
        Box::new(Scripted(starter_rx.take().unwrap())) as Box<dyn Driver>
    });
    let app = StudioApp::new(&setup, starter);
    let mut h =
        Harness::builder().with_size([1400.0, 900.0]).build_ui_state(|ui, app: &mut StudioApp| app.panels(ui), app);
    h.input_mut().dropped_files.push(std::sync::Arc::new(Dropped("/data/tokens.bin".into())));
    h.run();
    assert_eq!(h.state().setup.data, "/data/tokens.bin");
    drop(tx);
}
