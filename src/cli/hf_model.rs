//! Hugging Face model folders on the command line: `lmx generate --model DIR`, and what
//! `lmx train --init DIR` reads from the folder (settings, weights, tokenizer).

use super::tokenizer::TokenizerSpec;
use lmx::runtime::data::sft::{minijinja, ChatTemplate};
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
    /// Whether the prompt is a user's message for the folder's chat template.
    pub chat: bool,
    /// A draft model folder for speculative decoding.
    pub draft: Option<super::train::Draft>,
    /// A bound on the key-value cache (`--max-kv-size`).
    pub max_kv: Option<super::train::MaxKv>,
}

/// The folder's tokenizer: its `tokenizer.json`, ending sequences with the end-of-sequence
/// token its `tokenizer_config.json` names.
pub fn tokenizer(folder: &HfFolder) -> anyhow::Result<TokenizerSpec> {
    let path = folder.tokenizer_file().ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no {}: copy the model's tokenizer files into it (to train from it, \
             --tokenizer names another)",
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
    let (text, prompt) = if request.chat {
        // The template writes its own special tokens: its text is tokenized as it stands.
        let text = chat_prompt(folder, &request.prompt)?;
        let prompt = tokenizer.encode(&text)?;
        (text, prompt)
    } else {
        // As mlx-lm's `generate` encodes a prompt: a published model reads its BOS first.
        let prompt = tokenizer.encode_framed(&request.prompt)?;
        (request.prompt.clone(), prompt)
    };
    let config = hf::model_config::<M>(folder)?;
    check_prompt::<M>(&config, &prompt)?;
    let (config, params) = hf::load_model::<M>(folder, None)?;
    let draft = match &request.draft {
        Some(draft) => {
            let load = || -> anyhow::Result<(M::Config, M::Params)> {
                let draft_folder = HfFolder::open(&draft.path)?;
                Ok(hf::load_model::<M>(&draft_folder, None)?)
            };
            let (draft_config, draft_params) = load().map_err(|err| {
                anyhow::anyhow!(
                    "--draft {}: {err} (the draft is a Hugging Face folder of the model's family, \
                     {})",
                    draft.path.display(),
                    M::NAME
                )
            })?;
            Some((draft_params, draft_config, draft.tokens))
        }
        None => None,
    };
    super::train::stream::<M>(
        &params,
        &config,
        tokenizer,
        &text,
        &prompt,
        &request.sampling,
        &request.stop,
        draft.as_ref().map(|(p, c, k)| (p, c, *k)),
        request.max_kv,
    )
}

/// `message` as a user's turn through `folder`'s chat template, the assistant's turn opened.
fn chat_prompt(folder: &HfFolder, message: &str) -> anyhow::Result<String> {
    let source = folder.chat_template()?.ok_or_else(|| {
        anyhow::anyhow!(
            "--chat: {} has no chat template (tokenizer_config.json's `chat_template` or \
             chat_template.jinja)",
            folder.dir().display()
        )
    })?;
    let template = ChatTemplate::new(
        "chat template",
        source,
        folder.bos_token().as_deref(),
        folder.eos_token().as_deref(),
    )?;
    let user = minijinja::Value::from_iter([("role", "user"), ("content", message)]);
    Ok(template.render(&[user], None, true)?)
}
