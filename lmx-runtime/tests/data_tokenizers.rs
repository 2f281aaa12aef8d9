//! The byte-level and Hugging Face tokenizers behind the `Tokenizer` trait.

use std::path::PathBuf;

use lmx_runtime::data::rng::SplitMix64;
use lmx_runtime::data::{ByteTokenizer, DataError, HfTokenizer, Tokenizer};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::AddedToken;

const SAMPLES: &[&str] = &[
    "",
    "To be, or not to be, that is the question:",
    "naïve café — ünïcödé\n\ttabs and  spaces",
    "日本語のテキスト, 中文, 한국어, Ελληνικά, עברית, العربية",
    "emoji 🦀🧪👩‍👩‍👧 and a combining e\u{301}",
];

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("data_tokenizers")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn byte_tokenizer_round_trips_text_exactly() {
    let tokenizer = ByteTokenizer::new();
    for text in SAMPLES {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids.len(), text.len(), "one id per UTF-8 byte of {text:?}");
        assert!(ids
            .iter()
            .zip(text.bytes())
            .all(|(&id, b)| id == u32::from(b)));
        assert_eq!(tokenizer.decode(&ids).unwrap(), *text);
    }
}

#[test]
fn byte_tokenizer_round_trips_arbitrary_bytes() {
    let tokenizer = ByteTokenizer::new();
    let every_byte: Vec<u8> = (0..=255).collect();
    assert_eq!(
        tokenizer
            .decode_bytes(&tokenizer.encode_bytes(&every_byte))
            .unwrap(),
        every_byte
    );
    let mut rng = SplitMix64::new(7);
    let noise: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
    assert_eq!(
        tokenizer
            .decode_bytes(&tokenizer.encode_bytes(&noise))
            .unwrap(),
        noise
    );
}

#[test]
fn byte_tokenizer_decodes_a_cut_character_lossily() {
    let tokenizer = ByteTokenizer::new();
    let ids = tokenizer.encode("é").unwrap();
    assert_eq!(ids.len(), 2);
    assert_eq!(tokenizer.decode(&ids[..1]).unwrap(), "\u{FFFD}");
    assert_eq!(tokenizer.decode_bytes(&ids[..1]).unwrap(), vec![0xC3]);
}

#[test]
fn byte_tokenizer_special_ids() {
    let plain = ByteTokenizer::new();
    assert_eq!(
        (plain.vocab_size(), plain.eos_id(), plain.bos_id()),
        (256, None, None)
    );
    assert!(matches!(
        plain.decode(&[65, 256]),
        Err(DataError::UnknownToken {
            id: 256,
            vocab_size: 256
        })
    ));

    let with_eos = ByteTokenizer::with_eos();
    assert_eq!(with_eos.vocab_size(), 257);
    assert_eq!(with_eos.eos_id(), Some(ByteTokenizer::EOS_ID));
    assert_eq!(
        with_eos
            .decode(&[72, 105, ByteTokenizer::EOS_ID, 33])
            .unwrap(),
        "Hi!"
    );
    assert!(with_eos.decode(&[257]).is_err());
}

/// A byte-level BPE (GPT-2 style) trained here on a few lines, with `<|endoftext|>`.
fn trained_byte_level_bpe() -> tokenizers::Tokenizer {
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(300)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .build()
        .into();
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    tokenizer
        .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
        .with_decoder(Some(ByteLevel::new(false, true, true)));
    let lines = [
        "To be, or not to be, that is the question:",
        "Whether 'tis nobler in the mind to suffer",
        "The slings and arrows of outrageous fortune,",
        "Or to take arms against a sea of troubles",
    ];
    tokenizer.train(&mut trainer, lines.iter()).unwrap();
    tokenizer
}

