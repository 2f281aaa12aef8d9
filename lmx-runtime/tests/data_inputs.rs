//! Text and JSONL inputs, document separators, and the bundled corpus.

use std::path::{Path, PathBuf};

use lmx_runtime::data::{
    read_documents, ByteTokenizer, DataError, DocumentEncoder, InputFormat, Separator, TokenDtype,
    TokenFile, TokenFileWriter, Tokenizer,
};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("data_inputs")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare.txt")
}

fn documents(path: &Path, format: &InputFormat) -> Result<Vec<String>, DataError> {
    read_documents(path, format)?.collect()
}

#[test]
fn a_text_file_is_one_document() {
    let dir = scratch("text");
    let path = dir.join("a.txt");
    std::fs::write(&path, "first line\n\nsecond paragraph\n").unwrap();
    assert_eq!(
        documents(&path, &InputFormat::Text).unwrap(),
        ["first line\n\nsecond paragraph\n"]
    );
    assert_eq!(InputFormat::from_path(&path), InputFormat::Text);
}

#[test]
fn jsonl_documents_from_the_default_and_a_named_field() {
    let dir = scratch("jsonl");
    let path = dir.join("docs.jsonl");
    std::fs::write(
        &path,
        concat!(
            "{\"text\": \"Hello\\nworld\", \"id\": 1, \"content\": \"x\"}\n",
            "\n",
            "   \n",
            "{\"id\": 2, \"text\": \"caf\\u00e9 \\ud83e\\udd80\", \"content\": \"y\"}\n",
            "{\"text\": \"\", \"content\": \"z\"}",
        ),
    )
    .unwrap();
    assert_eq!(InputFormat::from_path(&path), InputFormat::jsonl());
    assert_eq!(
        documents(&path, &InputFormat::jsonl()).unwrap(),
        ["Hello\nworld", "café 🦀", ""]
    );
    let content = InputFormat::Jsonl {
        field: "content".into(),
    };
    assert_eq!(documents(&path, &content).unwrap(), ["x", "y", "z"]);
}

#[test]
fn jsonl_errors_name_the_file_and_line() {
    let dir = scratch("jsonl_errors");
    let path = dir.join("bad.jsonl");
    let cases = [
        ("{\"body\": \"no text\"}", "no field \"text\""),
        (
            "{\"text\": 42}",
            "field \"text\" is not a string but a number",
        ),
        ("[\"text\"]", "not a JSON object"),
        ("{\"text\": \"unterminated}", "invalid JSON: "),
    ];
    for (line, reason) in cases {
        std::fs::write(&path, format!("{{\"text\": \"fine\"}}\n\n{line}\n")).unwrap();
        let mut docs = read_documents(&path, &InputFormat::jsonl()).unwrap();
        assert_eq!(docs.next().unwrap().unwrap(), "fine");
        let error = docs.next().unwrap().unwrap_err();
        assert!(
            matches!(&error, DataError::Jsonl { path: named, line: 3, .. } if *named == path),
            "{error}"
        );
        let expected = format!("{}:3: {reason}", path.display());
        assert!(error.to_string().starts_with(&expected), "{error}");
    }
    let absent = dir.join("absent.jsonl");
    let error = read_documents(&absent, &InputFormat::jsonl()).unwrap_err();
    assert!(error.to_string().starts_with(&absent.display().to_string()));
}

#[test]
fn each_document_is_followed_by_the_separator() {
    let dir = scratch("separator");
    let first = dir.join("one.jsonl");
    let second = dir.join("two.jsonl");
    std::fs::write(&first, "{\"text\": \"ab\"}\n{\"text\": \"c\"}\n").unwrap();
    std::fs::write(&second, "{\"text\": \"d\"}\n").unwrap();
    let paths = [&first, &second];
    let format = InputFormat::jsonl();
    let tokenizer = ByteTokenizer::with_eos();
    let eos = ByteTokenizer::EOS_ID;
    let (a, b, c, d) = (97, 98, 99, 100);

    let encoder = DocumentEncoder::new(&tokenizer, Separator::Eos).unwrap();
    assert_eq!(
        encoder.encode_files(&paths, &format).unwrap(),
        [a, b, eos, c, eos, d, eos]
    );
    let newline = DocumentEncoder::new(&tokenizer, Separator::Token(10)).unwrap();
    assert_eq!(
        newline.encode_files(&paths, &format).unwrap(),
        [a, b, 10, c, 10, d, 10]
    );
    let nothing = DocumentEncoder::new(&tokenizer, Separator::Nothing).unwrap();
    assert_eq!(nothing.encode_files(&paths, &format).unwrap(), [a, b, c, d]);
}

#[test]
fn separator_errors() {
    let plain = ByteTokenizer::new();
    assert!(matches!(
        DocumentEncoder::new(&plain, Separator::Eos),
        Err(DataError::NoEosToken)
    ));
    assert!(matches!(
        DocumentEncoder::new(&plain, Separator::Token(256)),
        Err(DataError::UnknownToken {
            id: 256,
            vocab_size: 256
        })
    ));
}

#[test]
fn streaming_into_a_token_file_equals_encoding_in_memory() {
    let dir = scratch("stream");
    let path = dir.join("corpus.jsonl");
    let lines: Vec<String> = (0..200)
        .map(|i| {
            serde_json::json!({ "text": format!("document {i}: {}", "ab".repeat(i % 7)) })
                .to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let tokenizer = ByteTokenizer::with_eos();
    let encoder = DocumentEncoder::new(&tokenizer, Separator::Eos).unwrap();
    let in_memory = encoder
        .encode_files(&[&path], &InputFormat::jsonl())
        .unwrap();

    let out = dir.join("corpus.tok");
    let mut writer =
        TokenFileWriter::create(&out, TokenDtype::for_vocab(tokenizer.vocab_size())).unwrap();
    encoder
        .encode_files_into(&[&path], &InputFormat::jsonl(), &mut writer)
        .unwrap();
    writer.finish().unwrap();
    let file = TokenFile::open(&out).unwrap();
    assert_eq!(file.iter().collect::<Vec<_>>(), in_memory);
    let documents = in_memory
        .iter()
        .filter(|&&id| id == ByteTokenizer::EOS_ID)
        .count();
    assert_eq!(documents, 200);
}

#[test]
fn the_bundled_corpus_round_trips_through_the_byte_tokenizer() {
    let text = std::fs::read_to_string(corpus()).unwrap();
    assert!(
        (1_000_000..1_200_000).contains(&text.len()),
        "about 1 MB: {}",
        text.len()
    );
    assert!(text.starts_with("HAMLET, PRINCE OF DENMARK"));
    assert!(text.contains("To be, or not to be"));
    let tokenizer = ByteTokenizer::new();
    let encoder = DocumentEncoder::new(&tokenizer, Separator::Nothing).unwrap();
    let ids = encoder
        .encode_files(&[corpus()], &InputFormat::from_path(corpus()))
        .unwrap();
    assert_eq!(ids.len(), text.len());
    assert_eq!(tokenizer.decode(&ids).unwrap(), text);
}
