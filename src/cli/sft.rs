//! `lmx train --data DIR`: supervised fine-tuning data (a folder of `train.jsonl`,
//! `valid.jsonl`, `test.jsonl`), its settings as `run.json` records them, and its rows.

use lmx::runtime::data::sft::{
    load_sft_file, Batching, ChatTemplate, RowStats, SftEncoder, SftKeys, SftRows, SftSet,
};
use lmx::runtime::data::Tokenizer;
use lmx::runtime::hf::{TokenizerConfig, TOKENIZER_CONFIG_FILE};
use std::path::{Path, PathBuf};

/// How a run reads supervised examples, as `run.json` records it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SftSettings {
    /// Leave the prompt out of the loss (`--mask-prompt`).
    pub mask_prompt: bool,
    /// Padded or packed rows (`--batching`).
    pub batching: Batching,
    /// The chat template's file (`--chat-template`); else the one in the `tokenizer_config.json`
    /// beside the tokenizer, if any.
    pub chat_template: Option<PathBuf>,
    /// The keys of the formats.
    #[serde(default)]
    pub keys: SftKeys,
}

/// The chat template for a run: `settings.chat_template`, else the `chat_template` of the
/// `tokenizer_config.json` beside `tokenizer_file` (with its `bos_token` and `eos_token`).
pub fn template(
    settings: &SftSettings,
    tokenizer_file: Option<&Path>,
) -> anyhow::Result<Option<ChatTemplate>> {
    let config = match tokenizer_file.and_then(Path::parent) {
        Some(dir) => Some(TokenizerConfig::read(dir)?),
        None => None,
    };
    let bos = config.as_ref().and_then(TokenizerConfig::bos_token);
    let eos = config.as_ref().and_then(TokenizerConfig::eos_token);
    if let Some(file) = &settings.chat_template {
        return Ok(Some(ChatTemplate::from_file(
            file,
            bos.as_deref(),
            eos.as_deref(),
        )?));
    }
    let Some((source, path)) = config
        .map(|config| config.chat_template())
        .transpose()?
        .flatten()
    else {
        return Ok(None);
    };
    let name = if path.ends_with(TOKENIZER_CONFIG_FILE) {
        format!("{} chat_template", path.display())
    } else {
        path.display().to_string()
    };
    Ok(Some(ChatTemplate::new(
        name,
        source,
        bos.as_deref(),
        eos.as_deref(),
    )?))
}

/// The examples of one file, encoded as the settings say.
pub fn load(
    path: &Path,
    settings: &SftSettings,
    tokenizer: &dyn Tokenizer,
    template: Option<&ChatTemplate>,
) -> anyhow::Result<SftSet> {
    let encoder = SftEncoder::new(tokenizer, template, settings.mask_prompt);
    Ok(load_sft_file(path, &settings.keys, &encoder)?)
}

/// The rows of a set, with a warning for the examples cut or left out (as mlx-lm warns).
pub fn rows(set: &SftSet, seq_len: usize, batching: Batching) -> anyhow::Result<SftRows> {
    let (rows, stats) = SftRows::new(&set.examples, seq_len, batching)?;
    warn(&set.path, seq_len, stats);
    if stats.kept_targets == 0 {
        anyhow::bail!(
            "{}: no example has a target the loss counts within {seq_len} tokens",
            set.path.display()
        );
    }
    Ok(rows)
}

fn warn(path: &Path, seq_len: usize, stats: RowStats) {
    if stats.truncated > 0 {
        eprintln!(
            "warning: {}: {} example(s) longer than {} tokens cut to that length (a longer \
             --seq-len, or examples split beforehand, keeps them whole)",
            path.display(),
            stats.truncated,
            seq_len + 1
        );
    }
    if stats.dropped > 0 {
        eprintln!(
            "warning: {}: {} example(s) left out: their prompt fills all {} tokens",
            path.display(),
            stats.dropped,
            seq_len + 1
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmx::runtime::data::sft::minijinja;

    fn settings(chat_template: Option<PathBuf>) -> SftSettings {
        SftSettings {
            mask_prompt: true,
            batching: Batching::Pad,
            chat_template,
            keys: SftKeys::default(),
        }
    }

    fn hi() -> Vec<minijinja::Value> {
        vec![minijinja::Value::from_iter([
            ("role", "user"),
            ("content", "hi"),
        ])]
    }

    /// The template and special tokens of the `tokenizer_config.json` beside the tokenizer: a
    /// token as a string or as an added token's object; `--chat-template` takes precedence.
    #[test]
    fn the_template_comes_from_tokenizer_config_json_or_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"}"#,
        )
        .unwrap();
        let tokenizer = dir.path().join("tokenizer.json");
        let template = template(&settings(None), Some(&tokenizer))
            .unwrap()
            .unwrap();
        assert_eq!(template.render(&hi(), None, false).unwrap(), "<s>[hi]</s>");
        let file = dir.path().join("mine.jinja");
        std::fs::write(&file, "{{ eos_token }}{{ messages[0].content }}").unwrap();
        let template = template_of(Some(file), &tokenizer);
        assert_eq!(template.render(&hi(), None, false).unwrap(), "</s>hi");
        assert!(super::template(&settings(None), None).unwrap().is_none());
    }

    fn template_of(file: Option<PathBuf>, tokenizer: &Path) -> ChatTemplate {
        template(&settings(file), Some(tokenizer)).unwrap().unwrap()
    }

    #[test]
    fn a_list_of_named_templates_gives_the_default() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "chat"}]}"#,
        )
        .unwrap();
        let template = template_of(None, &dir.path().join("tokenizer.json"));
        assert_eq!(template.render(&hi(), None, false).unwrap(), "chat");
    }
}
