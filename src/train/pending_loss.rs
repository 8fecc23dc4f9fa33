//! A step's loss on its way back to the host, read when it is wanted instead of inside the step.
//!
//! Each micro-batch's loss is copied into a small mappable buffer right after its backward is
//! recorded; the step is submitted and the buffer mapped without waiting. The training loop
//! reads it after recording the next step, so the GPU never idles while the CPU records, and
//! the reported loss is the same number a read inside the step gave (the same f32 values,
//! summed in the same order).

use futures::channel::oneshot;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// The mean loss of one optimizer step, known or still on the GPU.
pub struct StepLoss {
    /// The step the loss belongs to (0-based: the trainer's step before it was taken).
    pub step: u64,
    state: State,
}

enum State {
    Known(f32),
    Pending(PendingLosses),
}

/// Micro-batch losses copied into one `MAP_READ` buffer.
pub struct PendingLosses {
    buffer: wgpu::Buffer,
    count: usize,
    recorded: usize,
    map: Option<(oneshot::Receiver<MapResult>, Option<wgpu::SubmissionIndex>)>,
}

impl PendingLosses {
    pub fn new(ctx: &Context, count: usize) -> Self {
        let buffer = ctx.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step losses"),
            size: (count.max(1) * 4).div_ceil(8) as u64 * 8,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        PendingLosses { buffer, count, recorded: 0, map: None }
    }

    /// Records the copy of the next micro-batch's loss (an f32 scalar).
    pub fn push(&mut self, ctx: &Context, loss: &Tensor) -> Result<()> {
        if loss.dtype() != DType::F32 || loss.len() != 1 {
            return Err(Error::invalid("loss", format!("{loss:?} is not an f32 scalar")));
        }
        if self.recorded >= self.count || self.map.is_some() {
            return Err(Error::invalid("loss", "more micro-batch losses than the step has"));
        }
        let _op = ctx.op();
        let view = ctx.read(loss)?;
        let at = self.recorded as u64 * 4;
        ctx.recorder.record(|enc| enc.copy_buffer_to_buffer(&view.buffer, view.offset, &self.buffer, at, 4));
        self.recorded += 1;
        Ok(())
    }

    /// Submits what is recorded and asks for the buffer to be mapped (no waiting).
    pub fn submit(&mut self, ctx: &Context) {
        let index = ctx.recorder.flush();
        let (tx, rx) = oneshot::channel();
        self.buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.map = Some((rx, index));
    }

    /// The mean of the losses (waits for the submission that carries them, not for later ones).
    pub async fn mean(mut self, ctx: &Context) -> Result<f32> {
        if self.map.is_none() {
            self.submit(ctx);
        }
        let (rx, index) = self.map.take().expect("submitted above");
        ctx.recorder.wait(index)?;
        let mapped =
            rx.await.map_err(|_| Error::Gpu { context: "loss readback".into(), msg: "map callback dropped".into() })?;
        mapped.map_err(|e| Error::Gpu { context: "loss readback".into(), msg: e.to_string() })?;
        let values: Vec<f32> = {
            let range = self
                .buffer
                .get_mapped_range(..)
                .map_err(|e| Error::Gpu { context: "loss readback".into(), msg: e.to_string() })?;
            bytemuck::pod_collect_to_vec(&range[..self.recorded * 4])
        };
        self.buffer.unmap();
        if self.recorded != self.count {
            return Err(Error::invalid(
                "loss",
                format!("{} of {} micro-batch losses recorded", self.recorded, self.count),
            ));
        }
        let mut total = 0.0f32;
        for v in values {
            total += v;
        }
        Ok(total / self.count as f32)
    }
}

impl StepLoss {
    pub fn known(step: u64, loss: f32) -> Self {
        StepLoss { step, state: State::Known(loss) }
    }

    pub fn pending(step: u64, losses: PendingLosses) -> Self {
        StepLoss { step, state: State::Pending(losses) }
    }

    /// Submits the step's work and starts the loss on its way back (no waiting).
    pub fn submit(&mut self, ctx: &Context) {
        if let State::Pending(p) = &mut self.state {
            p.submit(ctx);
        }
    }

    /// The step's mean loss (waits for its GPU work); an error when it is not finite.
    pub async fn get(self, ctx: &Context) -> Result<f32> {
        let loss = match self.state {
            State::Known(l) => l,
            State::Pending(p) => p.mean(ctx).await?,
        };
        if !loss.is_finite() {
            return Err(Error::invalid("training", format!("loss became {loss} at step {}", self.step)));
        }
        Ok(loss)
    }
}
