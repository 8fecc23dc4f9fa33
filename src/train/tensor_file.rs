//! safetensors files a tensor at a time: the reader holds only the header and reads one
//! tensor's bytes when asked; the writer writes the header from the shapes, then each tensor as
//! it comes. So a checkpoint as large as the host store never has to fit in RAM at once.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, TensorInfo};

use crate::error::{Error, Result};

/// safetensors' own bound on the JSON header.
const MAX_HEADER_BYTES: u64 = 100_000_000;

fn err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), msg: msg.into() }
}

/// Where the bytes are.
enum Source {
    File(std::fs::File),
    Bytes(Vec<u8>),
}

/// An open safetensors file: its header parsed and checked, its tensors read on demand as f32.
pub struct TensorFile {
    path: PathBuf,
    source: Source,
    /// Offset of the data section.
    data_start: u64,
    meta: Metadata,
    /// Names as callers ask for them → names in the file (see [`TensorFile::add_prefix`]).
    names: HashMap<String, String>,
}

impl TensorFile {
    /// Opens `path`, reading only its header (in the browser, where there are no files, an error).
    pub fn open(path: &Path) -> Result<TensorFile> {
        let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(|_| err(path, "not a valid safetensors file: shorter than its header"))?;
        let n = header_len(path, u64::from_le_bytes(n), len)?;
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
        Self::parse(path, Source::File(file), &header, len)
    }

    /// A safetensors file held in memory (`path` names it in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<TensorFile> {
        let Some(n) = bytes.get(..8) else {
            return Err(err(path, "not a valid safetensors file: shorter than its header"));
        };
        let n = header_len(path, u64::from_le_bytes(n.try_into().expect("8 bytes")), bytes.len() as u64)?;
        let header = bytes[8..8 + n as usize].to_vec();
        let len = bytes.len() as u64;
        Self::parse(path, Source::Bytes(bytes), &header, len)
    }

    fn parse(path: &Path, source: Source, header: &[u8], len: u64) -> Result<TensorFile> {
        let meta: Metadata = serde_json::from_slice(header)
            .map_err(|e| err(path, format!("not a valid safetensors file: bad header: {e}")))?;
        let data_start = 8 + header.len() as u64;
        if data_start + meta.data_len() as u64 != len {
            return Err(err(
                path,
                format!(
                    "not a valid safetensors file: the header describes {} bytes of tensors, the file holds {}",
                    meta.data_len(),
                    len - data_start
                ),
            ));
        }
        let names = meta.tensors().into_keys().map(|k| (k.clone(), k)).collect();
        Ok(TensorFile { path: path.to_path_buf(), source, data_start, meta, names })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's `__metadata__` strings.
    pub fn metadata(&self) -> HashMap<String, String> {
        self.meta.metadata().clone().unwrap_or_default()
    }

    /// Names as callers ask for them.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.meta.info(self.names.get(name)?)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.info(name).map(|i| i.shape.as_slice())
    }

    /// Elements in all tensors (from the header).
    pub fn elements(&self) -> f64 {
        self.meta.tensors().values().map(|i| i.shape.iter().map(|&d| d as f64).product::<f64>()).sum()
    }

    /// Names the file's tensors `prefix` + their name (GPT2Model checkpoints lack the
    /// `transformer.` of GPT2LMHeadModel's).
    pub fn add_prefix(&mut self, prefix: &str) {
        self.names = self.meta.tensors().into_keys().map(|k| (format!("{prefix}{k}"), k)).collect();
    }

    /// Tensor `name` as f32 (from f32, f16 or bf16), checked to be finite.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.info(name).ok_or_else(|| err(&self.path, format!("missing tensor `{name}`")))?;
        let (start, end) = info.data_offsets;
        let bytes = self.read_range(self.data_start + start as u64, end - start)?;
        let data: Vec<f32> = match info.dtype {
            Dtype::F32 => bytemuck::pod_collect_to_vec(&bytes),
            Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => {
                return Err(err(
                    &self.path,
                    format!("tensor `{name}` has dtype {other:?}; f32, f16 and bf16 are supported"),
                ))
            }
        };
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(err(&self.path, format!("tensor `{name}` holds a non-finite value at {i}")));
        }
        Ok(data)
    }

    fn read_range(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        match &self.source {
            Source::Bytes(b) => Ok(b[offset as usize..offset as usize + len].to_vec()),
            Source::File(f) => {
                // The header checked the file's length: `len` bytes are there (unless the file
                // shrank since, which is an error, not a short read).
                let mut buf = vec![0u8; len];
                let mut f = f;
                f.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(&self.path, e))?;
                f.read_exact(&mut buf).map_err(|e| Error::io(&self.path, e))?;
                Ok(buf)
            }
        }
    }
}

