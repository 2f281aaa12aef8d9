//! The byte-level tokenizer: one id per byte.

use super::error::DataError;
use super::tokenizer::Tokenizer;

/// Ids 0 to 255 are the bytes of the UTF-8 text; [`with_eos`](Self::with_eos) adds id 256 as the
/// end-of-sequence token.
///
/// Text round-trips exactly through [`encode`](Tokenizer::encode) and
/// [`decode`](Tokenizer::decode); arbitrary bytes through
/// [`encode_bytes`](Self::encode_bytes) and [`decode_bytes`](Self::decode_bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteTokenizer {
    eos: bool,
}

impl ByteTokenizer {
    /// The end-of-sequence id of [`with_eos`](Self::with_eos).
    pub const EOS_ID: u32 = 256;

    /// 256 ids, no special token.
    pub fn new() -> Self {
        Self { eos: false }
    }

    /// 257 ids: the bytes and [`EOS_ID`](Self::EOS_ID).
    pub fn with_eos() -> Self {
        Self { eos: true }
    }

    /// The ids of `bytes`, whatever they are.
    pub fn encode_bytes(&self, bytes: &[u8]) -> Vec<u32> {
        bytes.iter().map(|&byte| u32::from(byte)).collect()
    }

    /// The bytes of `ids`, the end-of-sequence id left out.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, DataError> {
        let mut bytes = Vec::with_capacity(ids.len());
        for &id in ids {
            match u8::try_from(id) {
                Ok(byte) => bytes.push(byte),
                Err(_) if self.eos && id == Self::EOS_ID => {}
                Err(_) => {
                    return Err(DataError::UnknownToken {
                        id,
                        vocab_size: self.vocab_size(),
                    })
                }
            }
        }
        Ok(bytes)
    }
}

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        Ok(self.encode_bytes(text.as_bytes()))
    }

    /// Bytes that are not valid UTF-8 (a character cut by the end of `ids`, say) decode to
    /// U+FFFD; [`decode_bytes`](Self::decode_bytes) is exact.
    fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        let bytes = self.decode_bytes(ids)?;
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned()))
    }

    fn vocab_size(&self) -> usize {
        if self.eos {
            257
        } else {
            256
        }
    }

    fn eos_id(&self) -> Option<u32> {
        self.eos.then_some(Self::EOS_ID)
    }

    fn bos_id(&self) -> Option<u32> {
        None
    }
}
