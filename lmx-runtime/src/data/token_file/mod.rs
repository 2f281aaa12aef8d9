//! lmx's token file: a flat, memory-mappable array of token ids for corpora larger than memory.
//!
//! Layout (all integers little-endian), 32 bytes of header and then the tokens:
//!
//! | bytes | content |
//! | --- | --- |
//! | 0..8 | magic `LMXTOKEN` |
//! | 8..12 | format version, `1` |
//! | 12..16 | dtype: bytes per token, `2` (u16) or `4` (u32) |
//! | 16..24 | token count |
//! | 24..32 | reserved, zero |
//! | 32.. | the tokens |
//!
//! [`TokenFileWriter`] streams tokens into a temporary file beside the target and renames it into
//! place only when it is complete, so a reader never sees a half-written file. [`TokenFile`] maps
//! the file and checks its header and length before handing out a token.

mod header;
mod reader;
mod writer;

pub use header::TokenDtype;
pub use reader::TokenFile;
pub use writer::{write_token_file, TokenFileWriter};
