//! pagetrain: train neural networks on any GPU through wgpu, including models larger than the
//! GPU's memory.
//!
//! ```no_run
//! use pagetrain::{nn::{Gpt, GptConfig, Module}, optim::{AdamW, AdamWConfig}, Context, ContextOptions};
//! # async fn run() -> pagetrain::Result<()> {
//! let ctx = Context::new(&ContextOptions::default()).await?;
//! let model = Gpt::new(&ctx, GptConfig::preset("tiny", 65)?, 42)?;
//! let mut opt = AdamW::new(&ctx, &model, AdamWConfig::default())?;
//! let (b, t) = (4, 32);
//! let tokens: Vec<u32> = (0..b * t).map(|i| (i % 65) as u32).collect();
//! let targets: Vec<u32> = (0..b * t).map(|i| ((i + 1) % 65) as u32).collect();
//! for _step in 0..10 {
//!     let x = ctx.from_u32("tokens", &[b, t], &tokens)?;
//!     let loss = model.loss(&ctx, &x, &targets)?;
//!     let mut grads = model.grads();
//!     ctx.backward(&loss, &mut grads, 1.0)?;
//!     opt.step(&ctx, &model)?;
//!     model.zero_grad(&ctx);
//!     println!("loss {}", ctx.to_f32(&loss).await?[0]);
//! }
//! # Ok(()) }
//! ```
//!
//! Shapes in docs follow the legend in [`tensor`]: B batch, T time, C channels, H heads,
//! D head size, V vocabulary, N rows, K inner dimension.

pub mod autograd;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
pub mod clock;
pub mod context;
pub mod device;
pub mod dist;
pub mod error;
pub mod kernels;
#[cfg(not(target_arch = "wasm32"))]
pub mod lock;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod pager;
pub mod recorder;
pub mod rng;
#[cfg(feature = "studio")]
pub mod studio;
pub mod tensor;
pub mod train;
#[cfg(vulkan_hal)]
pub mod vulkan_hal;

pub use context::{Context, ContextOptions, StoreKind};
pub use error::{Error, Result};
pub use tensor::{DType, Tensor};
