//! Hugging Face model folders on the command line: `lmx generate --model DIR`, and what
//! `lmx train --init DIR` reads from the folder (settings, weights, tokenizer).

use super::tokenizer::TokenizerSpec;
use lmx::runtime::generate::{check_prompt, Sampling};
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::model::LanguageModel;

/// What `lmx generate --model DIR` was asked to do.
pub struct FolderGenerateRequest {
    /// The text to continue.
    pub prompt: String,
    /// Sampling settings.
    pub sampling: Sampling,
    /// Strings that end the text (left out of it).
    pub stop: Vec<String>,
}

/// The folder's tokenizer: its `tokenizer.json`, ending sequences with the end-of-sequence
/// token its `tokenizer_config.json` names.
pub fn tokenizer(folder: &HfFolder) -> anyhow::Result<TokenizerSpec> {
    let path = folder.tokenizer_file().ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no {}: give --tokenizer",
            folder.dir().display(),
            hf::TOKENIZER_FILE
        )
    })?;
    Ok(TokenizerSpec::HuggingFace {
        path,
        eos: folder.eos_token(),
    })
}

/// Samples from the model in `folder` (float32), continuing the prompt.
pub fn sample<M: LanguageModel>(
    folder: &HfFolder,
    request: FolderGenerateRequest,
) -> anyhow::Result<()> {
    request.sampling.validate()?;
    let tokenizer: std::sync::Arc<dyn lmx::runtime::data::Tokenizer> =
        tokenizer(folder)?.load(folder.dir())?.into();
    // As mlx-lm's `generate` encodes a prompt: a published model reads its BOS first.
    let prompt = tokenizer.encode_framed(&request.prompt)?;
    let config = hf::model_config::<M>(folder)?;
    check_prompt::<M>(&config, &prompt)?;
    let (config, params) = hf::load_model::<M>(folder, None)?;
    super::train::stream::<M>(
        &params,
        &config,
        tokenizer,
        &request.prompt,
        &prompt,
        &request.sampling,
        &request.stop,
    )
}
