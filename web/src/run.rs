//! A run in the browser: one thread, so the run is a future on the page's event loop. Every GPU
//! wait in it is an await (the pager's read-backs and `settle`), it yields to the browser between
//! steps, and it shares its events and the UI's commands through a `RefCell` that is never
//! borrowed across an await. Also writes the JSON report the browser test reads.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use eframe::egui;
use pagetrain::pager::PagerOptions;
use pagetrain::studio::{check_budget, Command, Driver, Event, HostMemory, RunInfo, RunSetup, StepStart};
use pagetrain::train::Trainer;
use pagetrain::{Context, ContextOptions, Error, StoreKind};
use web_time::Instant;

use crate::page;

/// Pager snapshots (a walk over every tensor) at most this often.
const SNAPSHOT_EVERY_S: f64 = 0.25;

#[derive(Default)]
struct Shared {
    events: Vec<Event>,
    commands: VecDeque<Command>,
    ended: bool,
}

/// What the page reports for the browser test.
#[derive(Default, serde::Serialize)]
struct Report {
    status: &'static str,
    adapter: String,
    /// The limits the device got (WebGPU's defaults unless the adapter offers more).
    limits: String,
    steps: u64,
    losses: Vec<f32>,
    uploads: u64,
    evictions: u64,
    writebacks: u64,
    /// Tensors uploaded more than once: evicted, then brought back.
    reuploaded_tensors: usize,
    bytes_uploaded: u64,
    seconds: f64,
    tokens_per_s: f64,
    sample: String,
    error: String,
}

impl Report {
    fn publish(&self) {
        page::report(&serde_json::to_string(self).unwrap_or_default());
    }
}

pub struct WebRun {
    shared: Rc<RefCell<Shared>>,
}

impl WebRun {
    /// Starts `setup` as a future on the page's event loop; `lose_device_after`: destroy the
    /// GPU device after that step (the page's test of a lost device).
    pub fn start(setup: RunSetup, ui: egui::Context, lose_device_after: Option<u64>) -> WebRun {
        let shared = Rc::new(RefCell::new(Shared::default()));
        let run = shared.clone();
        wasm_bindgen_futures::spawn_local(async move {
            let mut report = Report { status: "starting", ..Default::default() };
            report.publish();
            let mut out = Outbox { shared: run.clone(), ui: ui.clone() };
            if let Err(e) = drive(setup, &mut out, &mut report, lose_device_after).await {
                let msg = browser_message(&e);
                report.status = "failed";
                report.error = msg.clone();
                report.publish();
                out.send(Event::Failed(msg));
            }
            run.borrow_mut().ended = true;
            ui.request_repaint();
        });
        WebRun { shared }
    }
}

impl Driver for WebRun {
    fn send(&self, command: Command) {
        self.shared.borrow_mut().commands.push_back(command);
    }

    fn poll(&self) -> Vec<Event> {
        std::mem::take(&mut self.shared.borrow_mut().events)
    }
}

impl Drop for WebRun {
    /// A run replaced by a new one stops at its next step boundary.
    fn drop(&mut self) {
        if !self.shared.borrow().ended {
            self.shared.borrow_mut().commands.push_back(Command::Stop);
        }
    }
}

struct Outbox {
    shared: Rc<RefCell<Shared>>,
    ui: egui::Context,
}

impl Outbox {
    fn send(&mut self, e: Event) {
        self.shared.borrow_mut().events.push(e);
        self.ui.request_repaint();
    }

    fn next_command(&self) -> Option<Command> {
        self.shared.borrow_mut().commands.pop_front()
    }

    fn snapshot(&mut self, step: u64, snapshot: pagetrain::pager::Snapshot) {
        let host = HostMemory::measure(&snapshot);
        self.send(Event::Snapshot { step, snapshot: Box::new(snapshot), host });
    }
}

