//! A run on its own thread (native): the [`Context`] holds `Rc`s, so it is built there; events go
//! to the UI over a channel with a repaint request, commands come back and are applied at step
//! boundaries. The UI never waits on the run.

use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eframe::egui;

use super::feed::{check_budget, Command, Event, HostMemory, RunInfo, RunSetup, StepStart};
use crate::context::{Context, ContextOptions};
use crate::error::Result;
use crate::pager::{GpuPool, PagerOptions};
use crate::train::Trainer;

/// Snapshots walk every tensor (and ask the OS which pages are in RAM): at most this often.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);
/// Repaints asked for by the run: at most this often (the UI has nothing newer to draw) ...
pub const REPAINT_EVERY: Duration = Duration::from_millis(33);
/// ... or this often where the window is drawn in software on the CPU the run trains on
/// (llvmpipe draws a frame of the studio in ~0.2 s of both of 2 cores, and egui draws one more
/// after each change).
pub const REPAINT_EVERY_SOFTWARE: Duration = Duration::from_secs(4);

/// A run on its thread; dropping it stops the run and waits for the thread.
pub struct NativeRun {
    commands: Sender<Command>,
    events: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
}

impl NativeRun {
    /// Starts `setup` on a new thread; the window `ui` is asked to repaint at most every
    /// `repaint_every` while the run sends news.
    pub fn start(setup: RunSetup, ui: egui::Context, repaint_every: Duration) -> NativeRun {
        let (commands, command_rx) = mpsc::channel();
        let (event_tx, events) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("pagetrain-run".into())
            .spawn(move || {
                let mut out = Outbox { events: event_tx, ui, last_repaint: None, repaint_every };
                if let Err(e) = pollster::block_on(drive(setup, &mut out, &command_rx)) {
                    let hint = e.hint().map(|h| format!("\nHINT: {h}")).unwrap_or_default();
                    out.send(Event::Failed(format!("{e}{hint}")));
                }
                out.ui.request_repaint();
            })
            .expect("spawning a thread");
        NativeRun { commands, events, thread: Some(thread) }
    }

    /// Sends a command (ignored when the run has ended).
    pub fn send(&self, c: Command) {
        let _ = self.commands.send(c);
    }

    /// Events since the last call.
    pub fn poll(&self) -> Vec<Event> {
        self.events.try_iter().collect()
    }

