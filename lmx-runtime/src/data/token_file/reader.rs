//! Reading a token file through a memory map.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::header::{Header, HEADER_LEN};
use super::TokenDtype;
use crate::data::error::{DataError, TokenOrigin};
use crate::data::source::{to_i32, TokenSource};

/// A token file mapped into memory: pages are read on demand, so the corpus may be larger than
/// memory.
///
/// The header and the file's length are checked when it is opened, and its tokens scanned once
/// for their largest id, so that checking them against a vocabulary
/// ([`TokenSource::check_vocab`]) costs nothing more for a valid file. The file must not be
/// truncated or rewritten in place while it is open (files written by
/// [`TokenFileWriter`](super::TokenFileWriter) are replaced by a rename, which is safe).
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
    dtype: TokenDtype,
    len: usize,
    /// The largest id in the file (0 for an empty one).
    max_id: u32,
}

impl TokenFile {
    /// Opens and maps `path`, checking its magic, version, dtype and length.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref().to_path_buf();
        let io = |cause| DataError::Io {
            path: path.clone(),
            cause,
        };
        let file = File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        // SAFETY: the map is read-only; the type's documentation asks that the file not be
        // truncated or modified in place while it is open, which is what makes reading it sound.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header =
            Header::parse(&map[..map.len().min(HEADER_LEN)], file_len).map_err(|fault| {
                DataError::TokenFile {
                    path: path.clone(),
                    fault,
                }
            })?;
        let len = usize::try_from(header.count).map_err(|_| {
            DataError::InvalidSetting(format!(
                "{}: {} tokens do not fit this machine's address space",
                path.display(),
                header.count
            ))
        })?;
        let mut file = Self {
            path,
            map,
            dtype: header.dtype,
            len,
            max_id: 0,
        };
        file.max_id = file.iter().max().unwrap_or(0);
        Ok(file)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the tokens are stored.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// The token at `index`, or `None` past the end.
    pub fn get(&self, index: usize) -> Option<u32> {
        if index >= self.len {
            return None;
        }
        let width = self.dtype.width();
        let at = HEADER_LEN + index * width;
        let bytes = &self.map[at..at + width];
        Some(match self.dtype {
            TokenDtype::U16 => u32::from(u16::from_le_bytes([bytes[0], bytes[1]])),
            TokenDtype::U32 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        })
    }

    /// Every token, in order (reads the whole file).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).map(|index| self.get(index).expect("index below len"))
    }
}

impl TokenSource for TokenFile {
    fn len(&self) -> usize {
        self.len
    }

    fn read_i32(&self, start: usize, out: &mut [i32]) -> Result<(), DataError> {
        assert!(
            start + out.len() <= self.len,
            "tokens {start}..{} of {} in {}",
            start + out.len(),
            self.len,
            self.path.display()
        );
        let width = self.dtype.width();
        let body = &self.map[HEADER_LEN + start * width..HEADER_LEN + (start + out.len()) * width];
        for (offset, (slot, bytes)) in out.iter_mut().zip(body.chunks_exact(width)).enumerate() {
            *slot = match self.dtype {
                TokenDtype::U16 => i32::from(u16::from_le_bytes([bytes[0], bytes[1]])),
                TokenDtype::U32 => to_i32(
                    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
                    start + offset,
                )?,
            };
        }
        Ok(())
    }
    fn find_outside(&self, range: Range<usize>, vocab_size: usize) -> Option<(usize, u32)> {
        assert!(range.end <= self.len, "tokens {range:?} of {}", self.len);
        if self.max_id as usize >= vocab_size {
            range
                .map(|index| (index, self.get(index).expect("index below len")))
                .find(|&(_, id)| id as usize >= vocab_size)
        } else {
            None
        }
    }

    fn origin(&self) -> TokenOrigin {
        TokenOrigin::File(self.path.clone())
    }
}
