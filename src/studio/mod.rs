//! The studio: panels that show a training run as it happens — where every tensor is (GPU, host
//! RAM, disk), what the bus and the pager are doing, the loss — and controls to set a run up and
//! steer it. The panels draw from a [`Dashboard`] folded from [`Event`]s, so the desktop app (a
//! run on its own thread, [`native`]) and a browser demo drive the same code.

mod app;
mod dashboard;
mod feed;
mod gauges;
mod map_panel;
mod plots;
mod residency;
mod sample;
mod setup;
mod treemap;

#[cfg(not(target_arch = "wasm32"))]
pub mod native;
#[cfg(not(target_arch = "wasm32"))]
mod runner;

pub use app::{Driver, FrameStats, Starter, StudioApp};
pub use dashboard::{Dashboard, Level, Marker, MarkerKind, RunStatus};
pub use feed::{check_budget, Command, Event, HostMemory, RunInfo, RunSetup, StepInfo, StepStart};
pub use gauges::{bus_text, pool_fraction, pool_text, show as show_gauges};
pub use map_panel::{describe_text, tensor_text, Cell, CellContent, ResidencyMap};
pub use plots::show as show_timelines;
pub use residency::{groups, kind_of, layer_of, location_color, Group, Kind};
#[cfg(not(target_arch = "wasm32"))]
pub use runner::NativeRun;
pub use setup::{Action, SetupPanel};
pub use treemap::squarify;
