//! The `pagetrain` binary as a user meets it: the JSON summary, `info`, and errors with hints.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::child::Run;

fn pagetrain(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pagetrain"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run pagetrain")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out_dir(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("pagetrain-cli-{}-{name}", std::process::id()));
    d.to_string_lossy().into_owned()
}

#[test]
fn train_json_reports_the_run() {
    let out = out_dir("json");
    let o = pagetrain(
        &[
            "train",
            "--steps",
            "4",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--sample-len",
            "8",
            "--optimizer-on",
            "host",
            "--delayed-update",
            "1",
            "--json",
            "--out",
            &out,
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("from step 2 each update runs during the next step (delayed)"), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let line = stdout.lines().last().expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    for key in ["final_train_loss", "final_val_loss", "baseline_loss", "tokens_per_s", "steps", "params"] {
        assert!(v.get(key).is_some(), "missing {key} in {line}");
    }
    assert_eq!(v["steps"], 4);
    assert!(v["final_train_loss"].as_f64().unwrap() > 0.0);
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0);
    let latest = std::path::Path::new(&out).join("latest");
    assert!(latest.join("model.safetensors").exists());
    assert!(latest.join("config.json").exists());
}

#[test]
fn paged_f16_runs_ask_for_slabs_and_others_for_buffers() {
    // (zero-copy adapters keep buffers whatever is asked, and say so: the line names slabs then
    // as asked for)
    let pool_line = |precision: &str, budget: Option<&str>| {
        let out = out_dir(&format!("pool-{precision}-{}", budget.is_some()));
        let mut args = vec!["train", "--steps", "1", "--batch-size", "2", "--seq-len", "16", "--sample-len", "0"];
        args.extend(["--precision", precision, "--out", &out]);
        if let Some(b) = budget {
            args.extend(["--gpu-budget", b]);
        }
        let o = pagetrain(&args, &[("PAGETRAIN_GPU_POOL", "")]);
        assert!(o.status.success(), "{}", stderr(&o));
        let err = stderr(&o);
        err.lines().find(|l| l.contains("tensors in")).unwrap_or_else(|| panic!("no pool line in {err}")).to_string()
    };
    let paged_f16 = pool_line("f16", Some("1MiB"));
    assert!(paged_f16.contains("slabs"), "{paged_f16}");
    for (precision, budget) in [("f32", Some("1MiB")), ("f16", None)] {
        let line = pool_line(precision, budget);
        assert!(line.contains("tensors in buffers") && !line.contains("slabs"), "{precision} {budget:?}: {line}");
    }
}

#[test]
fn info_lists_the_chosen_adapter_and_its_limits() {
    let o = pagetrain(&["info"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8(o.stdout).unwrap();
    for needle in ["chosen:", "max storage binding", "shader-f16"] {
        assert!(s.contains(needle), "`{needle}` not in:\n{s}");
    }
}

#[test]
fn no_adapter_is_an_error_with_a_hint() {
    // No DX12 on this platform: wgpu finds nothing.
    let backend = if cfg!(windows) { "metal" } else { "dx12" };
    let o = pagetrain(&["train", "--steps", "1"], &[("WGPU_BACKEND", backend)]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("no GPU adapter"), "{e}");
    assert!(e.contains("HINT:"), "{e}");
}

#[test]
fn bad_flags_are_errors_naming_the_flag() {
    for (args, needle) in [
        (vec!["train", "--lr", "-1"], "--lr"),
        (vec!["train", "--lr", "0"], "--lr"),
        (vec!["train", "--batch-size", "0"], "--batch-size"),
        (vec!["train", "--seq-len", "1000"], "--seq-len 1000"),
        (vec!["train", "--data", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
        (vec!["train", "--resume", "/nonexistent/run"], "/nonexistent/run"),
        (vec!["train", "--gpu-budget", "lots"], "lots"),
    ] {
        let o = pagetrain(&args, &[]);
        assert!(!o.status.success(), "{args:?} succeeded");
        let e = stderr(&o);
        assert!(e.contains(needle), "{args:?}: `{needle}` not in: {e}");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
    }
}

fn train_args<'a>(steps: &'a str, out: &'a str) -> Vec<&'a str> {
    vec!["train", "--steps", steps, "--batch-size", "2", "--seq-len", "16", "--sample-len", "0", "--json", "--out", out]
}

fn final_losses(stdout: &str) -> (f64, f64) {
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a JSON line")).unwrap();
    (v["final_train_loss"].as_f64().unwrap(), v["final_val_loss"].as_f64().unwrap())
}

#[test]
fn a_second_run_on_the_same_out_stops_and_the_first_finishes_with_correct_losses() {
    let (shared, solo) = (out_dir("shared"), out_dir("solo"));
    let args = |out| [train_args("16", out), vec!["--checkpoint-every", "2"]].concat();
    let mut first = Run::start(&args(&shared));
    // The first run is mid-training (14 steps to go) once its first checkpoint is written; the
    // second stops before it opens the adapter, so it cannot come too late.
    first.wait_for("checkpoint written to", Duration::from_secs(120));
    let second = pagetrain(&args(&shared), &[]);
    assert!(!second.status.success(), "a second run on the same --out must not start");
    let e = stderr(&second);
    assert!(e.contains(&format!("in use by process {}", first.child.id())) && e.contains(&shared), "{e}");
    assert!(!e.contains("panicked"), "{e}");

    let (ok, stdout, log) = first.finish();
    assert!(ok, "the first run failed:\n{log}");
    let alone = pagetrain(&args(&solo), &[]);
    assert!(alone.status.success(), "{}", stderr(&alone));
    let want = final_losses(&String::from_utf8_lossy(&alone.stdout));
    assert_eq!(final_losses(&stdout), want, "the first run's losses equal those of the same run alone");
}

#[test]
fn an_out_that_is_a_file_fails_before_training() {
    let dir = out_dir("out-file");
    std::fs::create_dir_all(&dir).unwrap();
    let file = format!("{dir}/file");
    std::fs::write(&file, b"not a directory").unwrap();
    // Many steps with nothing else on disk: a run that only met --out at its checkpoint would
    // train all of them first.
    let mut args = train_args("1000000", &file);
    args.extend(["--store", "memory"]);
    let mut run = Run::start(&args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            run.child.kill().unwrap();
            panic!("still training 60 s after starting with --out {file}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, _, log) = run.finish();
    assert!(!ok);
    assert!(log.contains(&file) && !log.contains("panicked"), "{log}");
}

/// Started by mpirun as one of several ranks, a build without the `mpi` feature refuses to run
/// (N copies of one run would otherwise each train alone).
#[cfg(not(feature = "mpi"))]
#[test]
fn several_mpi_ranks_without_the_mpi_feature_is_an_error() {
    let out = out_dir("no-mpi");
    let o = pagetrain(&["train", "--steps", "1", "--out", &out], &[("OMPI_COMM_WORLD_SIZE", "2")]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("one of 2 MPI ranks") && err.contains("--features mpi"), "{err}");
    assert!(!std::path::Path::new(&out).join("latest").exists(), "it trained: {err}");
}

#[test]
fn profile_times_every_kernel_by_timestamps_without_changing_the_losses() {
    let plain = pagetrain(&train_args("3", &out_dir("unprofiled")), &[]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let start = Instant::now();
    let o = pagetrain(&train_args("3", &out_dir("profiled")), &[("PAGETRAIN_PROFILE", "1")]);
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        final_losses(&String::from_utf8_lossy(&o.stdout)),
        final_losses(&String::from_utf8_lossy(&plain.stdout)),
        "profiling changed the losses"
    );
    // lavapipe (CI) and real Vulkan GPUs write timestamps inside passes; GL falls back to waits
    assert!(err.contains("timed by timestamps; 0 dispatches' timestamps lost"), "{err}");
    // "profile: <entry> <n> dispatches <total> ms <each> ms each"
    let rows: Vec<(String, u64, f64)> = err
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.strip_prefix("profile: ")?.split_whitespace().collect();
            (f.len() == 8 && f[2] == "dispatches")
                .then(|| (f[0].to_string(), f[1].parse().unwrap(), f[3].parse().unwrap()))
        })
        .collect();
    assert!(rows.len() >= 10, "too few kernels profiled: {rows:?}");
    for entry in ["adamw_update", "cross_entropy_forward_rows", "layernorm_forward_rows"] {
        assert!(rows.iter().any(|r| r.0 == entry), "{entry} missing from {rows:?}");
    }
    assert!(rows.iter().all(|r| r.1 > 0 && r.2 > 0.0 && r.2.is_finite()), "{rows:?}");
    let total: f64 = rows.iter().map(|r| r.2).sum();
    assert!(total < wall_ms, "kernels took {total} ms of a {wall_ms} ms run");
}

#[test]
fn tune_keeps_its_choices_for_later_runs_and_a_damaged_file_only_warns() {
    let cache = out_dir("tune-cache");
    let env = [("PAGETRAIN_CACHE_DIR", cache.as_str()), ("RUST_LOG", "pagetrain::kernels::tuned=info")];
    let o = pagetrain(&["tune", "--quick", "--json"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("tune --json prints JSON");
    let written = report["written"].as_str().expect("the file it wrote");
    assert!(written.starts_with(&cache), "{written} not under {cache}");
    let kept = std::fs::read_to_string(written).unwrap();
    let chosen = report["chosen"]["matmul"].as_str().unwrap();
    assert!(kept.contains(&format!("matmul = \"{chosen}\"")), "{kept}");
    assert!(!report["measured"].as_array().unwrap().is_empty());

    let train = |name: &str| {
        let out = out_dir(name);
        pagetrain(&["train", "--steps", "1", "--batch-size", "2", "--seq-len", "16", "--json", "--out", &out], &env)
    };
    let o = train("tuned-run");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("kernel choices from {written}")), "{}", stderr(&o));

    let bench = |env: &[(&str, &str)]| {
        let o = pagetrain(&["bench", "--json", "--tensors", "1", "--tensor-size", "1MiB", "--repeats", "1"], env);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench --json prints JSON");
        v["kernel_choices"].as_str().expect("kernel_choices").to_string()
    };
    assert_eq!(bench(&env), format!("tuned ({written})"));
    assert_eq!(bench(&[env[0], ("PAGETRAIN_TUNED", "0")]), "built-in");

    std::fs::write(written, "matmul = 7\n").unwrap();
    let o = train("damaged-tuned-run");
    assert!(o.status.success(), "a damaged tuned file stopped a run: {}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(written) && err.contains("the built-in kernel choices stay"), "{err}");
}
