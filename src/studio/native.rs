//! The desktop app (`pagetrain studio`): an eframe window over a run on its own thread, and a
//! headless mode for tests and docs that trains N steps in the real window, saves a screenshot
//! of it and exits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eframe::egui;

use super::app::{Driver, StudioApp};
use super::dashboard::RunStatus;
use super::feed::{Command, Event, RunSetup};
use super::runner::{NativeRun, REPAINT_EVERY, REPAINT_EVERY_SOFTWARE};

impl Driver for NativeRun {
    fn send(&self, command: Command) {
        NativeRun::send(self, command)
    }
    fn poll(&self) -> Vec<Event> {
        NativeRun::poll(self)
    }
}

pub struct Options {
    pub setup: RunSetup,
    /// Start the run when the window opens (instead of waiting for the Start button).
    pub start: bool,
    /// Headless mode: after this many steps, save a screenshot here and exit.
    pub screenshot: Option<PathBuf>,
    pub exit_after_steps: u64,
    /// Repaint every frame, to measure the frame rate the UI sustains.
    pub continuous: bool,
}

/// What a headless run saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub frames: u64,
    /// Frames per second over the last frames shown.
    pub fps: Option<f64>,
    pub mean_ui_ms: f64,
    pub slowest_ui_ms: f64,
    pub steps: u64,
    /// Tokens trained over the wall time from the first step on (as `pagetrain train` counts).
    pub tokens_per_s: f64,
    pub screenshot: Option<PathBuf>,
    /// Why the run or the screenshot failed.
    pub error: Option<String>,
}

/// Where the headless mode is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Training,
    /// Asked the run to pause so the picture holds a fresh snapshot.
    Pausing,
    /// Asked for a screenshot at `since` (the `tries`th request); waiting for it to be saved.
    Shooting {
        since: Instant,
        tries: u32,
    },
    Done,
}

