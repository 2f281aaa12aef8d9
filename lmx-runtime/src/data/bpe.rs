//! Byte-level BPE tokenizers (GPT-2's kind) trained on a corpus, with the `tokenizers` crate.

use std::path::Path;

use tokenizers::models::bpe::{BpeTrainer, Vocab, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfInner};

use super::error::DataError;
use super::hf_tokenizer::HfTokenizer;

/// The end-of-sequence token of a trained tokenizer, GPT-2's name for it.
pub const BPE_EOS: &str = "<|endoftext|>";

/// The fewest ids a byte-level BPE tokenizer has: the 256 bytes and [`BPE_EOS`].
pub const BPE_MIN_VOCAB: usize = 257;

impl HfTokenizer {
    /// Trains a byte-level BPE tokenizer of at most `vocab_size` ids on `texts`: the 256 bytes
    /// (so that any text encodes), [`BPE_EOS`], then the most frequent merges within words, as
    /// GPT-2's tokenizer is made. Fewer ids when the texts have fewer pairs worth merging.
    pub fn train_bpe(texts: &[String], vocab_size: usize) -> Result<HfTokenizer, DataError> {
        if vocab_size < BPE_MIN_VOCAB {
            return Err(DataError::InvalidSetting(format!(
                "a byte-level BPE tokenizer needs a vocabulary of at least {BPE_MIN_VOCAB} ids \
                 (256 bytes and {BPE_EOS}), not {vocab_size}"
            )));
        }
        let mut trainer: TrainerWrapper = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .special_tokens(vec![AddedToken::from(BPE_EOS, true)])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .show_progress(false)
            .build()
            .into();
        let mut inner = byte_level(BPE::default());
        inner
            .train(&mut trainer, texts.iter())
            .map_err(|cause| DataError::Tokenizer {
                context: "training a BPE tokenizer".to_owned(),
                cause,
            })?;
        Ok(HfTokenizer::from_tokenizer(inner))
    }

    /// The byte tokenizer ([`ByteTokenizer::with_eos`](super::ByteTokenizer::with_eos)) as a
    /// byte-level BPE tokenizer without merges: ids 0 to 255 the bytes, each spelt as byte-level
    /// BPE spells it (GPT-2's printable stand-ins), and [`BPE_EOS`] id 256. A folder written
    /// from a byte-level run carries it as its `tokenizer.json`, which encodes and decodes text
    /// as the run did (but that [`BPE_EOS`] written out is the one special token, not its bytes).
    pub fn bytes() -> Result<HfTokenizer, DataError> {
        let vocab: Vocab = (0..=255u8)
            .map(|byte| (byte_char(byte).to_string(), u32::from(byte)))
            .collect();
        let error = |cause| DataError::Tokenizer {
            context: "building the byte-level tokenizer".to_owned(),
            cause,
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .build()
            .map_err(error)?;
        let mut inner = byte_level(bpe);
        inner.add_special_tokens(&[AddedToken::from(BPE_EOS, true)]);
        Ok(HfTokenizer::from_tokenizer(inner))
    }

    /// The text of the tokenizer's `tokenizer.json`.
    pub fn to_json(&self) -> Result<String, DataError> {
        self.inner()
            .to_string(false)
            .map_err(|cause| DataError::Tokenizer {
                context: "writing tokenizer.json".to_owned(),
                cause,
            })
    }

    /// Writes the tokenizer as a `tokenizer.json` that [`HfTokenizer::from_file`] reads back, by
    /// way of a temporary file renamed into place, so that `path` is never half-written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), DataError> {
        let path = path.as_ref();
        let json = self.to_json()?;
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let io = |cause| DataError::Io {
            path: path.to_path_buf(),
            cause,
        };
        std::fs::write(&partial, json).map_err(io)?;
        std::fs::rename(&partial, path).map_err(io)
    }
}

/// A tokenizer of the BPE model `bpe` over GPT-2's byte-level pre-tokenizer and decoder, lmx's
/// byte-level tokenizers' (trained, and the bytes'): no space is added before the text, so a
/// prompt encodes as it is written.
fn byte_level(bpe: BPE) -> HfInner {
    let byte_level = ByteLevel::new(false, true, true);
    let mut inner = HfInner::new(bpe);
    inner
        .with_pre_tokenizer(Some(byte_level))
        .with_decoder(Some(byte_level));
    inner
}

