//! An exclusive lock on a directory, so that two processes never write the same run's files:
//! an advisory lock (`flock` on Unix) on a file `lock` inside it, which holds the owner's pid so
//! that a refused process can say who holds it. The OS drops the lock when its holder exits,
//! killed or not, so a crashed run never leaves a stale lock behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Held while it lives; dropping it (or the process ending) releases the directory.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    _file: File,
}

impl DirLock {
    /// Creates `dir` if needed and locks it. An error when it cannot be created or written (a
    /// file in its place, no permission) or when another process holds it (naming its pid).
    pub fn acquire(dir: &Path, what: &str) -> Result<DirLock> {
        let unusable = |e: std::io::Error| {
            let why = if dir.is_file() { "it is a file".to_string() } else { e.to_string() };
            Error::io(dir, std::io::Error::new(e.kind(), format!("cannot be used as the {what}: {why}")))
        };
        std::fs::create_dir_all(dir).map_err(unusable)?;
        let path = dir.join("lock");
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(unusable)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    pid if !pid.is_empty() => format!("process {pid}"),
                    _ => "another process".to_string(),
                };
                return Err(Error::io(
                    dir,
                    std::io::Error::other(format!(
                        "{what} is in use by {holder} (it holds {}); give each run its own directory",
                        path.display()
                    )),
                ));
            }
            // A file system without locks (some network mounts): run unprotected, and say so.
            Err(TryLockError::Error(e)) => {
                log::warn!("cannot lock {}: {e}; nothing stops a second run using it", path.display())
            }
        }
        let pid = std::process::id().to_string();
        let written = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| file.write_all(pid.as_bytes()));
        written.map_err(|e| Error::io(&path, e))?;
        Ok(DirLock { path, _file: file })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