#[test]
fn hf_byte_level_bpe_from_a_saved_tokenizer_json() {
    let dir = scratch("bpe");
    let path = dir.join("tokenizer.json");
    let reference = trained_byte_level_bpe();
    reference.save(&path, false).unwrap();

    let tokenizer = HfTokenizer::from_file(&path).unwrap();
    let eos = reference.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tokenizer.eos_id(), Some(eos));
    assert_eq!(tokenizer.bos_id(), None);
    assert_eq!(tokenizer.vocab_size(), reference.get_vocab_size(true));
    assert!(tokenizer.vocab_size() > 256, "merges were learned");

    for text in SAMPLES {
        let ids = tokenizer.encode(text).unwrap();
        let expected = reference.encode(*text, false).unwrap();
        assert_eq!(ids, expected.get_ids());
        assert_eq!(tokenizer.decode(&ids).unwrap(), *text, "round trip");
    }
    let common = tokenizer.encode("to be or not to be").unwrap();
    assert!(common.len() < "to be or not to be".len(), "merges apply");

    let mut with_eos = tokenizer.encode("the end").unwrap();
    with_eos.push(eos);
    assert_eq!(
        tokenizer.decode(&with_eos).unwrap(),
        "the end",
        "special tokens are left out"
    );
    let past = tokenizer.vocab_size() as u32;
    assert!(matches!(
        tokenizer.decode(&[past]),
        Err(DataError::UnknownToken { id, .. }) if id == past
    ));
}

#[test]
fn hf_word_level_ids_and_named_special_tokens() {
    let vocab = [
        ("[UNK]", 0),
        ("[BOS]", 1),
        ("[END]", 2),
        ("the", 3),
        ("cat", 4),
        ("sat", 5),
    ];
    let model = WordLevel::builder()
        .vocab(
            vocab
                .iter()
                .map(|&(word, id)| (word.to_owned(), id))
                .collect(),
        )
        .unk_token("[UNK]".to_owned())
        .build()
        .unwrap();
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(Whitespace {}));
    let json = inner.to_string(false).unwrap();

    let tokenizer = HfTokenizer::from_json(json.as_bytes()).unwrap();
    assert_eq!(tokenizer.eos_id(), None, "no usual name in this vocabulary");
    assert_eq!(tokenizer.encode("the cat sat").unwrap(), vec![3, 4, 5]);
    assert_eq!(tokenizer.encode("the dog").unwrap(), vec![3, 0]);
    assert_eq!(tokenizer.vocab_size(), 6);

    let tokenizer = tokenizer
        .with_eos("[END]")
        .unwrap()
        .with_bos("[BOS]")
        .unwrap();
    assert_eq!((tokenizer.eos_id(), tokenizer.bos_id()), (Some(2), Some(1)));
    let missing = tokenizer.with_eos("</s>").unwrap_err();
    assert_eq!(missing.to_string(), "the tokenizer has no token \"</s>\"");
}

#[test]
fn hf_load_errors_name_the_file() {
    let dir = scratch("bad");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, b"{\"model\": 42}").unwrap();
    let message = HfTokenizer::from_file(&path).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!("tokenizer: loading {}: ", path.display())),
        "{message}"
    );

    let absent = dir.join("absent.json");
    let error = HfTokenizer::from_file(&absent).unwrap_err();
    assert!(matches!(&error, DataError::Io { path, .. } if *path == absent));
    assert!(error.to_string().starts_with(&absent.display().to_string()));
}

#[test]
fn splitmix64_matches_the_reference_outputs() {
    // The first outputs of Vigna's splitmix64.c seeded with 1234567 (as published on Rosetta Code).
    let mut rng = SplitMix64::new(1234567);
    let expected = [
        6457827717110365317u64,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ];
    for value in expected {
        assert_eq!(rng.next_u64(), value);
    }
}

#[test]
fn splitmix64_below_is_in_range_and_covers_it() {
    let mut rng = SplitMix64::new(3);
    let mut seen = [0usize; 7];
    for _ in 0..7000 {
        seen[rng.below(7) as usize] += 1;
    }
    assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
}
