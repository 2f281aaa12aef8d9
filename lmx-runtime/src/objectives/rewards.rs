//! GRPO's reward functions for verifiable tasks: built-ins (an exact answer, a format by regular
//! expression, a length) and any Rust closure, scored on each decoded completion.

use crate::error::{Error, Result};
use mlx_rs::Array;

/// A reward of one completion, given the prompt's reference answer where the task has one.
pub trait Reward {
    /// The completion's reward.
    fn score(&self, completion: &str, answer: Option<&str>) -> f32;
}

impl<F: Fn(&str, Option<&str>) -> f32> Reward for F {
    fn score(&self, completion: &str, answer: Option<&str>) -> f32 {
        self(completion, answer)
    }
}

/// 1 where the completion, trimmed, is the answer, trimmed; else 0 (and 0 without an answer).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExactAnswer;

impl Reward for ExactAnswer {
    fn score(&self, completion: &str, answer: Option<&str>) -> f32 {
        let right = answer.is_some_and(|answer| completion.trim() == answer.trim());
        f32::from(u8::from(right))
    }
}

/// 1 where the whole completion matches a regular expression; else 0.
#[derive(Clone, Debug)]
pub struct Format(regex::Regex);

impl Format {
    /// The format `pattern` describes, anchored at both ends.
    ///
    /// # Errors
    /// [`Error::Config`] naming the pattern and what is wrong with it.
    pub fn new(pattern: &str) -> Result<Self> {
        regex::Regex::new(&format!("^(?:{pattern})$"))
            .map(Format)
            .map_err(|err| Error::Config(format!("reward format `{pattern}`: {err}")))
    }
}

impl Reward for Format {
    fn score(&self, completion: &str, _: Option<&str>) -> f32 {
        f32::from(u8::from(self.0.is_match(completion)))
    }
}

/// `max(0, 1 - |chars - target| / target)`: 1 at the target length in characters, falling
/// linearly to 0 at no characters or twice the target.
#[derive(Clone, Copy, Debug)]
pub struct Length {
    /// The length that scores 1 (at least 1).
    pub target: usize,
}

impl Reward for Length {
    fn score(&self, completion: &str, _: Option<&str>) -> f32 {
        let target = self.target.max(1) as f32;
        let chars = completion.chars().count() as f32;
        (1.0 - (chars - target).abs() / target).max(0.0)
    }
}

/// The rewards `[B]` of `completions`, each with its prompt's answer (`answers` as long as
/// `completions`, or empty where the task has none).
///
/// # Errors
/// [`Error::Config`] when `answers` is neither empty nor as long as `completions`.
pub fn score_all(
    reward: &dyn Reward,
    completions: &[String],
    answers: &[Option<String>],
) -> Result<Array> {
    if !answers.is_empty() && answers.len() != completions.len() {
        return Err(Error::Config(format!(
            "{} answers for {} completions",
            answers.len(),
            completions.len()
        )));
    }
    let scores: Vec<f32> = completions
        .iter()
        .enumerate()
        .map(|(i, completion)| {
            let answer = answers.get(i).and_then(Option::as_deref);
            reward.score(completion, answer)
        })
        .collect();
    Ok(Array::from_slice(&scores, &[scores.len() as i32]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_score_verifiable_tasks() -> Result<()> {
        assert_eq!(ExactAnswer.score(" 42\n", Some("42")), 1.0);
        assert_eq!(ExactAnswer.score("41", Some("42")), 0.0);
        assert_eq!(ExactAnswer.score("42", None), 0.0);
        let format = Format::new(r"<answer>\d+</answer>")?;
        assert_eq!(format.score("<answer>17</answer>", None), 1.0);
        assert_eq!(format.score("so <answer>17</answer>", None), 0.0);
        assert_eq!(
            Format::new("(").unwrap_err().to_string().lines().next(),
            Some("configuration: reward format `(`: regex parse error:")
        );
        let length = Length { target: 4 };
        assert_eq!(
            ["abcd", "ab", "abcdef", "", "abcdefgh"].map(|c| length.score(c, None)),
            [1.0, 0.5, 0.5, 0.0, 0.0]
        );
        let reversed = |completion: &str, answer: Option<&str>| {
            let want: String = answer.unwrap_or_default().chars().rev().collect();
            f32::from(u8::from(completion == want))
        };
        let scores = score_all(
            &reversed,
            &["cba".into(), "abc".into()],
            &[Some("abc".into()), Some("abc".into())],
        )?;
        scores.eval()?;
        assert_eq!(scores.as_slice::<f32>(), [1.0, 0.0]);
        assert!(score_all(&ExactAnswer, &["a".into()], &[None, None]).is_err());
        Ok(())
    }
}
