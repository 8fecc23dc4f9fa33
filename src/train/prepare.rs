//! `pagetrain prepare`: a text file to an llm.c token file of GPT-2 BPE ids, streamed a few MiB
//! at a time (a corpus larger than RAM is fine), written to a temporary file and renamed into
//! place when complete.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::data::{LLMC_HEADER_BYTES, LLMC_MAGIC};
use super::tokenizer::gpt2_encode;
use crate::error::{Error, Result};

/// Bytes of text encoded at a time (cut at a line end, so BPE sees whole lines).
const CHUNK: usize = 4 << 20;

/// Encodes `input` into `output`; calls `progress(bytes read, bytes in all)` after each chunk.
/// Returns the number of tokens written.
pub fn gpt2_token_file(input: &Path, output: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<u64> {
    let file = std::fs::File::open(input).map_err(|e| Error::io(input, e))?;
    let total = file.metadata().map_err(|e| Error::io(input, e))?.len();
    let mut reader = BufReader::new(file);
    let tmp = output.with_extension("bin.partial");
    let out = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut writer = BufWriter::new(out);
    writer.write_all(&[0u8; LLMC_HEADER_BYTES]).map_err(|e| Error::io(&tmp, e))?;
    let (mut pending, mut read, mut tokens) = (Vec::<u8>::new(), 0u64, 0u64);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = reader.read(&mut buf).map_err(|e| Error::io(input, e))?;
        read += n as u64;
        pending.extend_from_slice(&buf[..n]);
        // Encode up to the last line end (all of it at the end of the file).
        let cut = if n == 0 { pending.len() } else { pending.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) };
        if cut > 0 || n == 0 {
            let text = std::str::from_utf8(&pending[..cut]).map_err(|e| Error::Data {
                path: input.to_path_buf(),
                msg: format!("is not UTF-8 text (at byte {})", read - pending.len() as u64 + e.valid_up_to() as u64),
            })?;
            for t in gpt2_encode(text) {
                writer.write_all(&(t as u16).to_le_bytes()).map_err(|e| Error::io(&tmp, e))?;
                tokens += 1;
            }
            pending.drain(..cut);
            progress(read, total);
        }
        if n == 0 {
            break;
        }
    }
    if tokens == 0 {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Data { path: input.to_path_buf(), msg: "holds no text to encode".into() });
    }
    let count = i32::try_from(tokens).map_err(|_| Error::Data {
        path: input.to_path_buf(),
        msg: format!("encodes to {tokens} tokens, more than an llm.c header can count"),
    })?;
    let mut header = [0i32; LLMC_HEADER_BYTES / 4];
    header[..3].copy_from_slice(&[LLMC_MAGIC, 1, count]);
    let mut out = writer.into_inner().map_err(|e| Error::io(&tmp, e.into_error()))?;
    out.seek(SeekFrom::Start(0)).map_err(|e| Error::io(&tmp, e))?;
    out.write_all(bytemuck::cast_slice(&header)).map_err(|e| Error::io(&tmp, e))?;
    out.sync_all().map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, output).map_err(|e| Error::io(output, e))?;
    Ok(tokens)
}
