//! pagetrain in the browser: the studio's panels (`pagetrain::studio`) drawn by eframe on a
//! canvas, training the small character-level GPT of `web/demo.toml` on WebGPU with the same WGSL
//! kernels, its tensors in the in-memory host store and a GPU budget below its footprint, so the
//! pager evicts and re-uploads every step.
//!
//! Build, serve and test with `web/test.sh`; the page takes `?steps=N`, `?budget=1400KiB`,
//! `?autostart=1` and `?lose_device_after=N` (destroys the GPU device after step N, to show what
//! a lost device looks like).

use pagetrain::context::StoreKind;
use pagetrain::device::DeviceOptions;
use pagetrain::studio::RunSetup;
use pagetrain::train::{parse_bytes, RunFile, TrainConfig};

#[cfg(target_arch = "wasm32")]
mod page;
#[cfg(target_arch = "wasm32")]
mod run;

/// The demo's run file (also trained natively by `web/test.sh` to compare losses).
pub const DEMO_TOML: &str = include_str!("../demo.toml");

/// The demo's run: `web/demo.toml`, then `steps` and `budget` (e.g. `1400KiB`) when given.
pub fn demo_setup(steps: Option<u64>, budget: Option<&str>) -> Result<RunSetup, String> {
    let file = RunFile::parse(DEMO_TOML).map_err(|e| format!("web/demo.toml: {e}"))?;
    let mut train = file.apply(TrainConfig::default()).map_err(|e| format!("web/demo.toml: {e}"))?;
    if let Some(n) = steps {
        train.steps = n;
    }
    let budget =
        budget.or(file.gpu_budget.as_deref()).map(parse_bytes).transpose().map_err(|e| format!("budget: {e}"))?;
    Ok(RunSetup { train, budget, store: StoreKind::Memory, device: DeviceOptions::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_setup_reads_the_run_file_and_takes_overrides() {
        let s = demo_setup(None, None).unwrap();
        assert_eq!(s.budget, Some(1400 << 10));
        assert!(s.train.steps > 0 && s.train.custom_model.is_some());
        let s = demo_setup(Some(5), Some("2MiB")).unwrap();
        assert_eq!((s.train.steps, s.budget), (5, Some(2 << 20)));
        assert!(demo_setup(None, Some("lots")).unwrap_err().contains("budget"));
    }
}

/// The page's entry: checks for WebGPU, then starts the studio's panels on the canvas.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    wasm_bindgen_futures::spawn_local(async {
        if let Err(msg) = open().await {
            page::message(&msg);
            page::report(&serde_json::json!({ "status": "failed", "error": msg }).to_string());
        }
    });
}

#[cfg(target_arch = "wasm32")]
async fn open() -> Result<(), String> {
    use pagetrain::studio::StudioApp;

    if !page::has_webgpu() {
        return Err("This browser has no WebGPU (navigator.gpu is missing), which the demo trains on. \
                    Try a recent Chrome or Edge; in Chromium on Linux start it with --enable-unsafe-webgpu."
            .into());
    }
    let steps = page::param("steps").and_then(|s| s.parse().ok());
    let setup = demo_setup(steps, page::param("budget").as_deref())?;
    let autostart = page::param("autostart").is_some_and(|v| v != "0");
    let lose_device_after = page::param("lose_device_after").and_then(|s| s.parse().ok());
    let canvas = page::canvas("pagetrain-canvas")?;
    let first = setup.clone();
    eframe::WebRunner::new()
        .start(
            canvas,
            eframe::WebOptions::default(),
            Box::new(move |cc| {
                let starter = Box::new(move |setup, ui| {
                    Box::new(run::WebRun::start(setup, ui, lose_device_after)) as Box<dyn pagetrain::studio::Driver>
                });
                let mut app = StudioApp::new(&first, starter);
                if autostart {
                    app.start(first.clone(), &cc.egui_ctx);
                }
                Ok(Box::new(app))
            }),
        )
        .await
        .map_err(|e| format!("the page could not draw on WebGPU: {e:?}"))
}
