//! Token data: plain text (characters become tokens), nanoGPT-style raw uint16 `.bin` files and
//! llm.c's headered `.bin` files (both memory-mapped), split into train and validation parts.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::rng::Rng;

/// llm.c's token file header: 256 little-endian i32s, [0] magic, [1] version, [2] token count.
pub(crate) const LLMC_MAGIC: i32 = 20240520;
pub(crate) const LLMC_HEADER_BYTES: usize = 256 * 4;
pub use super::tokenizer::GPT2_VOCAB;
use super::tokenizer::{gpt2_decode, gpt2_encode};

/// How tokens map to text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vocab {
    /// Character-level: token i is `chars[i]`.
    Chars(Vec<char>),
    /// GPT-2's byte-level BPE (the default for token files).
    Gpt2,
    /// Token ids with no text behind them, `size` of them (e.g. random benchmark data).
    Ids { size: usize },
}

impl Vocab {
    pub fn size(&self) -> usize {
        match self {
            Vocab::Chars(c) => c.len(),
            Vocab::Gpt2 => GPT2_VOCAB,
            Vocab::Ids { size } => *size,
        }
    }

    /// The sorted distinct characters of `text`.
    pub fn from_text(text: &str) -> Vocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Vocab::Chars(chars)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let chars = match self {
            Vocab::Chars(chars) => chars,
            Vocab::Gpt2 => return Ok(gpt2_encode(text)),
            Vocab::Ids { .. } => return Err(Error::invalid("encode", "this vocabulary has no text (bare token ids)")),
        };
        text.chars()
            .enumerate()
            .map(|(i, ch)| {
                chars.binary_search(&ch).map(|t| t as u32).map_err(|_| {
                    Error::invalid("text", format!("character {ch:?} at {i} is not in the model's vocabulary"))
                })
            })
            .collect()
    }

    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Vocab::Chars(chars) => {
                tokens.iter().map(|&t| chars.get(t as usize).copied().unwrap_or('\u{fffd}')).collect()
            }
            Vocab::Gpt2 => gpt2_decode(tokens).unwrap_or_else(|e| e.to_string()),
            Vocab::Ids { .. } => tokens.iter().map(|t| format!("<{t}>")).collect::<Vec<_>>().join(""),
        }
    }
}

enum Store {
    Owned(Vec<u32>),
    #[cfg(not(target_arch = "wasm32"))]
    U16 {
        map: memmap2::Mmap,
        offset: usize,
        len: usize,
    },
}

/// A token sequence with a train / validation split (the last `val_fraction` is validation).
pub struct Dataset {
    store: Store,
    pub vocab: Vocab,
    pub path: PathBuf,
    n_train: usize,
    /// A separate validation set (then all of this one trains).
    val: Option<Box<Dataset>>,
}

/// Which part of the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
}

impl Dataset {
    /// Data from text, tokenized by `vocab` (a checkpoint's characters, or GPT-2's BPE), by
    /// default the text's own characters.
    pub fn from_text(text: &str, path: impl Into<PathBuf>, vocab: Option<Vocab>) -> Result<Dataset> {
        let path = path.into();
        if text.is_empty() {
            return Err(Error::Data { path, msg: "is empty".into() });
        }
        let vocab = vocab.unwrap_or_else(|| Vocab::from_text(text));
        let tokens = vocab.encode(text).map_err(|e| Error::Data { path: path.clone(), msg: e.to_string() })?;
        Ok(Self::with_split(Store::Owned(tokens), vocab, path))
    }

