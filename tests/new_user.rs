//! A new user's path: `pagetrain prepare` writes an llm.c token file of GPT-2 BPE ids that decode
//! back to the text (bad text is an error naming where); a run configured by a TOML file trains
//! on it, samples text (not ids), logs metrics as JSON lines and leaves its effective
//! configuration beside the checkpoint, which `--config` reads back; `generate` continues a
//! prompt from the checkpoint.

use std::path::PathBuf;
use std::process::Command;

use pagetrain::train::prepare::gpt2_token_file;
use pagetrain::train::{Dataset, Vocab};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagetrain-tok-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Text that crosses chunk boundaries: more than the 4 MiB prepare encodes at a time.
fn long_text() -> String {
    let para = "The pager keeps the GPU as a cache — naïve, café, 東京.\n\nIt moves tensors.\n";
    para.repeat((5 << 20) / para.len() + 1)
}

#[test]
fn prepared_token_files_decode_to_their_text() {
    let d = dir("roundtrip");
    let (txt, bin) = (d.join("in.txt"), d.join("out.bin"));
    let text = long_text();
    std::fs::write(&txt, &text).unwrap();
    let mut calls = Vec::new();
    let n = gpt2_token_file(&txt, &bin, &mut |done, total| calls.push((done, total))).unwrap();
    assert!(calls.len() >= 2 && calls.last() == Some(&(text.len() as u64, text.len() as u64)), "{calls:?}");
    let bytes = std::fs::read(&bin).unwrap();
    let header: Vec<i32> = bytes[..12].chunks(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(header, vec![20240520, 1, n as i32]);
    assert_eq!(bytes.len(), 1024 + 2 * n as usize);
    assert!(!d.join("out.bin.partial").exists());
    let data = Dataset::open(&bin, None).unwrap();
    assert_eq!(data.vocab, Vocab::Gpt2, "token files default to GPT-2's BPE");
    let ids: Vec<u32> = bytes[1024..].chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32).collect();
    assert_eq!(data.vocab.decode(&ids), text);
}

#[test]
fn bad_text_is_an_error_naming_where() {
    let d = dir("bad");
    let txt = d.join("latin1.txt");
    let mut bytes = b"fine so far\n".repeat(10);
    bytes.extend_from_slice(b"caf\xe9\n");
    std::fs::write(&txt, &bytes).unwrap();
    let err = gpt2_token_file(&txt, &d.join("x.bin"), &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("latin1.txt") && err.contains("not UTF-8") && err.contains("byte 123"), "{err}");
    assert!(!d.join("x.bin").exists(), "nothing half-written is left under the output's name");
    let empty = d.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let err = gpt2_token_file(&empty, &d.join("y.bin"), &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("empty.txt") && err.contains("no text"), "{err}");
}

