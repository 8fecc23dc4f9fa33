//! The training loop of a whole run: steps (each loss read once the next step is recorded, so
//! the GPU never waits on the host), metrics, periodic evaluation and checkpoints, the final
//! evaluation, sample and checkpoint, and the run's summary.

use super::checkpoint;
use super::pending_loss::StepLoss;
use super::report::{Reporter, RunSummary, StepReport};
use super::trainer::Trainer;
use crate::context::Context;
use crate::error::Result;
use crate::nn::Module;

impl Trainer {
    /// Trains to `cfg.steps`, evaluates, samples, saves to `cfg.out` (checked to be writable
    /// first, so a bad `--out` fails before the work, not after it); returns the summary.
    pub async fn run(&mut self, ctx: &Context, reporter: &mut dyn Reporter) -> Result<RunSummary> {
        checkpoint::check_writable(&self.cfg.out)?;
        reporter.on_start(self);
        self.start_prefetch();
        let tokens_per_step = (self.global_batch() * self.cfg.seq_len) as f64;
        let mut losses = Vec::new();
        let start = std::time::Instant::now();
        let first_step = self.step;
        // Ranks other than the lead share its --out: they write no metrics and do not evaluate.
        let lead = self.is_lead();
        let mut metrics = super::metrics::MetricsLog::open_if(lead, &self.cfg.out)?;
        let mut comm_total = crate::dist::CommStats::default();
        // A step's loss is read after the next step is recorded (the GPU works on one while the
        // CPU records the other); evaluations and checkpoints read it first.
        let mut recorded: Option<super::metrics::StepLine> = None;
        let mut pending: Option<StepLoss> = None;
        let mut last_done = std::time::Instant::now();
        let mut first_step_s = None;
        while self.step < self.cfg.steps {
            let before = ctx.pager.counters();
            let loss = self.train_step_pending(ctx).await?;
            if first_step_s.is_none() {
                // The GPU's work counts: wait for it once, after the first step.
                ctx.sync()?;
                let c = ctx.kernels.creation();
                crate::clock::startup_phase(&format!(
                    "first step done ({} shader modules in {:.3} s, {} pipelines in {:.3} s, {:.3} s waiting for workers)",
                    c.modules, c.module_s, c.pipelines, c.pipeline_s, c.pipeline_wait_s
                ));
                first_step_s = Some(crate::clock::since_process_start());
            }
            let after = ctx.pager.counters();
            let comm = self.dist.as_ref().map(|d| d.take_comm());
            comm_total.add(comm.unwrap_or_default());
            let line = super::metrics::StepLine {
                step: self.step,
                loss: f32::NAN,
                lr: self.cfg.lr_at(self.step - 1),
                tokens_per_s: 0.0,
                bytes_uploaded: after.bytes_uploaded - before.bytes_uploaded,
                bytes_written_back: after.bytes_written_back - before.bytes_written_back,
                stall_s: after.stall_s - before.stall_s,
                micro_batch: self.micro_batch,
                comm,
            };
            ctx.pager.publish();
            let boundary = (self.cfg.eval_every > 0 && self.step.is_multiple_of(self.cfg.eval_every))
                || (self.cfg.checkpoint_every > 0 && self.step.is_multiple_of(self.cfg.checkpoint_every))
                || self.step >= self.cfg.steps;
            let mut ready: Vec<(super::metrics::StepLine, StepLoss)> = Vec::new();
            ready.extend(recorded.take().zip(pending.take()));
            if boundary {
                ready.push((line, loss));
            } else {
                (recorded, pending) = (Some(line), Some(loss));
            }
            for (mut line, loss) in ready {
                line.loss = loss.get(ctx).await?;
                let now = std::time::Instant::now();
                line.tokens_per_s = tokens_per_step / (now - last_done).as_secs_f64().max(1e-9);
                last_done = now;
                losses.push(line.loss);
                metrics.step(&line)?;
                let elapsed = start.elapsed().as_secs_f64();
                reporter.on_step(&StepReport {
                    step: line.step,
                    loss: line.loss,
                    lr: line.lr,
                    tokens_per_s: (line.step - first_step) as f64 * tokens_per_step / elapsed.max(1e-9),
                    micro_batch: line.micro_batch,
                });
            }
            if lead
                && self.cfg.eval_every > 0
                && self.step.is_multiple_of(self.cfg.eval_every)
                && self.step < self.cfg.steps
            {
                let v = self.evaluate(ctx).await?;
                metrics.eval(self.step, v)?;
                reporter.on_eval(self.step, v);
            }
            if self.cfg.checkpoint_every > 0
                && self.step.is_multiple_of(self.cfg.checkpoint_every)
                && self.step < self.cfg.steps
            {
                let dir = self.save(ctx, &self.cfg.out.clone()).await?;
                reporter.on_message(&format!("checkpoint written to {}", dir.display()));
            }
        }
        let trained = self.step - first_step;
        let tokens_per_s =
            if trained > 0 { trained as f64 * tokens_per_step / start.elapsed().as_secs_f64() } else { 0.0 };
        if self.micro_batch != self.cfg.batch_size {
            reporter.on_message(&format!(
                "micro-batch shrunk from {} to {} to fit the GPU budget ({} micro-batches per step)",
                self.cfg.batch_size,
                self.micro_batch,
                self.effective_batch() / self.micro_batch
            ));
        }
        let val = if lead { self.evaluate(ctx).await? } else { f32::NAN };
        metrics.eval(self.step, val)?;
        reporter.on_eval(self.step, val);
        let sample = if self.cfg.sample_len > 0 && lead {
            let prompt = self.sample_prompt()?;
            let text = self.sample(ctx, &prompt, self.cfg.sample_len, self.cfg.sampling, self.cfg.seed).await?;
            format!("{}{text}", self.cfg.sample_prompt.as_deref().unwrap_or_default())
        } else {
            String::new()
        };
        let dir = self.save(ctx, &self.cfg.out.clone()).await?;
        reporter.on_message(&format!("checkpoint written to {}", dir.display()));
        let stats = ctx.pager.stats();
        let counters = ctx.pager.counters();
        let optimizer_state_bytes = self.opt.state_bytes(ctx);
        Ok(RunSummary {
            final_train_loss: losses.last().copied().unwrap_or(f32::NAN),
            final_val_loss: val,
            baseline_loss: self.data.unigram_entropy(),
            tokens_per_s,
            steps: self.step,
            params: self.model.num_params(),
            losses,
            sample,
            adapter: ctx.gpu.describe(),
            peak_gpu_bytes: stats.peak_bytes,
            budget_bytes: stats.budget,
            footprint_bytes: ctx.pager.live_bytes().1,
            bytes_uploaded: counters.bytes_uploaded,
            bytes_written_back: counters.bytes_written_back,
            stall_s: counters.stall_s,
            micro_batch: self.micro_batch,
            accum: self.effective_batch() / self.micro_batch,
            optimizer_on: self.opt.name().into(),
            recompute: self.model.recomputes(),
            recompute_choice: self.recompute_decision().map(|d| d.to_string()),
            upload_choice: self.upload_decision().map(|d| d.to_string()),
            recompute_dropped_bytes_per_step: counters.recompute_dropped_bytes / (self.step - first_step).max(1),
            precision: format!("{:?}", self.precision).to_lowercase(),
            loss_scale: self.loss_scale,
            skipped_steps: self.skipped_steps,
            ranks: self.ranks(),
            comm_per_step: comm_total.per_step(self.step - first_step),
            optimizer_state_bytes,
            first_step_s,
            optimizer_state_bytes_per_rank: match &self.dist {
                Some(d) => d.gather_u64(optimizer_state_bytes)?,
                None => vec![optimizer_state_bytes],
            },
        })
    }
}