    /// Whether the thread has ended.
    pub fn ended(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for NativeRun {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Events to the UI, each followed by a (rate-limited) repaint request.
struct Outbox {
    events: Sender<Event>,
    ui: egui::Context,
    last_repaint: Option<Instant>,
    repaint_every: Duration,
}

impl Outbox {
    fn send(&mut self, e: Event) {
        let _ = self.events.send(e);
        let now = Instant::now();
        match self.last_repaint {
            // Later news within the interval is drawn by one frame at its end.
            Some(t) if now - t < self.repaint_every => self.ui.request_repaint_after(self.repaint_every - (now - t)),
            _ => {
                self.ui.request_repaint();
                self.last_repaint = Some(now);
            }
        }
    }

    fn snapshot(&mut self, ctx: &Context, step: u64) {
        self.send_snapshot(step, ctx.pager.snapshot());
    }

    fn send_snapshot(&mut self, step: u64, snapshot: crate::pager::Snapshot) {
        let host = HostMemory::measure(&snapshot);
        self.send(Event::Snapshot { step, snapshot: Box::new(snapshot), host });
    }
}

async fn drive(setup: RunSetup, out: &mut Outbox, commands: &Receiver<Command>) -> Result<()> {
    let mixed = setup.train.precision == crate::train::Precision::F16;
    let gpu_pool = GpuPool::for_run(mixed, setup.budget.is_some());
    let pager = PagerOptions { budget: setup.budget, gpu_pool, ..Default::default() };
    let opts = ContextOptions { device: setup.device.clone(), pager, store: setup.store.clone() };
    let ctx = Context::new(&opts).await?;
    let mut trainer = Trainer::new(&ctx, setup.train.clone(), None)?;
    let out_dir = trainer.cfg.out.clone();
    // A run whose checkpoints cannot be written fails now, not at its first checkpoint.
    crate::train::checkpoint::check_writable(&out_dir)?;
    out.send(Event::Started(RunInfo::of(&ctx, &trainer, &setup.store)));
    out.snapshot(&ctx, trainer.step);
    trainer.start_prefetch();
    let (mut paused, mut done) = (false, trainer.step >= trainer.cfg.steps);
    let mut last_snapshot: Option<Instant> = None;
    // Wall time of the run so far: from its first step on, pauses left out.
    let (mut running_since, mut ran_before) = (None::<Instant>, Duration::ZERO);
    loop {
        // Commands first: all of them, waiting for one while paused or done.
        let command = if paused || done {
            match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => return Ok(()),
            }
        } else {
            match commands.try_recv() {
                Ok(c) => Some(c),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        };
        if let Some(c) = command {
            match c {
                Command::Stop => {
                    out.send(Event::Stopped { step: trainer.step });
                    return Ok(());
                }
                Command::Pause => {
                    paused = true;
                    ran_before += running_since.take().map_or(Duration::ZERO, |t| t.elapsed());
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
                        out.snapshot(&ctx, trainer.step);
                    }
                    Err(msg) => out.send(Event::Error(msg)),
                },
                Command::Save => match trainer.save(&ctx, &out_dir).await {
                    Ok(dir) => out.send(Event::Checkpoint { step: trainer.step, path: dir.display().to_string() }),
                    Err(e) => out.send(Event::Error(format!("saving failed: {e}"))),
                },
                Command::Sample { prompt, tokens, temperature, seed } => {
                    match sample(&ctx, &mut trainer, &prompt, tokens, temperature, seed).await {
                        Ok(text) => out.send(Event::Sample(text)),
                        Err(e) => out.send(Event::Error(format!("sampling failed: {e}"))),
                    }
                }
            }
            continue;
        }

        // Residency is most telling mid-step, with the activations saved for backward alive.
        trainer.want_forward_snapshot = last_snapshot.is_none_or(|t| t.elapsed() >= SNAPSHOT_EVERY);
        let start = StepStart::take(&ctx, &trainer);
        let clock = Instant::now();
        running_since.get_or_insert(clock);
        let loss = trainer.train_step(&ctx).await?;
        let seconds = clock.elapsed().as_secs_f64();
        let elapsed_s = (ran_before + running_since.map_or(Duration::ZERO, |t| t.elapsed())).as_secs_f64();
        out.send(Event::Step(start.info(&ctx, &trainer, loss, seconds, elapsed_s)));
        let step = trainer.step;
        let cfg = &trainer.cfg;
        done = step >= cfg.steps;
        if cfg.eval_every > 0 && step.is_multiple_of(cfg.eval_every) && !done {
            let loss = trainer.evaluate(&ctx).await?;
            out.send(Event::Eval { step, loss });
        }
        if trainer.cfg.checkpoint_every > 0 && step.is_multiple_of(trainer.cfg.checkpoint_every) && !done {
            match trainer.save(&ctx, &out_dir).await {
                Ok(dir) => out.send(Event::Checkpoint { step, path: dir.display().to_string() }),
                Err(e) => out.send(Event::Error(format!("saving failed: {e}"))),
            }
        }
        if done {
            let loss = trainer.evaluate(&ctx).await?;
            out.send(Event::Eval { step, loss });
            let dir = trainer.save(&ctx, &out_dir).await?;
            out.send(Event::Checkpoint { step, path: dir.display().to_string() });
            out.send(Event::Finished { step });
        }
        if let Some(snapshot) = trainer.forward_snapshot.take() {
            out.send_snapshot(step, snapshot);
            last_snapshot = Some(Instant::now());
        }
    }
}

async fn sample(
    ctx: &Context,
    trainer: &mut Trainer,
    prompt: &str,
    tokens: usize,
    temperature: f32,
    seed: u64,
) -> Result<String> {
    let ids = trainer.data.vocab.encode(prompt)?;
    let sampling = crate::train::Sampling { temperature, ..trainer.cfg.sampling };
    trainer.sample(ctx, &ids, tokens, sampling, seed).await
}
