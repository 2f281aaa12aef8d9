//! Writing a token file atomically: into a temporary file, then renamed into place.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::header::Header;
use super::TokenDtype;
use crate::data::error::DataError;

/// Streams tokens into a new token file.
///
/// The tokens go to a temporary file in the target's directory; [`finish`](Self::finish) writes
/// the header, syncs the file and renames it over the target. A writer dropped before `finish`
/// (an error, a panic) removes its temporary file and leaves the target as it was.
#[derive(Debug)]
pub struct TokenFileWriter {
    path: PathBuf,
    temp: PathBuf,
    out: Option<BufWriter<File>>,
    dtype: TokenDtype,
    count: u64,
}

impl TokenFileWriter {
    /// Starts a token file at `path` whose tokens are stored as `dtype`.
    pub fn create(path: impl AsRef<Path>, dtype: TokenDtype) -> Result<Self, DataError> {
        let path = path.as_ref().to_path_buf();
        let temp = temp_path(&path);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|cause| DataError::Io {
                path: temp.clone(),
                cause,
            })?;
        let placeholder = Header { dtype, count: 0 }.to_bytes();
        let written = file.write_all(&placeholder);
        let writer = Self {
            path,
            temp,
            out: Some(BufWriter::new(file)),
            dtype,
            count: 0,
        };
        written.map_err(|source| temp_error(&writer.temp, source))?;
        Ok(writer)
    }

    /// Appends `tokens`; fails on an id that `dtype` cannot store.
    pub fn push(&mut self, tokens: &[u32]) -> Result<(), DataError> {
        let max = self.dtype.max_id();
        let mut bytes = Vec::with_capacity(tokens.len() * self.dtype.width());
        for (offset, &id) in tokens.iter().enumerate() {
            if id > max {
                return Err(DataError::TokenTooLarge {
                    id,
                    position: self.count + offset as u64,
                    target: match self.dtype {
                        TokenDtype::U16 => "u16",
                        TokenDtype::U32 => "u32 (below 2^31)",
                    },
                });
            }
            match self.dtype {
                TokenDtype::U16 => bytes.extend_from_slice(&(id as u16).to_le_bytes()),
                TokenDtype::U32 => bytes.extend_from_slice(&id.to_le_bytes()),
            }
        }
        let out = self.out.as_mut().expect("a writer is open until finish");
        out.write_all(&bytes)
            .map_err(|source| temp_error(&self.temp, source))?;
        self.count += tokens.len() as u64;
        Ok(())
    }

    /// How many tokens have been pushed.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether no token has been pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Writes the header, syncs, and renames the file into place.
    pub fn finish(mut self) -> Result<(), DataError> {
        let out = self.out.take().expect("a writer is open until finish");
        let mut file = out
            .into_inner()
            .map_err(|error| temp_error(&self.temp, error.into_error()))?;
        let header = Header {
            dtype: self.dtype,
            count: self.count,
        };
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&header.to_bytes()))
            .and_then(|_| file.sync_all())
            .map_err(|source| temp_error(&self.temp, source))?;
        drop(file);
        fs::rename(&self.temp, &self.path).map_err(|cause| DataError::Io {
            path: self.path.clone(),
            cause,
        })?;
        sync_parent(&self.path)
    }
}

impl Drop for TokenFileWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            // Nothing to report to from a drop: the target is untouched either way.
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Writes `tokens` to a new token file at `path`, atomically.
pub fn write_token_file(
    path: impl AsRef<Path>,
    dtype: TokenDtype,
    tokens: &[u32],
) -> Result<(), DataError> {
    let mut writer = TokenFileWriter::create(path, dtype)?;
    writer.push(tokens)?;
    writer.finish()
}

fn temp_error(temp: &Path, cause: std::io::Error) -> DataError {
    DataError::Io {
        path: temp.to_path_buf(),
        cause,
    }
}

/// A fresh name beside `path`, unique to this process and call.
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let unique = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{unique}.tmp", std::process::id()))
}

/// Makes the rename durable by syncing the directory that holds `path` (Unix only).
fn sync_parent(path: &Path) -> Result<(), DataError> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|cause| DataError::Io {
                path: dir.to_path_buf(),
                cause,
            })?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