#[test]
fn prepare_then_train_from_a_config_file() {
    let d = dir("cli");
    let (txt, bin) = (d.join("story.txt"), d.join("story.bin"));
    std::fs::write(&txt, "Once upon a time the cat sat on the mat and looked at the moon.\n".repeat(200)).unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_pagetrain")).args(args).output().expect("run pagetrain");
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    run(&["prepare", txt.to_str().unwrap(), "-o", bin.to_str().unwrap()]);
    let out = d.join("run");
    let config = d.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "data = {:?}\nout = {:?}\nsteps = 3\nbatch_size = 2\nseq_len = 16\nn_layer = 1\nn_head = 2\n\
             n_embd = 32\nblock_size = 16\nlr = 0.002\nmin_lr = 0.0001\nwarmup_steps = 1\neval_every = 2\n\
             eval_batches = 1\nsample_len = 12\nsample_prompt = \"Once upon\"\nstore = \"memory\"\n\
             gpu_budget = \"64MiB\"\n",
            bin.to_str().unwrap(),
            out.to_str().unwrap()
        ),
    )
    .unwrap();
    // A flag overrides the file: 4 steps, not 3.
    let json = run(&["train", "--config", config.to_str().unwrap(), "--steps", "4", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["steps"], 4);
    assert_eq!(v["budget_bytes"], 64 << 20);
    let sample = v["sample"].as_str().unwrap();
    assert!(sample.starts_with("Once upon") && sample.len() > 9, "{sample:?}");
    assert!(!sample.contains("<1") && !sample.contains("<2"), "ids, not text: {sample:?}");
    // `generate` from the checkpoint draws the same 12 tokens (same seed, same sampling).
    let gen = run(&["generate", out.to_str().unwrap(), "--prompt", "Once upon", "--max-tokens", "12", "--json"]);
    let g: serde_json::Value = serde_json::from_str(gen.trim()).unwrap();
    assert_eq!(g["tokens"].as_array().map(|t| t.len()), Some(12), "{g}");
    assert_eq!(format!("Once upon{}", g["text"].as_str().unwrap()), sample, "{g}");
    let streamed = run(&["generate", out.to_str().unwrap(), "--prompt", "Once upon", "--max-tokens", "12"]);
    assert_eq!(streamed.trim_end_matches('\n'), sample, "streamed text");
    // n_embd 32, 2 heads, 1 layer over GPT-2's vocabulary: the custom size was used.
    let c = 32usize;
    let want = 50257 * c + 16 * c + (4 * c + c * 3 * c + 3 * c + c * c + c + c * 4 * c + 4 * c + 4 * c * c + c) + 2 * c;
    assert_eq!(v["params"].as_u64(), Some(want as u64));
    // The metrics log: a line per step and per evaluation.
    let log = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<u64> =
        lines.iter().filter(|l| l.get("loss").is_some()).map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![1, 2, 3, 4]);
    assert!(lines.iter().all(|l| l["step"].as_u64().is_some()));
    assert_eq!(lines.iter().filter(|l| l.get("val_loss").is_some()).count(), 2, "{log}"); // step 2 and the end
    let first = &lines[0];
    for key in ["lr", "tokens_per_s", "bytes_uploaded", "bytes_written_back", "stall_s"] {
        assert!(first[key].is_number(), "{key} missing: {first}");
    }
    // The effective configuration beside the checkpoint reproduces the run.
    let effective = std::fs::read_to_string(out.join("latest").join("run.toml")).unwrap();
    assert!(effective.contains("steps = 4") && effective.contains("n_embd = 32"), "{effective}");
    let again = d.join("again");
    let json = run(&[
        "train",
        "--config",
        out.join("latest").join("run.toml").to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
        "--json",
    ]);
    let w: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(w["final_train_loss"], v["final_train_loss"], "the same run again");
    // The same text file trained with --tokenizer gpt2 directly.
    let json = run(&[
        "train",
        "--data",
        txt.to_str().unwrap(),
        "--tokenizer",
        "gpt2",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--sample-len",
        "0",
        "--json",
        "--out",
        d.join("run2").to_str().unwrap(),
        "--store",
        "memory",
    ]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert!(v["final_train_loss"].as_f64().unwrap() > 5.0, "a 50257-way model starts near ln(50257): {v}");
}

#[test]
fn a_bad_config_file_names_the_key() {
    let d = dir("badcfg");
    let config = d.join("run.toml");
    std::fs::write(&config, "steps = 3\nbatch_sise = 2\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_pagetrain"))
        .args(["train", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("run.toml") && err.contains("batch_sise"), "{err}");
}

#[test]
fn a_separate_validation_file() {
    let d = dir("val");
    let (train, val, odd) = (d.join("train.txt"), d.join("val.txt"), d.join("odd.txt"));
    std::fs::write(&train, "the cat sat on the mat. ".repeat(40)).unwrap();
    std::fs::write(&val, "the mat sat on the cat. ".repeat(10)).unwrap();
    std::fs::write(&odd, "zebra quiz ".repeat(10)).unwrap();
    let data = Dataset::open(&train, None).unwrap();
    let all = data.len();
    let val_data = Dataset::open(&val, Some(data.vocab.clone())).unwrap();
    let data = data.with_validation(val_data).unwrap();
    use pagetrain::train::Split;
    assert_eq!((data.split_len(Split::Train), data.split_len(Split::Val)), (all, 240), "all of train trains");
    let mut rng = pagetrain::rng::Rng::new(5);
    let (x, _) = data.batch(Split::Val, &mut rng, 3, 8).unwrap();
    let text = data.vocab.decode(&x);
    assert!(text.contains("mat sat") || text.contains("sat on the c") || text.contains("the cat. "), "{text}");
    // Characters the training data lacks cannot be validated on.
    let o = Command::new(env!("CARGO_BIN_EXE_pagetrain"))
        .args(["train", "--data", train.to_str().unwrap(), "--val-data", odd.to_str().unwrap(), "--steps", "1"])
        .args(["--out", d.join("run").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("odd.txt") && err.contains("'z'"), "{err}");
}