/// Opens the window; returns when it closes.
pub fn run(opts: Options) -> Result<Report, String> {
    let report = Arc::new(Mutex::new(Report::default()));
    let native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1440.0, 900.0]).with_title("pagetrain studio"),
        ..Default::default()
    };
    let shared = report.clone();
    eframe::run_native(
        "pagetrain studio",
        native,
        Box::new(move |cc| {
            let software = cc
                .wgpu_render_state
                .as_ref()
                .is_some_and(|r| r.adapter.get_info().device_type == wgpu::DeviceType::Cpu);
            let every = if software { REPAINT_EVERY_SOFTWARE } else { REPAINT_EVERY };
            let starter = Box::new(move |setup, ui: egui::Context| {
                Box::new(NativeRun::start(setup, ui, every)) as Box<dyn Driver>
            });
            let mut app = StudioApp::new(&opts.setup, starter);
            app.continuous = opts.continuous;
            if opts.start || opts.screenshot.is_some() {
                app.start(opts.setup.clone(), &cc.egui_ctx);
            }
            if let Some(path) = opts.screenshot.clone() {
                let device = cc.wgpu_render_state.as_ref().map(|r| r.device.clone());
                install_headless(&mut app, &cc.egui_ctx, path, opts.exit_after_steps.max(1), shared, device);
            }
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| format!("the window could not open: {e}"))?;
    let r = report.lock().map_err(|_| "report poisoned".to_string())?.clone();
    match &r.error {
        Some(e) => Err(e.clone()),
        None => Ok(r),
    }
}

/// A screenshot not saved this long after it was asked for is asked for again, up to
/// `SHOT_TRIES` times; then the headless run fails instead of waiting for ever.
const SHOT_PATIENCE: Duration = Duration::from_secs(30);
const SHOT_TRIES: u32 = 3;

fn install_headless(
    app: &mut StudioApp,
    ui: &egui::Context,
    path: PathBuf,
    steps: u64,
    report: Arc<Mutex<Report>>,
    device: Option<wgpu::Device>,
) {
    let mut phase = Phase::Training;
    let saved: Arc<Mutex<Option<Result<(), String>>>> = Arc::new(Mutex::new(None));
    let (shooting, shot_done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    keep_waking(ui.clone(), device, shooting.clone(), shot_done.clone());
    let request = {
        let (saved, path) = (saved.clone(), path.clone());
        move |ctx: &egui::Context| {
            let (saved, path, waker) = (saved.clone(), path.clone(), ctx.clone());
            ctx.request_screenshot(move |image| {
                *saved.lock().expect("not poisoned") = Some(save_png(&image, &path));
                waker.request_repaint();
            });
            ctx.request_repaint();
        }
    };
    app.set_after_frame(move |app, ctx| match phase {
        Phase::Training => {
            let ended = matches!(app.dash.status, RunStatus::Finished | RunStatus::Failed(_) | RunStatus::Stopped);
            if app.dash.status == RunStatus::Running && app.dash.last_step() >= steps {
                eprintln!("studio: step {} reached; pausing the run", app.dash.last_step());
                app.send(Command::Pause);
                phase = Phase::Pausing;
            } else if ended {
                eprintln!("studio: the run ended at step {}", app.dash.last_step());
                phase = Phase::Pausing;
            }
        }
        Phase::Pausing => {
            if app.dash.status != RunStatus::Running {
                eprintln!("studio: taking the screenshot");
                request(ctx);
                shooting.store(true, Ordering::Relaxed);
                phase = Phase::Shooting { since: Instant::now(), tries: 1 };
            }
        }
        Phase::Shooting { since, tries } => {
            let taken = saved.lock().expect("not poisoned").take();
            let result = match taken {
                Some(result) => result,
                None if since.elapsed() < SHOT_PATIENCE => return,
                None if tries < SHOT_TRIES => {
                    log::warn!("no screenshot {} s after asking; asking again", SHOT_PATIENCE.as_secs());
                    request(ctx);
                    phase = Phase::Shooting { since: Instant::now(), tries: tries + 1 };
                    return;
                }
                None => {
                    Err(format!("the screenshot never arrived ({tries} requests, {} s apart)", SHOT_PATIENCE.as_secs()))
                }
            };
            let mut r = report.lock().expect("not poisoned");
            let f = &app.frames;
            r.frames = f.frames;
            r.fps = f.fps();
            r.mean_ui_ms = f.ui_seconds * 1e3 / f.frames.max(1) as f64;
            r.slowest_ui_ms = f.slowest_ui_s * 1e3;
            r.steps = app.dash.last_step();
            let seconds = app.dash.steps.last().map_or(0.0, |s| s.elapsed_s);
            let tokens = app.dash.info.as_ref().map_or(0, |i| i.tokens_per_step) * app.dash.steps.len() as u64;
            r.tokens_per_s = tokens as f64 / seconds.max(1e-9);
            r.screenshot = Some(path.clone());
            r.error = match (&app.dash.status, result) {
                (RunStatus::Failed(msg), _) => Some(format!("the run failed: {msg}")),
                (_, Err(e)) => Some(e),
                _ => None,
            };
            app.send(Command::Stop);
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            shot_done.store(true, Ordering::Relaxed);
            phase = Phase::Done;
        }
        Phase::Done => {}
    });
}

/// Until `done`, wakes the UI every second, and every 100 ms once `shooting`, polling the
/// window's device. The run's own repaint requests are not enough to finish a headless run:
/// eframe 0.37 drops a request as outdated when two passes ran since it was made (egui runs a
/// second pass whenever a layout changes), and a run that then finishes sends no more. The
/// picture is read back through a buffer mapping, which completes only when the device is
/// polled, and egui polls it only as a side effect of its next submission: a surface that keeps
/// timing out (as under Xvfb) submits nothing. Only once a second while training: on llvmpipe a
/// frame takes ~0.2 s of both cores.
fn keep_waking(ctx: egui::Context, device: Option<wgpu::Device>, shooting: Arc<AtomicBool>, done: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut last_wake = Instant::now();
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if shooting.load(Ordering::Relaxed) {
                if let Some(device) = &device {
                    let _ = device.poll(wgpu::PollType::Poll);
                }
            } else if last_wake.elapsed() < Duration::from_secs(1) {
                continue;
            }
            ctx.request_repaint();
            last_wake = Instant::now();
        }
    });
}

/// Writes the screenshot as PNG; a picture of one or two colours is refused as blank.
fn save_png(image: &egui::ColorImage, path: &std::path::Path) -> Result<(), String> {
    let [w, h] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let mut colours: Vec<[u8; 4]> = image.pixels.iter().step_by(97).map(|c| c.to_array()).collect();
    colours.sort_unstable();
    colours.dedup();
    if colours.len() < 8 {
        return Err(format!("the screenshot ({w}×{h}) is blank: {} colours", colours.len()));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    image::save_buffer(path, &bytes, w as u32, h as u32, image::ColorType::Rgba8)
        .map_err(|e| format!("writing {}: {e}", path.display()))
}