/// The header length `n` a file of `file_len` bytes announces, checked.
fn header_len(path: &Path, n: u64, file_len: u64) -> Result<u64> {
    if n > MAX_HEADER_BYTES || n > file_len.saturating_sub(8) {
        return Err(err(path, format!("not a valid safetensors file: a {n}-byte header in {file_len} bytes")));
    }
    Ok(n)
}

/// Writes a safetensors file of f32 tensors whose names and shapes are known up front, one
/// tensor at a time, in the order given.
pub struct TensorFileWriter<W: Write> {
    out: W,
    path: PathBuf,
    order: Vec<(String, usize)>,
    next: usize,
}

impl<W: Write> TensorFileWriter<W> {
    /// Writes the header for `tensors` (name, shape) and `meta` to `out` (`path` names it in
    /// errors).
    pub fn new(
        path: &Path,
        mut out: W,
        tensors: &[(String, Vec<usize>)],
        meta: HashMap<String, String>,
    ) -> Result<Self> {
        let mut offset = 0;
        let mut infos = Vec::with_capacity(tensors.len());
        let mut order = Vec::with_capacity(tensors.len());
        for (name, shape) in tensors {
            let elements: usize = shape.iter().product();
            infos.push((
                name.clone(),
                TensorInfo { dtype: Dtype::F32, shape: shape.clone(), data_offsets: (offset, offset + 4 * elements) },
            ));
            order.push((name.clone(), elements));
            offset += 4 * elements;
        }
        let meta = Metadata::new(Some(meta), infos).map_err(|e| err(path, e.to_string()))?;
        let mut header = serde_json::to_vec(&meta).map_err(|e| err(path, e.to_string()))?;
        // The data section starts 8-byte aligned, as safetensors' own writer pads it.
        header.resize(header.len().next_multiple_of(8), b' ');
        out.write_all(&(header.len() as u64).to_le_bytes()).map_err(|e| Error::io(path, e))?;
        out.write_all(&header).map_err(|e| Error::io(path, e))?;
        Ok(TensorFileWriter { out, path: path.to_path_buf(), order, next: 0 })
    }

    /// The next tensor's values (its name and length must be the next in the header's order).
    pub fn write(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let Some((want, elements)) = self.order.get(self.next) else {
            return Err(err(&self.path, format!("tensor `{name}` is not in the header")));
        };
        if want != name || *elements != values.len() {
            return Err(err(
                &self.path,
                format!("wrote `{name}` ({} values) where the header has `{want}` ({elements})", values.len()),
            ));
        }
        self.out.write_all(bytemuck::cast_slice(values)).map_err(|e| Error::io(&self.path, e))?;
        self.next += 1;
        Ok(())
    }

    /// The writer, once every tensor is written.
    pub fn finish(mut self) -> Result<W> {
        if self.next != self.order.len() {
            return Err(err(&self.path, format!("{} of {} tensors written", self.next, self.order.len())));
        }
        self.out.flush().map_err(|e| Error::io(&self.path, e))?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back_and_safetensors_agrees() {
        let path = Path::new("t.safetensors");
        let tensors = vec![("b".to_string(), vec![2, 3]), ("a".to_string(), vec![5]), ("c".to_string(), vec![1, 1])];
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let mut w = TensorFileWriter::new(path, Vec::new(), &tensors, meta).unwrap();
        let values: Vec<Vec<f32>> = vec![vec![1.5, -2.0, 3.25, 4.0, 0.5, -0.125], vec![9.0; 5], vec![-7.0]];
        assert!(w.write("a", &values[1]).is_err(), "out of order");
        for ((name, _), v) in tensors.iter().zip(&values) {
            w.write(name, v).unwrap();
        }
        let bytes = w.finish().unwrap();
        // safetensors itself reads what we wrote.
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("b").unwrap().shape(), &[2, 3]);
        let f = TensorFile::from_bytes(path, bytes.clone()).unwrap();
        assert_eq!(f.metadata()["format"], "pt");
        for ((name, shape), v) in tensors.iter().zip(&values) {
            assert_eq!(f.shape(name), Some(shape.as_slice()));
            assert_eq!(&f.read_f32(name).unwrap(), v);
        }
        assert!(f.read_f32("zz").unwrap_err().to_string().contains("missing tensor `zz`"));
        let mut truncated = bytes.clone();
        truncated.pop();
        assert!(TensorFile::from_bytes(path, truncated).err().expect("refused").to_string().contains("holds"));
        let short = TensorFileWriter::new(path, Vec::new(), &tensors, HashMap::new()).unwrap();
        assert!(short.finish().is_err(), "unwritten tensors");
    }
}
