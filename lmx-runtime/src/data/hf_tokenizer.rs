//! Hugging Face `tokenizer.json` tokenizers, through the `tokenizers` crate.

use std::path::Path;

use super::error::DataError;
use super::tokenizer::Tokenizer;

/// End-of-sequence tokens recognised when a tokenizer is loaded, first match wins.
const EOS_NAMES: &[&str] = &["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];
/// Beginning-of-sequence tokens recognised when a tokenizer is loaded, first match wins.
const BOS_NAMES: &[&str] = &["<|begin_of_text|>", "<s>", "<bos>"];

/// A tokenizer from a Hugging Face `tokenizer.json` (BPE, WordPiece, WordLevel or Unigram).
///
/// `tokenizer.json` does not say which token ends a sequence; the usual names
/// (`<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>`; `<|begin_of_text|>`, `<s>`, `<bos>`) are
/// looked up when it is loaded, and [`with_eos`](Self::with_eos) / [`with_bos`](Self::with_bos)
/// name others.
#[derive(Debug, Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    eos: Option<u32>,
    bos: Option<u32>,
    vocab_size: usize,
    /// The post-processor's ids before and after a document (see [`Tokenizer::framing`]).
    framing: (Vec<u32>, Vec<u32>),
}

impl HfTokenizer {
    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        let json = std::fs::read(path).map_err(|cause| DataError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&json).map_err(|cause| DataError::Tokenizer {
                context: format!("loading {}", path.display()),
                cause,
            })?;
        Ok(Self::from_tokenizer(inner))
    }

    /// Loads the text of a `tokenizer.json`.
    pub fn from_json(json: &[u8]) -> Result<Self, DataError> {
        let inner =
            tokenizers::Tokenizer::from_bytes(json).map_err(|cause| DataError::Tokenizer {
                context: "loading tokenizer.json".to_owned(),
                cause,
            })?;
        Ok(Self::from_tokenizer(inner))
    }

    /// Wraps a tokenizer built in code, recognising its special tokens by name.
    pub fn from_tokenizer(inner: tokenizers::Tokenizer) -> Self {
        let find = |names: &[&str]| names.iter().find_map(|name| inner.token_to_id(name));
        let eos = find(EOS_NAMES);
        let bos = find(BOS_NAMES);
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let framing = framing_of(&inner);
        Self {
            inner,
            eos,
            bos,
            vocab_size,
            framing,
        }
    }

    /// Makes `token` the end-of-sequence token.
    pub fn with_eos(mut self, token: &str) -> Result<Self, DataError> {
        self.eos = Some(self.id_of(token)?);
        Ok(self)
    }

    /// Makes `token` the beginning-of-sequence token.
    pub fn with_bos(mut self, token: &str) -> Result<Self, DataError> {
        self.bos = Some(self.id_of(token)?);
        Ok(self)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    fn id_of(&self, token: &str) -> Result<u32, DataError> {
        self.inner
            .token_to_id(token)
            .ok_or_else(|| DataError::MissingSpecialToken(token.to_owned()))
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|cause| DataError::Tokenizer {
                context: "encoding".to_owned(),
                cause,
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// By the tokens' byte offsets in the whole text's encoding.
    fn encode_split(&self, text: &str, split: usize) -> Result<(Vec<u32>, usize), DataError> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|cause| DataError::Tokenizer {
                context: "encoding".to_owned(),
                cause,
            })?;
        let prompt = encoding
            .get_offsets()
            .iter()
            .take_while(|(_, end)| *end <= split)
            .count();
        Ok((encoding.get_ids().to_vec(), prompt))
    }

    fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        let vocab_size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(DataError::UnknownToken { id, vocab_size });
        }
        self.inner
            .decode(ids, true)
            .map_err(|cause| DataError::Tokenizer {
                context: "decoding".to_owned(),
                cause,
            })
    }

    /// One more than the largest id, added tokens included.
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    fn framing(&self) -> (&[u32], &[u32]) {
        (&self.framing.0, &self.framing.1)
    }
}

/// The special ids `inner`'s post-processor adds around a document: those of a one-character
/// text's encoding with special tokens that its encoding without them lacks, split around it.
/// (An empty text would not do: some post-processors skip empty encodings.)
fn framing_of(inner: &tokenizers::Tokenizer) -> (Vec<u32>, Vec<u32>) {
    let ids = |special| {
        inner
            .encode("a", special)
            .map(|encoding| encoding.get_ids().to_vec())
            .unwrap_or_default()
    };
    let (plain, framed) = (ids(false), ids(true));
    match framed.windows(plain.len().max(1)).position(|w| w == plain) {
        Some(start) if !plain.is_empty() => (
            framed[..start].to_vec(),
            framed[start + plain.len()..].to_vec(),
        ),
        _ => (Vec::new(), Vec::new()),
    }
}
