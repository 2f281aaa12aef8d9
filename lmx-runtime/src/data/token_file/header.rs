//! The token file's header and its token dtypes.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::data::error::TokenFileFault;

/// The header's length in bytes; the tokens start here.
pub(super) const HEADER_LEN: usize = 32;
const MAGIC: [u8; 8] = *b"LMXTOKEN";
const VERSION: u32 = 1;

/// How each token is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TokenDtype {
    /// Two bytes per token: vocabularies of at most 65,536 ids.
    U16,
    /// Four bytes per token, ids below 2^31 (they must fit MLX's `int32`).
    U32,
}

impl TokenDtype {
    /// The smallest dtype that holds every id of a vocabulary of `vocab_size` ids.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    /// Bytes per token.
    pub fn width(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// The largest id this dtype stores.
    pub fn max_id(self) -> u32 {
        match self {
            Self::U16 => u32::from(u16::MAX),
            Self::U32 => i32::MAX as u32,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        match code {
            2 => Some(Self::U16),
            4 => Some(Self::U32),
            _ => None,
        }
    }
}

impl fmt::Display for TokenDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::U16 => "u16",
            Self::U32 => "u32",
        })
    }
}

/// What the header says: how the tokens are stored and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) dtype: TokenDtype,
    pub(super) count: u64,
}

impl Header {
    /// The header's bytes.
    pub(super) fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(self.dtype.width() as u32).to_le_bytes());
        bytes[16..24].copy_from_slice(&self.count.to_le_bytes());
        bytes
    }

    /// Reads the header from the start of a file of `file_len` bytes and checks that the length
    /// agrees with it.
    pub(super) fn parse(bytes: &[u8], file_len: u64) -> Result<Self, TokenFileFault> {
        if bytes.len() < HEADER_LEN {
            return Err(TokenFileFault::ShortHeader {
                actual: file_len,
                header: HEADER_LEN as u64,
            });
        }
        if bytes[0..8] != MAGIC {
            return Err(TokenFileFault::BadMagic {
                found: String::from_utf8_lossy(&bytes[0..8]).into_owned(),
                expected: String::from_utf8_lossy(&MAGIC).into_owned(),
            });
        }
        let version = u32_at(bytes, 8);
        if version != VERSION {
            return Err(TokenFileFault::UnsupportedVersion(version));
        }
        let code = u32_at(bytes, 12);
        let dtype = TokenDtype::from_code(code).ok_or(TokenFileFault::UnknownDtype(code))?;
        if bytes[24..32].iter().any(|&b| b != 0) {
            return Err(TokenFileFault::Reserved);
        }
        let count = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let expected = count
            .checked_mul(dtype.width() as u64)
            .and_then(|body| body.checked_add(HEADER_LEN as u64))
            .unwrap_or(u64::MAX);
        if expected != file_len {
            return Err(TokenFileFault::LengthMismatch {
                problem: if file_len < expected {
                    "truncated"
                } else {
                    "trailing bytes"
                },
                count,
                dtype,
                expected,
                actual: file_len,
            });
        }
        Ok(Self { dtype, count })
    }
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}