    /// Token ids already in memory (< `vocab_size`).
    pub fn from_tokens(tokens: Vec<u32>, vocab_size: usize, path: impl Into<PathBuf>) -> Result<Dataset> {
        let path = path.into();
        if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t as usize >= vocab_size) {
            return Err(Error::Data {
                path,
                msg: format!("token {t} at position {i} is not below the vocabulary size {vocab_size}"),
            });
        }
        Ok(Self::with_split(Store::Owned(tokens), Vocab::Ids { size: vocab_size }, path))
    }

    /// A `.bin` token file's bytes (llm.c header or raw uint16), e.g. fetched by the browser.
    pub fn from_bin_bytes(bytes: &[u8], vocab_size: usize, path: impl Into<PathBuf>) -> Result<Dataset> {
        let path = path.into();
        let (offset, len) = token_layout(bytes).map_err(|msg| Error::Data { path: path.clone(), msg })?;
        let tokens =
            bytes[offset..offset + 2 * len].chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32).collect();
        Self::from_tokens(tokens, vocab_size, path)
    }

    fn with_split(store: Store, vocab: Vocab, path: PathBuf) -> Dataset {
        let mut d = Dataset { store, vocab, path, n_train: 0, val: None };
        d.n_train = d.len() - d.len() / 10;
        d
    }

    /// Opens `path`: `.bin` as uint16 tokens (llm.c header or raw), anything else as UTF-8 text.
    /// `vocab` (from a checkpoint, or the tokenizer asked for) fixes the token ids; token files
    /// default to GPT-2's BPE. A token file is mapped, not read: opening costs the same for any
    /// size, and each batch checks its own tokens against the vocabulary.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &std::path::Path, vocab: Option<Vocab>) -> Result<Dataset> {
        let data_err = |msg: String| Error::Data { path: path.to_path_buf(), msg };
        if path.extension().is_some_and(|e| e == "bin") {
            let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
            // SAFETY: the map is read-only and we never write the file; a file truncated by
            // another process while mapped would fault, as with any mmap reader.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
            let (offset, len) = token_layout(&map).map_err(data_err)?;
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::Sequential);
            let vocab = vocab.unwrap_or(Vocab::Gpt2);
            Ok(Self::with_split(Store::U16 { map, offset, len }, vocab, path.to_path_buf()))
        } else {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
            Self::from_text(&text, path, vocab)
        }
    }

    pub fn len(&self) -> usize {
        match &self.store {
            Store::Owned(v) => v.len(),
            #[cfg(not(target_arch = "wasm32"))]
            Store::U16 { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn token(&self, i: usize) -> u32 {
        match &self.store {
            Store::Owned(v) => v[i],
            #[cfg(not(target_arch = "wasm32"))]
            Store::U16 { map, offset, .. } => u16::from_le_bytes([map[offset + 2 * i], map[offset + 2 * i + 1]]) as u32,
        }
    }

    /// This data trains in full and `val` (tokenized with the same vocabulary) validates.
    pub fn with_validation(mut self, mut val: Dataset) -> Result<Dataset> {
        if val.vocab != self.vocab {
            return Err(Error::Data { path: val.path, msg: "has another vocabulary than the training data".into() });
        }
        self.n_train = self.len();
        val.n_train = val.len();
        self.val = Some(Box::new(val));
        Ok(self)
    }

    /// Where `split`'s tokens are: this data's range, or the separate validation set's.
    fn part(&self, split: Split) -> (&Dataset, usize, usize) {
        match (split, &self.val) {
            (Split::Val, Some(v)) => (v, 0, v.len()),
            (Split::Val, None) => (self, self.n_train, self.len()),
            (Split::Train, _) => (self, 0, self.n_train),
        }
    }

    fn range(&self, split: Split) -> (usize, usize) {
        match split {
            Split::Train => (0, self.n_train),
            Split::Val => (self.n_train, self.len()),
        }
    }

    pub fn split_len(&self, split: Split) -> usize {
        let (_, a, b) = self.part(split);
        b - a
    }

    /// Errors unless both splits hold at least one window of `seq_len + 1` tokens.
    pub fn check_fits(&self, seq_len: usize) -> Result<()> {
        for split in [Split::Train, Split::Val] {
            let n = self.split_len(split);
            if n < seq_len + 1 {
                return Err(Error::Data {
                    path: self.part(split).0.path.clone(),
                    msg: format!(
                        "too short: its {split:?} split has {n} tokens, a window of --seq-len {seq_len} needs {} ({} tokens in all)",
                        seq_len + 1,
                        self.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// `b` random windows of `t + 1` tokens from `split`: inputs (B·T) and next-token targets
    /// (B·T). A token outside the vocabulary is an error naming the file and its position.
    pub fn batch(&self, split: Split, rng: &mut Rng, b: usize, t: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let (data, start, end) = self.part(split);
        let vocab_size = self.vocab.size();
        let mut x = Vec::with_capacity(b * t);
        let mut y = Vec::with_capacity(b * t);
        for _ in 0..b {
            let s = start + rng.below(end - start - t);
            if let Some((i, tok)) =
                (s..s + t + 1).map(|i| (i, data.token(i))).find(|&(_, tok)| tok as usize >= vocab_size)
            {
                return Err(Error::Data {
                    path: data.path.clone(),
                    msg: format!("token {tok} at position {i} is not below the vocabulary size {vocab_size}"),
                });
            }
            x.extend((s..s + t).map(|i| data.token(i)));
            y.extend((s + 1..s + t + 1).map(|i| data.token(i)));
        }
        Ok((x, y))
    }

    /// The training batch of step `step`: `n` windows of `t + 1` tokens drawn with a generator
    /// seeded by (`seed`, `step`), so any step's batch can be made again — after a resume, or
    /// ahead of time by a prefetch thread — without carrying generator state along.
    pub fn step_batch(&self, seed: u64, step: u64, n: usize, t: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let mut rng = Rng::new(seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17));
        self.batch(Split::Train, &mut rng, n, t)
    }

    /// Entropy (nats) of the training split's token frequencies: the loss of the best model that
    /// ignores context. A model that learns must go far below it. Past 4M tokens, from 4M
    /// tokens spread evenly over the split (an estimate that costs the same for any file).
    pub fn unigram_entropy(&self) -> f32 {
        const MOST: usize = 1 << 22;
        let mut counts = vec![0u64; self.vocab.size()];
        let (a, b) = self.range(Split::Train);
        let stride = (b - a).div_ceil(MOST).max(1);
        for i in (a..b).step_by(stride) {
            if let Some(c) = counts.get_mut(self.token(i) as usize) {
                *c += 1;
            }
        }
        let n = counts.iter().sum::<u64>().max(1) as f64;
        -counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 / n * (c as f64 / n).ln()).sum::<f64>() as f32
    }
}

/// (byte offset, token count) of the uint16 tokens in a `.bin` file.
fn token_layout(bytes: &[u8]) -> std::result::Result<(usize, usize), String> {
    if bytes.is_empty() {
        return Err("is empty".into());
    }
    if bytes.len() >= LLMC_HEADER_BYTES {
        let word = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        if word(0) == LLMC_MAGIC {
            if word(1) != 1 {
                return Err(format!("llm.c token file version {} (only 1, uint16 tokens, is known)", word(1)));
            }
            let n = word(2).max(0) as usize;
            let have = (bytes.len() - LLMC_HEADER_BYTES) / 2;
            if have < n {
                return Err(format!("header promises {n} tokens but the file holds {have}: truncated"));
            }
            return Ok((LLMC_HEADER_BYTES, n));
        }
    }
    if !bytes.len().is_multiple_of(2) {
        return Err(format!("has an odd length ({} bytes): not uint16 tokens", bytes.len()));
    }
    Ok((0, bytes.len() / 2))
}

/// Makes the batches of upcoming steps on a worker thread (reading the memory-mapped tokens),
/// a few steps ahead of the trainer.
pub struct Prefetcher {
    #[cfg(not(target_arch = "wasm32"))]
    rx: std::sync::mpsc::Receiver<(u64, Result<(Vec<u32>, Vec<u32>)>)>,
    #[cfg(target_arch = "wasm32")]
    data: std::sync::Arc<Dataset>,
    seed: u64,
    n: usize,
    t: usize,
}

impl Prefetcher {
    /// Batches for steps `first..`, `n` windows of `t` tokens each, at most `depth` steps ahead.
    pub fn new(data: std::sync::Arc<Dataset>, seed: u64, first: u64, n: usize, t: usize, depth: usize) -> Prefetcher {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (tx, rx) = std::sync::mpsc::sync_channel(depth.max(1));
            std::thread::spawn(move || {
                for step in first.. {
                    if tx.send((step, data.step_batch(seed, step, n, t))).is_err() {
                        break;
                    }
                }
            });
            Prefetcher { rx, seed, n, t }
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (first, depth);
            Prefetcher { data, seed, n, t }
        }
    }

    /// The batch of `step` (made here if the thread is elsewhere).
    pub fn get(&self, data: &Dataset, step: u64) -> Result<(Vec<u32>, Vec<u32>)> {
        #[cfg(not(target_arch = "wasm32"))]
        while let Ok((s, batch)) = self.rx.recv() {
            if s == step {
                return batch;
            }
            if s > step {
                break;
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = &self.data;
        data.step_batch(self.seed, step, self.n, self.t)
    }
}
