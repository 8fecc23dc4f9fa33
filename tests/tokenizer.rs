//! GPT-2's BPE from a new user's side: `pagetrain prepare` writes an llm.c token file whose ids
//! decode back to the text, bad text is an error naming where, and a run on the token file
//! samples text, not ids.

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
fn a_run_on_gpt2_tokens_samples_text() {
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
    let json = run(&[
        "train",
        "--data",
        bin.to_str().unwrap(),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--sample-len",
        "12",
        "--json",
        "--out",
        out.to_str().unwrap(),
        "--store",
        "memory",
    ]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let sample = v["sample"].as_str().unwrap();
    assert!(!sample.is_empty() && !sample.contains("<1") && !sample.contains("<2"), "ids, not text: {sample:?}");
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
