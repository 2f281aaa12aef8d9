//! Preference pairs for DPO: JSONL lines `{"prompt": .., "chosen": .., "rejected": ..}`, each
//! response encoded after the prompt as a supervised completion is (through the chat template
//! where there is one, prompt masked, ending with the end-of-sequence id), and laid out as one
//! row of `2 · seq_len` ids: the chosen sequence, then the rejected one.

use std::path::{Path, PathBuf};

use super::error::{DataError, TokenOrigin};
use super::rows::Rows;
use super::sft::{Example, SftEncoder, Tokenized};
use crate::nn::IGNORE_TARGET;

/// One pair, encoded, with the line it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePair {
    /// The line, counted from 1.
    pub line: usize,
    /// The prompt and the preferred response.
    pub chosen: Tokenized,
    /// The prompt and the dispreferred response.
    pub rejected: Tokenized,
}

/// Reads every pair of `path`; the first bad line is an error naming the file, the line and
/// the cause. `encoder` must mask the prompt: DPO compares responses only.
pub fn read_preferences(
    path: &Path,
    encoder: &SftEncoder<'_>,
) -> Result<Vec<PreferencePair>, DataError> {
    if !encoder.masks_prompt() {
        return Err(DataError::InvalidSetting(
            "preference pairs are encoded with the prompt masked".into(),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|cause| DataError::Io {
        path: path.to_owned(),
        cause,
    })?;
    let bad = |line: usize, reason: String| DataError::Jsonl {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut pairs = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(raw).map_err(|err| bad(line, format!("invalid JSON: {err}")))?;
        let field = |key: &str| -> Result<String, DataError> {
            match value.get(key) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(bad(line, format!("`{key}` is not a string"))),
                None => Err(bad(
                    line,
                    format!("no `{key}`: a preference pair has `prompt`, `chosen` and `rejected`"),
                )),
            }
        };
        let prompt = field("prompt")?;
        let encode = |key: &str| -> Result<Tokenized, DataError> {
            let completion = field(key)?;
            if completion.is_empty() {
                return Err(bad(line, format!("`{key}` is empty")));
            }
            let example = Example::Completion {
                prompt: prompt.clone(),
                completion,
            };
            encoder
                .encode(&example)
                .map_err(|fault| bad(line, format!("`{key}`: {fault}")))
        };
        let (chosen, rejected) = (encode("chosen")?, encode("rejected")?);
        pairs.push(PreferencePair {
            line,
            chosen,
            rejected,
        });
    }
    if pairs.is_empty() {
        return Err(DataError::InvalidSetting(format!(
            "{} holds no preference pair",
            path.display()
        )));
    }
    Ok(pairs)
}

/// Pairs as rows of `2 · seq_len` inputs and targets: the chosen sequence's first `seq_len`
/// inputs and targets, then the rejected one's, each cut after `seq_len` and padded with id 0
/// and ignored targets; the prompt's targets are ignored too, so a row's kept targets are its
/// two responses.
#[derive(Debug, Clone)]
pub struct PreferenceRows {
    pairs: Vec<PreferencePair>,
    seq_len: usize,
}

impl PreferenceRows {
    /// The rows of `pairs` (read from `path`) at `seq_len` ids per response.
    ///
    /// # Errors
    /// [`DataError::Jsonl`] naming the line of a pair whose prompt leaves no response token
    /// within `seq_len`.
    pub fn new(path: &Path, pairs: Vec<PreferencePair>, seq_len: usize) -> Result<Self, DataError> {
        for pair in &pairs {
            for (key, side) in [("chosen", &pair.chosen), ("rejected", &pair.rejected)] {
                // Target `j` predicts id `j + 1`; the first response id is id `prompt_len`.
                if side.prompt_len.max(1) > seq_len || side.ids.len() < 2 {
                    return Err(DataError::Jsonl {
                        path: PathBuf::from(path),
                        line: pair.line,
                        reason: format!(
                            "`{key}`: its prompt of {} tokens leaves no response token within \
                             seq_len {seq_len}",
                            side.prompt_len
                        ),
                    });
                }
            }
        }
        Ok(PreferenceRows { pairs, seq_len })
    }

    /// One response's `seq_len` inputs and targets.
    fn lay_out(&self, side: &Tokenized, inputs: &mut [i32], targets: &mut [i32]) {
        inputs.fill(0);
        targets.fill(IGNORE_TARGET);
        let ids = &side.ids;
        for j in 0..(ids.len() - 1).min(self.seq_len) {
            inputs[j] = ids[j] as i32;
            if j + 1 >= side.prompt_len {
                targets[j] = ids[j + 1] as i32;
            }
        }
    }
}

impl Rows for PreferenceRows {
    fn count(&self) -> usize {
        self.pairs.len()
    }

    fn seq_len(&self) -> usize {
        2 * self.seq_len
    }

    fn read(&self, index: usize, inputs: &mut [i32], targets: &mut [i32]) -> Result<(), DataError> {
        let pair = &self.pairs[index];
        let (chosen_inputs, rejected_inputs) = inputs.split_at_mut(self.seq_len);
        let (chosen_targets, rejected_targets) = targets.split_at_mut(self.seq_len);
        self.lay_out(&pair.chosen, chosen_inputs, chosen_targets);
        self.lay_out(&pair.rejected, rejected_inputs, rejected_targets);
        Ok(())
    }

    fn check_vocab(&self, vocab_size: usize) -> Result<(), DataError> {
        let ids = self
            .pairs
            .iter()
            .flat_map(|pair| pair.chosen.ids.iter().chain(&pair.rejected.ids));
        for (position, &id) in ids.enumerate() {
            if id as usize >= vocab_size {
                return Err(DataError::OutOfVocab {
                    origin: TokenOrigin::Memory,
                    position: position as u64,
                    id,
                    vocab_size,
                });
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "{} preference pairs of {} tokens a response",
            self.pairs.len(),
            self.seq_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ByteTokenizer;

    fn read(text: &str) -> Result<Vec<PreferencePair>, DataError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("prefs.jsonl");
        std::fs::write(&path, text).expect("write");
        let tokenizer = ByteTokenizer::with_eos();
        read_preferences(&path, &SftEncoder::new(&tokenizer, None, true)).map_err(|err| {
            // The messages name the file; tests compare what follows it.
            let message = err.to_string();
            let at = message.find("prefs.jsonl").expect("the file named") + "prefs.jsonl".len();
            DataError::InvalidSetting(message[at..].to_owned())
        })
    }

    fn error(text: &str) -> String {
        match read(text) {
            Err(DataError::InvalidSetting(rest)) => rest,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn bad_lines_are_named_with_their_cause() {
        let good = r#"{"prompt": "ab", "chosen": "c", "rejected": "d"}"#;
        assert_eq!(
            error(&format!(
                "{good}\n{{\"prompt\": \"ab\", \"chosen\": \"c\"}}\n"
            )),
            ":2: no `rejected`: a preference pair has `prompt`, `chosen` and `rejected`"
        );
        assert_eq!(
            error(r#"{"prompt": "ab", "chosen": 3, "rejected": "d"}"#),
            ":1: `chosen` is not a string"
        );
        assert_eq!(
            error(r#"{"prompt": "ab", "chosen": "", "rejected": "d"}"#),
            ":1: `chosen` is empty"
        );
        assert!(error("\n[1, 2]\n").starts_with(":2: "));
        assert_eq!(error("\n\n"), " holds no preference pair");
    }

    #[test]
    fn rows_hold_the_chosen_then_the_rejected_response_with_the_prompt_masked() {
        let pairs = read(r#"{"prompt": "ab", "chosen": "c", "rejected": "de"}"#).expect("pairs");
        let rows = PreferenceRows::new(Path::new("prefs.jsonl"), pairs, 4).expect("rows");
        assert_eq!(rows.seq_len(), 8);
        let (mut inputs, mut targets) = ([0; 8], [0; 8]);
        rows.read(0, &mut inputs, &mut targets).expect("read");
        let (a, b, c, d, e, eos) = (97, 98, 99, 100, 101, 256);
        assert_eq!(inputs, [a, b, c, 0, a, b, d, e]);
        assert_eq!(targets, [-100, c, eos, -100, -100, d, e, eos]);
        let pairs = read(r#"{"prompt": "abcdef", "chosen": "c", "rejected": "d"}"#).expect("pairs");
        let err = PreferenceRows::new(Path::new("prefs.jsonl"), pairs, 4).expect_err("too long");
        assert_eq!(
            err.to_string(),
            "prefs.jsonl:1: `chosen`: its prompt of 6 tokens leaves no response token within \
             seq_len 4"
        );
    }
}
