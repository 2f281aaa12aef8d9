//! Token ids reach an embedding only if they are below the model's vocabulary: token files,
//! tokenizer output and prompts are checked, with errors naming where the id is.

use lmx_runtime::data::{write_token_file, HfTokenizer, TokenDtype, TokenFile, Tokenizer, Windows};
use lmx_runtime::generate::{generate, Sampling};
use lmx_runtime::model::{Context, LanguageModel, TrainingStep};
use lmx_runtime::nn::{self, init::Keys, EmbeddingParams};
use lmx_runtime::optim::AdamW;
use lmx_runtime::step::StepOptions;
use lmx_runtime::train::{TrainConfig, Trainer};
use lmx_runtime::{Array, Result};
use std::path::Path;
use std::sync::Arc;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;

/// A bigram model over 257 ids (bytes and an end-of-text id), with a context of 16.
struct Bigram;

impl LanguageModel for Bigram {
    type Config = usize;
    type Params = EmbeddingParams;
    const NAME: &'static str = "bigram";

    fn presets() -> &'static [&'static str] {
        &["bytes"]
    }

    fn preset(name: &str) -> Option<usize> {
        (name == "bytes").then_some(257)
    }

    fn init(vocab: &usize, seed: u64) -> Result<EmbeddingParams> {
        nn::init::embedding(*vocab as i32, *vocab as i32, &mut Keys::from_seed(seed)?)
    }

    fn forward(
        params: &EmbeddingParams,
        _: &usize,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array> {
        ctx.advance(tokens.shape()[1]);
        nn::embedding(params, tokens)
    }

    fn vocab_size(vocab: &usize) -> usize {
        *vocab
    }

    fn context_len(_: &usize) -> usize {
        16
    }
}

struct Train;

impl TrainingStep for Train {
    type Model = Bigram;
    type Optimizer = AdamW;
    const NAME: &'static str = "train";

    fn optimizer() -> AdamW {
        AdamW::default()
    }

    fn options() -> StepOptions {
        StepOptions::default()
    }

    fn loss(
        params: &EmbeddingParams,
        config: &usize,
        batch: &[Array],
        _: Option<&Array>,
    ) -> Result<Array> {
        let logits = Bigram::forward(params, config, &batch[0], &mut Context::evaluation())?;
        nn::cross_entropy(&logits, &batch[1])
    }
}

fn config(out_dir: &Path) -> TrainConfig {
    TrainConfig {
        steps: 2,
        batch_size: 2,
        seq_len: 8,
        out_dir: out_dir.to_path_buf(),
        ..TrainConfig::default()
    }
}

/// The error of building a trainer for the bigram model over `windows`.
fn trainer_error(windows: Windows) -> String {
    let dir = tempfile::tempdir().unwrap();
    match Trainer::<Train>::new(257, config(dir.path()), windows) {
        Ok(_) => panic!("the trainer accepted ids outside the vocabulary"),
        Err(err) => err.to_string(),
    }
}

/// 200 valid ids, with `bad` at position 137 (in the part validation would hold out).
fn tokens_with(bad: u32) -> Vec<u32> {
    let mut tokens: Vec<u32> = (0..200).map(|i| i * 31 % 257).collect();
    tokens[137] = bad;
    tokens
}

#[test]
fn a_token_file_id_at_or_past_the_vocabulary_is_an_error_naming_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [257, 300, 60_000] {
        let path = dir.path().join(format!("bad-{bad}.tokens"));
        write_token_file(&path, TokenDtype::U16, &tokens_with(bad)).unwrap();
        let windows = Windows::new(Arc::new(TokenFile::open(&path).unwrap()), 8).unwrap();
        assert_eq!(
            trainer_error(windows),
            format!(
                "{}: token 137 is id {bad}, outside the model's vocabulary of 257 ids",
                path.display()
            )
        );
    }
    let good = dir.path().join("good.tokens");
    write_token_file(&good, TokenDtype::U16, &tokens_with(256)).unwrap();
    let windows = Windows::new(Arc::new(TokenFile::open(&good).unwrap()), 8).unwrap();
    assert!(Trainer::<Train>::new(257, config(dir.path()), windows).is_ok());
}