async fn drive(
    setup: RunSetup,
    out: &mut Outbox,
    report: &mut Report,
    lose_device_after: Option<u64>,
) -> pagetrain::Result<()> {
    if !matches!(setup.store, StoreKind::Memory) {
        return Err(Error::Invalid { what: "store", msg: "the browser has no files: tick \"in memory\"".into() });
    }
    let opts = ContextOptions {
        device: setup.device.clone(),
        pager: PagerOptions::browser(setup.budget),
        store: StoreKind::Memory,
    };
    let ctx = Context::new(&opts).await?;
    let mut trainer = Trainer::new(&ctx, setup.train.clone(), None)?;
    report.adapter = ctx.gpu.describe();
    let l = &ctx.gpu.limits;
    report.limits = format!(
        "storage binding {} MiB, buffer {} MiB, workgroup memory {} KiB, {} invocations",
        l.max_storage_buffer_binding_size >> 20,
        l.max_buffer_size >> 20,
        l.max_compute_workgroup_storage_size >> 10,
        l.max_compute_invocations_per_workgroup
    );
    out.send(Event::Started(RunInfo::of(&ctx, &trainer, &setup.store)));
    out.snapshot(trainer.step, ctx.pager.snapshot());
    let (mut paused, mut done) = (false, trainer.step >= trainer.cfg.steps);
    let mut last_snapshot: Option<Instant> = None;
    let mut ran_s = 0.0;
    report.status = "running";
    report.publish();
    loop {
        if let Some(c) = out.next_command() {
            match c {
                Command::Stop => {
                    out.send(Event::Stopped { step: trainer.step });
                    report.status = "stopped";
                    report.publish();
                    return Ok(());
                }
                Command::Pause => {
                    paused = true;
                    out.send(Event::Paused);
                }
                Command::Resume => {
                    paused = false;
                    out.send(Event::Resumed);
                }
                Command::SetBudget(bytes) => match check_budget(&ctx, bytes) {
                    Ok(()) => {
                        ctx.pager.set_budget(bytes);
                        out.send(Event::Budget { step: trainer.step, bytes });
                        out.snapshot(trainer.step, ctx.pager.snapshot());
                    }
                    Err(msg) => out.send(Event::Error(msg)),
                },
                Command::Save => out.send(Event::Error("the browser has no files to save a checkpoint in".into())),
                Command::Sample { prompt, tokens, temperature, seed } => {
                    match sample(&ctx, &mut trainer, &prompt, tokens, temperature, seed).await {
                        Ok(text) => out.send(Event::Sample(text)),
                        Err(e) => out.send(Event::Error(format!("sampling failed: {e}"))),
                    }
                }
            }
            continue;
        }
        if paused || done {
            page::sleep(50).await;
            continue;
        }

        trainer.want_forward_snapshot = last_snapshot.is_none_or(|t| t.elapsed().as_secs_f64() >= SNAPSHOT_EVERY_S);
        let start = StepStart::take(&ctx, &trainer);
        let clock = Instant::now();
        let loss = match trainer.train_step(&ctx).await {
            Ok(loss) => loss,
            Err(e) => return Err(lost_or(&ctx, e).await),
        };
        // The step boundary: the write-backs of this step land, the staging slots map again.
        if let Err(e) = ctx.pager.settle().await {
            return Err(lost_or(&ctx, e).await);
        }
        let seconds = clock.elapsed().as_secs_f64();
        ran_s += seconds;
        let info = start.info(&ctx, &trainer, loss, seconds, ran_s);
        out.send(Event::Step(info));
        let (after, step) = (ctx.pager.counters(), trainer.step);
        if let Some(snapshot) = trainer.forward_snapshot.take() {
            out.snapshot(step, snapshot);
            last_snapshot = Some(Instant::now());
        }
        report.steps = step;
        report.losses.push(loss);
        report.uploads = after.uploads;
        report.evictions = after.evictions;
        report.writebacks = after.writebacks;
        report.reuploaded_tensors = ctx.pager.snapshot().tensors.iter().filter(|t| t.uploads >= 2).count();
        report.bytes_uploaded = after.bytes_uploaded;
        report.seconds = ran_s;
        report.tokens_per_s = info.tokens_per_s;
        done = step >= trainer.cfg.steps;
        if done {
            let text = sample(&ctx, &mut trainer, "One day", 120, 0.8, 1).await?;
            report.sample = text.clone();
            out.send(Event::Sample(text));
            out.send(Event::Finished { step });
            report.status = "finished";
        }
        report.publish();
        if lose_device_after == Some(step) {
            ctx.gpu.device.destroy();
        }
        // Let the browser draw the new step before the next one starts.
        page::sleep(0).await;
    }
}

/// What the page says about a run that failed: the error and a hint that makes sense in a browser.
fn browser_message(e: &Error) -> String {
    let hint = match e {
        Error::NoAdapter { .. } => {
            let msg = "This browser gives the page no WebGPU adapter, which the demo trains on: WebGPU is off \
                       or not supported here. Try a recent Chrome or Edge; Chromium on Linux needs \
                       --enable-unsafe-webgpu.";
            page::message(msg);
            return msg.to_string();
        }
        Error::DeviceLost { .. } => Some("reload the page to train again"),
        Error::BudgetTooSmall { .. } => Some("raise the GPU budget (type a size in `bytes`) and press Start"),
        e => e.hint(),
    };
    format!("{e}{}", hint.map(|h| format!("\nHINT: {h}")).unwrap_or_default())
}

/// `e`, or the device loss behind it: the browser reports a lost device (`device.lost`) a moment
/// after the first call that fails because of it.
async fn lost_or(ctx: &Context, e: Error) -> Error {
    page::sleep(100).await;
    match ctx.gpu.check("after a failed step") {
        Err(lost @ Error::DeviceLost { .. }) => lost,
        _ => e,
    }
}

async fn sample(
    ctx: &Context,
    trainer: &mut Trainer,
    prompt: &str,
    tokens: usize,
    temperature: f32,
    seed: u64,
) -> pagetrain::Result<String> {
    // An empty prompt starts from the vocabulary's start token.
    let ids = trainer.data.vocab.encode(prompt)?;
    let sampling = pagetrain::train::Sampling { temperature, ..trainer.cfg.sampling };
    let text = trainer.sample(ctx, &ids, tokens, sampling, seed).await?;
    // Sampling reads logits back every token; the last one's transfers end here.
    ctx.pager.settle().await?;
    Ok(text)
}
