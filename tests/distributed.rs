//! Data parallel over MPI (`--features mpi`; CI runs it on lavapipe): two ranks under
//! `mpirun --oversubscribe -n 2` train the tiny model to the losses of one process with the same
//! effective batch, their checkpoint resumes as one rank and as two, each rank keeps half the
//! optimizer state, and an error on one rank stops both, naming it. mpirun must be installed:
//! without it these tests fail (they do not skip).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-dist-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Finished {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `pagetrain train` with `args`, alone (`ranks` 0) or under mpirun; killed after 5 minutes.
fn train(ranks: usize, args: &[&str]) -> Finished {
    let exe = env!("CARGO_BIN_EXE_pagetrain");
    let mut cmd = if ranks == 0 {
        Command::new(exe)
    } else {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-n", &ranks.to_string(), exe]);
        c
    };
    cmd.arg("train").args(args);
    run(cmd)
}

fn run(mut cmd: Command) -> Finished {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // Open MPI as root in a container: no shared-memory segment size checks to trip over.
    cmd.env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?} ({e}): install openmpi-bin"));
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} still running after 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    Finished {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The tiny model on the demo corpus for 20 steps, a checkpoint at step 10.
fn args<'a>(out: &'a str, batch: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--model",
        "tiny",
        "--steps",
        "20",
        "--batch-size",
        batch,
        "--seq-len",
        "32",
        "--lr",
        "3e-3",
        "--seed",
        "5",
        "--sample-len",
        "0",
        "--optimizer-on",
        "host",
        "--checkpoint-every",
        "10",
        "--store",
        "memory",
        "--json",
        "--out",
        out,
    ];
    a.extend_from_slice(extra);
    a
}

/// The per-step losses in `out/metrics.jsonl`, by step.
fn losses(out: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

fn summary(f: &Finished) -> serde_json::Value {
    let line = f.stdout.lines().last().unwrap_or_else(|| panic!("no JSON line; stderr:\n{}", f.stderr));
    serde_json::from_str(line).unwrap()
}

fn assert_same_losses(what: &str, got: &[(u64, f64)], want: &[(u64, f64)]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.0, w.0, "{what}: steps differ");
        assert!((g.1 - w.1).abs() <= 1e-5, "{what}: step {} loss {} vs {} (all: {got:?} vs {want:?})", g.0, g.1, w.1);
    }
}

#[test]
fn two_ranks_train_resume_and_shard_as_one_process() {
    let root = tmpdir("runs");
    let dir = |n: &str| root.join(n).to_string_lossy().into_owned();
    let (single, two) = (dir("single"), dir("two"));
    let alone = train(0, &args(&single, "8", &[]));
    assert!(alone.ok, "single process failed:\n{}", alone.stderr);
    let pair = train(2, &args(&two, "4", &[]));
    assert!(pair.ok, "mpirun -n 2 failed:\n{}", pair.stderr);
    let want = losses(Path::new(&single));
    assert_eq!(want.len(), 20);
    assert_same_losses("2 ranks × 4 vs 1 process × 8", &losses(Path::new(&two)), &want);

    // Rank 0 alone reported: one summary, one metrics line per step, ranks and communication.
    let s = summary(&pair);
    assert_eq!(s["ranks"], 2);
    assert!(s["comm_per_step"]["comm_bytes"].as_u64().unwrap() > 0, "{s}");
    let metrics = std::fs::read_to_string(Path::new(&two).join("metrics.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    for key in ["comm_bytes", "comm_s", "comm_exposed_s"] {
        assert!(first[key].as_f64().unwrap() > 0.0, "{key} in {first}");
    }
    assert_eq!(pair.stdout.lines().filter(|l| l.starts_with('{')).count(), 1, "{}", pair.stdout);

    // Each rank keeps half the optimizer state of the single process, measured in its host store.
    let full = summary(&alone)["optimizer_state_bytes"].as_u64().unwrap();
    let per_rank: Vec<u64> =
        s["optimizer_state_bytes_per_rank"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(per_rank.len(), 2);
    for b in &per_rank {
        assert!((*b as f64 - full as f64 / 2.0).abs() <= full as f64 * 0.005, "{per_rank:?} vs {full}");
    }

    // The step-10 checkpoint of the pair resumes as one process and as two ranks.
    let ckpt = Path::new(&two).join("step-00000010");
    assert!(ckpt.join("model.safetensors").exists() && ckpt.join("optimizer.shard-001-of-002.safetensors").exists());
    let ckpt = ckpt.to_string_lossy().into_owned();
    let (as_one, as_two) = (dir("as-one"), dir("as-two"));
    let r1 = train(0, &args(&as_one, "8", &["--resume", &ckpt]));
    assert!(r1.ok, "resume as 1 failed:\n{}", r1.stderr);
    let r2 = train(2, &args(&as_two, "4", &["--resume", &ckpt]));
    assert!(r2.ok, "resume as 2 failed:\n{}", r2.stderr);
    assert_same_losses("resumed as 1", &losses(Path::new(&as_one)), &want[10..]);
    assert_same_losses("resumed as 2", &losses(Path::new(&as_two)), &want[10..]);
}

#[test]
fn an_error_on_one_rank_stops_every_rank_and_names_it() {
    let root = tmpdir("error");
    let out = root.join("out").to_string_lossy().into_owned();
    // Rank 1's store directory is a file: only rank 1 fails, at start-up.
    let store = root.join("store");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("rank-1"), b"not a directory").unwrap();
    let mut a = args(&out, "4", &[]);
    let store = store.to_string_lossy().into_owned();
    let at = a.iter().position(|&x| x == "memory").unwrap();
    a[at] = &store;
    let started = Instant::now();
    let f = train(2, &a);
    assert!(!f.ok, "the run succeeded:\n{}", f.stderr);
    assert!(f.stderr.contains("error on rank 1 of 2"), "{}", f.stderr);
    assert!(f.stderr.contains("rank-1"), "{}", f.stderr);
    assert!(started.elapsed() < Duration::from_secs(120), "took {:?} to stop", started.elapsed());
}

#[test]
fn ranks_set_up_differently_stop_before_training() {
    let root = tmpdir("disagree");
    let out = root.join("out").to_string_lossy().into_owned();
    let exe = env!("CARGO_BIN_EXE_pagetrain");
    // One launch, two programs (MPMD): rank 1 asks for another batch size than rank 0.
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", "1", exe, "train"]).args(args(&out, "4", &[]));
    cmd.args([":", "-n", "1", exe, "train"]).args(args(&out, "8", &[]));
    let f = run(cmd);
    assert!(!f.ok, "the run succeeded:\n{}", f.stderr);
    assert!(f.stderr.contains("ranks [1] are set up differently from rank 0"), "{}", f.stderr);
    assert!(!Path::new(&out).join("metrics.jsonl").exists(), "it trained:\n{}", f.stderr);
}