#[test]
fn a_split_checks_only_its_own_tokens_and_names_the_position_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corpus.tokens");
    write_token_file(&path, TokenDtype::U32, &tokens_with(1 << 20)).unwrap();
    let split = Windows::new(Arc::new(TokenFile::open(&path).unwrap()), 8)
        .unwrap()
        .split(0.5)
        .unwrap();
    split.train.check_vocab(257).unwrap();
    let err = split.validation.unwrap().check_vocab(257).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: token 137 is id 1048576, outside the model's vocabulary of 257 ids",
            path.display()
        )
    );
}

/// A word-level tokenizer whose ids reach 300, past the bigram model's 257.
fn wide_tokenizer() -> HfTokenizer {
    let vocab = [("[UNK]", 0), ("the", 3), ("cat", 299), ("sat", 5)];
    let model = WordLevel::builder()
        .vocab(vocab.iter().map(|&(w, id)| (w.to_owned(), id)).collect())
        .unk_token("[UNK]".to_owned())
        .build()
        .unwrap();
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(Whitespace {}));
    HfTokenizer::from_json(inner.to_string(false).unwrap().as_bytes()).unwrap()
}

#[test]
fn tokenizer_output_past_the_vocabulary_is_an_error_naming_its_position() {
    let tokenizer = wide_tokenizer();
    assert_eq!(tokenizer.vocab_size(), 300);
    let text = "the sat ".repeat(10) + "cat " + &"sat the ".repeat(10);
    let tokens = tokenizer.encode(&text).unwrap();
    let position = tokens.iter().position(|&id| id == 299).unwrap();
    let windows = Windows::new(Arc::new(tokens), 8).unwrap();
    assert_eq!(
        trainer_error(windows),
        format!("the token stream: token {position} is id 299, outside the model's vocabulary of 257 ids")
    );
}

#[test]
fn a_prompt_past_the_vocabulary_or_the_context_and_bad_sampling_settings_are_errors() {
    let params = Bigram::init(&257, 0).unwrap();
    let run = |prompt: &[u32], sampling: Sampling| {
        let mut seen = Vec::new();
        let result = generate::<Bigram>(&params, &257, prompt, &sampling, None, |t| seen.push(t));
        assert!(seen.is_empty(), "nothing is generated before the error");
        result.unwrap_err().to_string()
    };
    assert_eq!(
        run(&[72, 105, 300], Sampling::default()),
        "the prompt: token 2 is id 300, outside the model's vocabulary of 257 ids"
    );
    assert_eq!(
        run(&[65; 17], Sampling::default()),
        "configuration: the prompt has 17 tokens, more than the model's context of 16"
    );
    let with = |change: fn(&mut Sampling)| {
        let mut sampling = Sampling::default();
        change(&mut sampling);
        sampling
    };
    let cases: [(Sampling, &str); 7] = [
        (
            with(|s| s.temperature = -1.0),
            "temperature is -1; it must be 0 (greedy) or a finite positive number",
        ),
        (
            with(|s| s.temperature = f32::NAN),
            "temperature is NaN; it must be 0 (greedy) or a finite positive number",
        ),
        (
            with(|s| s.top_p = Some(0.0)),
            "top_p is 0; it must be in (0, 1]",
        ),
        (
            with(|s| s.top_p = Some(-0.5)),
            "top_p is -0.5; it must be in (0, 1]",
        ),
        (
            with(|s| s.top_p = Some(1.5)),
            "top_p is 1.5; it must be in (0, 1]",
        ),
        (
            with(|s| s.top_p = Some(f32::NAN)),
            "top_p is NaN; it must be in (0, 1]",
        ),
        (
            with(|s| s.top_k = Some(0)),
            "top_k is 0; it must be at least 1 (or none, to keep every token)",
        ),
    ];
    for (sampling, message) in cases {
        assert_eq!(run(&[65], sampling), message);
    }
    let fine = generate::<Bigram>(&params, &257, &[65; 16], &Sampling::default(), None, |_| ());
    assert!(
        matches!(fine, Ok(g) if g.tokens.is_empty()),
        "a prompt filling the context leaves no room, without error"
    );
}