/// How byte-level BPE spells `byte`: itself where it is a printable character of Latin-1, else
/// the next of the characters from U+0100 on, in the bytes' order (GPT-2's `bytes_to_unicode`,
/// which the `tokenizers` crate keeps private).
fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let before = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + before).unwrap_or(char::REPLACEMENT_CHARACTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Tokenizer;

    fn corpus() -> Vec<String> {
        let verse = "ROMEO:\nBut, soft! what light through yonder window breaks?\n\
                     It is the east, and Juliet is the sun.\n\n";
        vec![
            verse.repeat(20),
            "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n".into(),
        ]
    }

    #[test]
    fn a_trained_tokenizer_round_trips_any_text_and_ends_sequences_with_its_own_token() {
        let tokenizer = HfTokenizer::train_bpe(&corpus(), 300).unwrap();
        assert!(tokenizer.vocab_size() <= 300, "{}", tokenizer.vocab_size());
        assert_eq!(tokenizer.eos_id(), tokenizer.inner().token_to_id(BPE_EOS));
        // Text the corpus never held, non-ASCII included, comes back byte for byte.
        let text = "ROMEO: Is the sun the east?  Café, naïve — ✓\n\tend";
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
        // Merges were learnt: a frequent word is fewer tokens than bytes.
        assert!(tokenizer.encode("ROMEO").unwrap().len() < "ROMEO".len());
    }

    #[test]
    fn a_saved_tokenizer_reads_back_the_same_and_training_is_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let tokenizer = HfTokenizer::train_bpe(&corpus(), 300).unwrap();
        tokenizer.save(&path).unwrap();
        let read = HfTokenizer::from_file(&path).unwrap();
        let text = "But, soft! what light through yonder window breaks?";
        assert_eq!(read.encode(text).unwrap(), tokenizer.encode(text).unwrap());
        assert_eq!(read.eos_id(), tokenizer.eos_id());
        let again = HfTokenizer::train_bpe(&corpus(), 300).unwrap();
        assert_eq!(
            again.inner().to_string(false).unwrap(),
            tokenizer.inner().to_string(false).unwrap()
        );
    }

    /// The byte tokenizer as a Hugging Face one gives every text the byte tokenizer's ids (each
    /// of the 256 bytes' spellings among them, as the `tokenizers` crate's byte-level alphabet
    /// has them) and back, its end-of-sequence id 256, written and read back the same.
    #[test]
    fn the_byte_tokenizer_as_a_tokenizer_json_has_the_byte_ids() {
        use crate::data::ByteTokenizer;
        let bytes = ByteTokenizer::with_eos();
        let mut spelt: Vec<char> = (0..=255).map(byte_char).collect();
        let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        spelt.sort_unstable();
        alphabet.sort_unstable();
        assert_eq!(spelt, alphabet);
        let tokenizer = HfTokenizer::bytes().unwrap();
        assert_eq!(tokenizer.vocab_size(), 257);
        assert_eq!(tokenizer.eos_id(), Some(ByteTokenizer::EOS_ID));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        tokenizer.save(&path).unwrap();
        let read = HfTokenizer::from_file(&path).unwrap();
        let every_char: String = (1..=0x7fu8).map(char::from).collect();
        for text in [
            "ROMEO: Is the sun the east?  Café, naïve — ✓\n\tend  ",
            &every_char,
            " leading space, ¬ ® \u{ad} \u{0} and 日本語",
        ] {
            let want = bytes.encode(text).unwrap();
            assert_eq!(tokenizer.encode(text).unwrap(), want, "{text:?}");
            assert_eq!(read.encode(text).unwrap(), want, "{text:?}");
            assert_eq!(tokenizer.decode(&want).unwrap(), text);
        }
    }

    #[test]
    fn a_vocabulary_smaller_than_the_bytes_is_refused() {
        let err = HfTokenizer::train_bpe(&corpus(), 256).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid data setting: a byte-level BPE tokenizer needs a vocabulary of at least 257 \
             ids (256 bytes and <|endoftext|>), not 256"
        );
    }
}
