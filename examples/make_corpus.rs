//! Writes the built-in demo corpus to `assets/corpus.txt`.
//! Run: `cargo run --release --example make_corpus`
use pagetrain::train::corpus;

fn main() -> std::io::Result<()> {
    let text = corpus::generate(corpus::DEMO_SEED, corpus::DEMO_BYTES);
    std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/corpus.txt"), &text)?;
    println!("wrote {} bytes to assets/corpus.txt", text.len());
    Ok(())
}
