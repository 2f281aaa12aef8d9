//! Which tokenizer a run uses: bytes, a BPE tokenizer trained on the run's data, or a Hugging Face
//! `tokenizer.json`.

use lmx::runtime::data::{
    read_documents, ByteTokenizer, HfTokenizer, InputFormat, Tokenizer, BPE_MIN_VOCAB,
};
use std::path::{Path, PathBuf};

/// Where a run keeps the BPE tokenizer trained for it.
pub const TRAINED_FILE: &str = "tokenizer.json";

/// A run's tokenizer, as recorded in its `run.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerSpec {
    /// Byte-level: 256 ids plus an end-of-sequence id.
    Byte,
    /// A byte-level BPE tokenizer with as many ids as the model's vocabulary, trained on the
    /// run's text when the run starts and kept in the run directory ([`TRAINED_FILE`]).
    Bpe,
    /// A Hugging Face `tokenizer.json`, with its end-of-sequence token.
    HuggingFace {
        /// The file.
        path: PathBuf,
        /// The end-of-sequence token, e.g. `</s>` or `<|endoftext|>`.
        eos: Option<String>,
    },
}

/// `--tokenizer`: a tokenizer, or `None` for `auto`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerArg(Option<TokenizerSpec>);

impl TokenizerArg {
    /// `auto`, `byte`, `bpe`, or the path of a `tokenizer.json` with an optional end-of-sequence
    /// token.
    pub fn parse(name: &str, eos: Option<String>) -> TokenizerArg {
        TokenizerArg(match name {
            "auto" => None,
            "byte" => Some(TokenizerSpec::Byte),
            "bpe" => Some(TokenizerSpec::Bpe),
            path => Some(TokenizerSpec::HuggingFace {
                path: PathBuf::from(path),
                eos,
            }),
        })
    }

    /// A resumed run's recorded tokenizer.
    pub fn recorded(spec: TokenizerSpec) -> TokenizerArg {
        TokenizerArg(Some(spec))
    }

    /// The tokenizer to use: the one given, or the one `auto` stands for, for a model of `vocab`
    /// ids trained on `data`: bytes when the vocabulary holds no more than the bytes and an
    /// end-of-sequence id, or when the data are token files (ids already, which a byte-level
    /// model's samples decode); otherwise a BPE tokenizer of the model's vocabulary trained on
    /// the data.
    pub fn resolve(&self, vocab: usize, data: &[PathBuf]) -> TokenizerSpec {
        if let Some(given) = &self.0 {
            return given.clone();
        }
        let token_files = !data.is_empty()
            && data
                .iter()
                .all(|path| path.extension().is_some_and(|ext| ext == "tokens"));
        if vocab <= BPE_MIN_VOCAB || token_files {
            TokenizerSpec::Byte
        } else {
            TokenizerSpec::Bpe
        }
    }
}

/// A run's tokenizer, and the one trained for it that is still to be saved into the run.
pub struct ForTraining {
    /// The tokenizer to encode the data with.
    pub tokenizer: Box<dyn Tokenizer>,
    /// A tokenizer trained for this run, for [`ForTraining::save`].
    trained: Option<HfTokenizer>,
}

impl ForTraining {
    /// Saves a tokenizer trained for the run into `run_dir`, where [`TokenizerSpec::load`] finds
    /// it.
    pub fn save(&self, run_dir: &Path) -> anyhow::Result<()> {
        if let Some(trained) = &self.trained {
            std::fs::create_dir_all(run_dir)
                .map_err(|err| anyhow::anyhow!("{}: {err}", run_dir.display()))?;
            trained.save(run_dir.join(TRAINED_FILE))?;
        }
        Ok(())
    }
}

impl TokenizerSpec {
    /// Loads the tokenizer of the run in `run_dir`.
    pub fn load(&self, run_dir: &Path) -> anyhow::Result<Box<dyn Tokenizer>> {
        Ok(match self {
            TokenizerSpec::Byte => Box::new(ByteTokenizer::with_eos()),
            TokenizerSpec::Bpe => Box::new(HfTokenizer::from_file(run_dir.join(TRAINED_FILE))?),
            TokenizerSpec::HuggingFace { path, eos } => {
                let tokenizer = HfTokenizer::from_file(path)?;
                Box::new(match eos {
                    Some(token) => tokenizer.with_eos(token)?,
                    None => tokenizer,
                })
            }
        })
    }

    /// The tokenizer to train a model of `vocab` ids on `data` with, into `run_dir`. `bpe` trains
    /// one on `data` (in seconds), unless a resumed run already has its own: a resumed run must
    /// read its data with the ids it was trained on.
    pub fn for_training(
        &self,
        run_dir: &Path,
        data: &[PathBuf],
        vocab: usize,
        resume: bool,
    ) -> anyhow::Result<ForTraining> {
        let trained_file = run_dir.join(TRAINED_FILE);
        if *self != TokenizerSpec::Bpe || resume && trained_file.is_file() {
            return Ok(ForTraining {
                tokenizer: self.load(run_dir)?,
                trained: None,
            });
        }
        let mut texts = Vec::new();
        for path in data {
            if path.extension().is_some_and(|ext| ext == "tokens") {
                anyhow::bail!(
                    "{}: a BPE tokenizer is trained on text, and a .tokens file holds ids",
                    path.display()
                );
            }
            for document in read_documents(path, &InputFormat::from_path(path))? {
                texts.push(document?);
            }
        }
        let trained = HfTokenizer::train_bpe(&texts, vocab)?;
        Ok(ForTraining {
            tokenizer: Box::new(trained.clone()),
            trained: Some(trained),
        })
    }
}
