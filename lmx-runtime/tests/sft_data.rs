//! Supervised fine-tuning data: the three JSONL formats, every bad line's message, published
//! chat templates rendered exactly as `transformers` renders them, prompt masking down to the
//! loss, and padded and packed rows.

use std::path::{Path, PathBuf};

use lmx_runtime::data::sft::{
    load_sft_dir, load_sft_file, read_examples, Batching, ChatTemplate, Example, SftEncoder,
    SftFormat, SftKeys, SftRows, Tokenized,
};
use lmx_runtime::data::{ByteTokenizer, Rows, Tokenizer};
use lmx_runtime::nn::{cross_entropy, IGNORE_TARGET};
use mlx_rs::Array;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn each_format_is_told_by_its_first_example() {
    let dir = tempfile::tempdir().unwrap();
    let keys = SftKeys::default();
    let text = write(
        dir.path(),
        "a.jsonl",
        "{\"text\": \"hello\"}\n\n{\"text\": \"again\"}\n",
    );
    let file = read_examples(&text, &keys).unwrap();
    assert_eq!(file.format, SftFormat::Text);
    assert_eq!(
        file.examples,
        vec![
            (1, Example::Text("hello".into())),
            (3, Example::Text("again".into()))
        ]
    );
    // Both a prompt and a completion make completions, even beside a text (mlx-lm's order).
    let completions = write(
        dir.path(),
        "b.jsonl",
        "{\"prompt\": \"2+2=\", \"completion\": \"4\", \"text\": \"x\"}\n",
    );
    let file = read_examples(&completions, &keys).unwrap();
    assert_eq!(file.format, SftFormat::Completions);
    assert_eq!(
        file.examples[0].1,
        Example::Completion {
            prompt: "2+2=".into(),
            completion: "4".into()
        }
    );
    let chat = write(
        dir.path(),
        "c.jsonl",
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#,
    );
    let file = read_examples(&chat, &keys).unwrap();
    assert_eq!(file.format, SftFormat::Chat);
    let Example::Chat { messages, tools } = &file.examples[0].1 else {
        panic!("not a chat: {:?}", file.examples[0].1);
    };
    assert_eq!(messages.len(), 2);
    assert!(tools.is_none());
    // Keys of one's own, as mlx-lm's prompt_feature and completion_feature.
    let own = write(
        dir.path(),
        "d.jsonl",
        "{\"question\": \"q\", \"answer\": \"a\"}\n",
    );
    let keys = SftKeys {
        prompt: "question".into(),
        completion: "answer".into(),
        ..SftKeys::default()
    };
    assert_eq!(
        read_examples(&own, &keys).unwrap().format,
        SftFormat::Completions
    );
}

#[test]
fn every_bad_line_is_named_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let keys = SftKeys::default();
    let cases: &[(&str, &str)] = &[
        ("{\"text\": \"a\"}\n{\"text\": \"b\"", ":2: invalid JSON: EOF while parsing an object at line 1 column 12"),
        ("[1, 2]\n", ":1: not a JSON object but an array"),
        ("{\"body\": \"a\"}\n", ":1: no key \"text\", \"messages\" or \"prompt\" with \"completion\": not an example of the text, chat or completions format"),
        ("{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n", ":2: no key \"text\" (text format, as the file's first example)"),
        ("{\"text\": 3}\n", ":1: \"text\" is a number, not a string"),
        ("{\"text\": \"\"}\n", ":1: \"text\" is empty"),
        ("{\"prompt\": \"p\", \"completion\": null}\n", ":1: \"completion\" is null, not a string"),
        ("{\"prompt\": \"p\", \"completion\": \"\"}\n", ":1: \"completion\" is empty"),
        ("{\"messages\": []}\n", ":1: \"messages\" is empty"),
        ("{\"messages\": {\"role\": \"user\"}}\n", ":1: \"messages\" is an object, not a list of messages"),
        ("{\"messages\": [\"hi\"]}\n", ":1: \"messages[0]\" is a string, not an object"),
        ("{\"messages\": [{\"content\": \"hi\"}]}\n", ":1: no key \"messages[0].role\" (chat format, as the file's first example)"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": 1, \"content\": \"x\"}]}\n", ":1: \"messages[1].role\" is a number, not a string"),
        ("{\"messages\": [{\"role\": \"user\"}]}\n", ":1: no key \"messages[0].content\" (chat format, as the file's first example)"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": 7}]}\n", ":1: \"messages[0].content\" is a number, not a string or a list"),
    ];
    for (index, (text, expected)) in cases.iter().enumerate() {
        let path = write(dir.path(), &format!("bad{index}.jsonl"), text);
        let error = read_examples(&path, &keys).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("{}{expected}", path.display()),
            "case {index}"
        );
    }
    let latin1 = dir.path().join("latin1.jsonl");
    std::fs::write(&latin1, b"{\"text\": \"a\"}\n{\"text\": \"caf\xe9\"}\n").unwrap();
    assert_eq!(
        read_examples(&latin1, &keys).unwrap_err().to_string(),
        format!(
            "{}:2: invalid JSON: stream did not contain valid UTF-8",
            latin1.display()
        )
    );
    let empty = write(dir.path(), "empty.jsonl", "\n\n");
    assert_eq!(
        read_examples(&empty, &keys).unwrap_err().to_string(),
        format!("invalid data setting: {} holds no example", empty.display())
    );
}

/// One case of `tests/fixtures/sft/templates.json`, written by `make_templates.py` with Jinja2
/// configured as `transformers` configures it.
#[derive(serde::Deserialize)]
struct TemplateFixture {
    name: String,
    template: String,
    bos_token: String,
    eos_token: String,
    cases: Vec<TemplateCase>,
}

#[derive(serde::Deserialize)]
struct TemplateCase {
    case: String,
    messages: minijinja::Value,
    tools: Option<minijinja::Value>,
    add_generation_prompt: bool,
    expected: Option<String>,
    error: Option<String>,
}

#[test]
fn published_templates_render_as_transformers_renders_them() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sft/templates.json");
    let fixtures: Vec<TemplateFixture> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for fixture in &fixtures {
        let template = ChatTemplate::new(
            fixture.name.as_str(),
            fixture.template.as_str(),
            Some(&fixture.bos_token),
            Some(&fixture.eos_token),
        )
        .unwrap();
        for case in &fixture.cases {
            let messages: Vec<minijinja::Value> = case.messages.try_iter().unwrap().collect();
            let tools = case.tools.as_ref().filter(|tools| !tools.is_none());
            let rendered = template.render(&messages, tools, case.add_generation_prompt);
            let label = format!(
                "{} {} {}",
                fixture.name, case.case, case.add_generation_prompt
            );
            match (&case.expected, &case.error) {
                (Some(expected), _) => assert_eq!(&rendered.unwrap(), expected, "{label}"),
                (None, Some(error)) => assert_eq!(
                    rendered.unwrap_err().to_string(),
                    format!("chat template {}: {error} (line 1)", fixture.name),
                    "{label}"
                ),
                (None, None) => panic!("{label}: the fixture has neither text nor error"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 30);
}

#[test]
fn a_template_that_does_not_compile_is_named() {
    let error = ChatTemplate::new("mine.jinja", "{% for m in messages %}{{ m }}", None, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("chat template mine.jinja: syntax error: unexpected end of input"),
        "{error}"
    );
}

/// The hand-made example: prompt `"2+2="` and completion `"4"` in bytes, then the
/// end-of-sequence id. With prompt masking the loss counts the targets `4` and EOS only: the
/// expected loss is computed here in f64 from the logits at those two positions alone.
#[test]
fn prompt_masking_leaves_the_prompt_out_of_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "train.jsonl",
        "{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n",
    );
    let tokenizer = ByteTokenizer::with_eos();
    let encoder = SftEncoder::new(&tokenizer, None, true);
    let set = load_sft_file(&path, &SftKeys::default(), &encoder).unwrap();
    let eos = ByteTokenizer::EOS_ID;
    let ids: Vec<u32> = b"2+2=4".iter().map(|&b| b as u32).chain([eos]).collect();
    assert_eq!(
        set.examples,
        vec![Tokenized {
            ids: ids.clone(),
            prompt_len: 4
        }]
    );
    let seq_len = 8;
    let (rows, stats) = SftRows::new(&set.examples, seq_len, Batching::Pad).unwrap();
    assert_eq!(stats.kept_targets, 2);
    let (mut inputs, mut targets) = (vec![0; seq_len], vec![0; seq_len]);
    rows.read(0, &mut inputs, &mut targets).unwrap();
    let i = |ids: &[u32]| ids.iter().map(|&id| id as i32).collect::<Vec<_>>();
    assert_eq!(inputs, [i(&ids), vec![0, 0]].concat());
    let x = IGNORE_TARGET;
    assert_eq!(targets, vec![x, x, x, '4' as i32, eos as i32, x, x, x]);

    let vocab = 257;
    let logits: Vec<f32> = (0..seq_len * vocab)
        .map(|k| ((k * 37 % 101) as f32 * 0.05).cos() * 4.0)
        .collect();
    let loss = cross_entropy(
        &Array::from_slice(&logits, &[1, seq_len as i32, vocab as i32]),
        &Array::from_slice(&targets, &[1, seq_len as i32]),
    )
    .unwrap()
    .item_exact::<f32>() as f64;
    // Position 3 (after "2+2=") predicts '4'; position 4 predicts EOS.
    let token_loss = |position: usize, target: usize| -> f64 {
        let row = &logits[position * vocab..(position + 1) * vocab];
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        max + sum.ln() - row[target] as f64
    };
    let expected = (token_loss(3, '4' as usize) + token_loss(4, eos as usize)) / 2.0;
    assert!((loss - expected).abs() < 1e-5, "{loss} vs {expected}");

    // Without masking every target of the example counts, and the loss is another.
    let unmasked = load_sft_file(
        &path,
        &SftKeys::default(),
        &SftEncoder::new(&tokenizer, None, false),
    )
    .unwrap();
    assert_eq!(unmasked.examples[0].prompt_len, 0);
    let (rows, stats) = SftRows::new(&unmasked.examples, seq_len, Batching::Pad).unwrap();
    assert_eq!(stats.kept_targets, 5);
    rows.read(0, &mut inputs, &mut targets).unwrap();
    assert_eq!(&targets[..5], &i(&ids[1..])[..]);
}

#[test]
fn a_chat_is_masked_up_to_its_last_message_through_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "train.jsonl",
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#,
    );
    let template = ChatTemplate::new(
        "chatml",
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
        None,
        None,
    )
    .unwrap();
    let tokenizer = ByteTokenizer::with_eos();
    let set = load_sft_file(
        &path,
        &SftKeys::default(),
        &SftEncoder::new(&tokenizer, Some(&template), true),
    )
    .unwrap();
    let text = "<user>hi\n<assistant>yo\n";
    let mut ids: Vec<u32> = text.bytes().map(u32::from).collect();
    ids.push(ByteTokenizer::EOS_ID);
    assert_eq!(set.examples[0].ids, ids);
    assert_eq!(set.examples[0].prompt_len, "<user>hi\n<assistant>".len());
    // A chat without a template, and a template that fails, name the line.
    let error = load_sft_file(
        &path,
        &SftKeys::default(),
        &SftEncoder::new(&tokenizer, None, true),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        format!(
            "{}:1: a chat example needs a chat template: the model folder's tokenizer_config.json, or --chat-template FILE",
            path.display()
        )
    );
    let strict = ChatTemplate::new(
        "strict",
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system message first') }}{% endif %}",
        None,
        None,
    )
    .unwrap();
    let error = load_sft_file(
        &path,
        &SftKeys::default(),
        &SftEncoder::new(&tokenizer, Some(&strict), false),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        format!(
            "{}:1: chat template strict: a system message first (line 1)",
            path.display()
        )
    );
}

#[test]
fn text_examples_cannot_be_prompt_masked() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "train.jsonl", "{\"text\": \"abc\"}\n");
    let tokenizer = ByteTokenizer::with_eos();
    let error = load_sft_file(
        &path,
        &SftKeys::default(),
        &SftEncoder::new(&tokenizer, None, true),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("prompt masking needs prompts"), "{error}");
}

#[test]
fn a_folder_holds_train_valid_and_test() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "train.jsonl", "{\"text\": \"abc\"}\n");
    write(dir.path(), "test.jsonl", "{\"text\": \"de\"}\n");
    let tokenizer = ByteTokenizer::with_eos();
    let data = load_sft_dir(
        dir.path(),
        &SftKeys::default(),
        &SftEncoder::new(&tokenizer, None, false),
    )
    .unwrap();
    assert_eq!(data.train.unwrap().examples[0].ids, vec![97, 98, 99, 256]);
    assert!(data.valid.is_none());
    assert_eq!(data.test.unwrap().examples[0].ids, vec![100, 101, 256]);
}

#[test]
fn padded_rows_cut_long_examples_and_drop_those_left_without_a_target() {
    let examples = vec![
        Tokenized {
            ids: vec![1, 2, 3, 4, 5, 6, 7, 8],
            prompt_len: 2,
        },
        Tokenized {
            ids: vec![1, 2, 3, 4, 5, 6, 7],
            prompt_len: 6,
        },
        Tokenized {
            ids: vec![9, 10],
            prompt_len: 0,
        },
    ];
    let (rows, stats) = SftRows::new(&examples, 4, Batching::Pad).unwrap();
    assert_eq!(
        (stats.truncated, stats.dropped, stats.kept_targets),
        (2, 1, 4)
    );
    assert_eq!(rows.count(), 2);
    let (mut inputs, mut targets) = (vec![0; 4], vec![0; 4]);
    rows.read(0, &mut inputs, &mut targets).unwrap();
    let x = IGNORE_TARGET;
    assert_eq!(
        (inputs.clone(), targets.clone()),
        (vec![1, 2, 3, 4], vec![x, 3, 4, 5])
    );
    rows.read(1, &mut inputs, &mut targets).unwrap();
    assert_eq!((inputs, targets), (vec![9, 10, 0, 0], vec![10, x, x, x]));
}

#[test]
fn packed_rows_run_examples_together_and_keep_their_masks() {
    let examples = vec![
        Tokenized {
            ids: vec![1, 2, 3],
            prompt_len: 2,
        },
        Tokenized {
            ids: vec![4, 5, 6],
            prompt_len: 1,
        },
        Tokenized {
            ids: vec![7, 8],
            prompt_len: 0,
        },
    ];
    let (rows, stats) = SftRows::new(&examples, 3, Batching::Pack).unwrap();
    // The stream 1 2 3 4 5 6 7 8 in two windows (8 is in none); their kept targets are 3, 5,
    // 6 and 7 (an unmasked example's first token is the target of the one before it).
    assert_eq!((rows.count(), stats.kept_targets), (2, 4));
    let (mut inputs, mut targets) = (vec![0; 3], vec![0; 3]);
    let x = IGNORE_TARGET;
    rows.read(0, &mut inputs, &mut targets).unwrap();
    assert_eq!(
        (inputs.clone(), targets.clone()),
        (vec![1, 2, 3], vec![x, 3, x])
    );
    rows.read(1, &mut inputs, &mut targets).unwrap();
    assert_eq!((inputs, targets), (vec![4, 5, 6], vec![5, 6, 7]));
}

/// A chat example's tools reach the template with their keys in the file's order, and `tojson`
/// writes them as Python's `json.dumps` does (`", "` and `": "`, non-ASCII as it is, an
/// `indent` when given).
#[test]
fn tools_keep_their_order_through_tojson() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "train.jsonl",
        r#"{"messages": [{"role": "user", "content": "é"}], "tools": [{"zeta": 1, "alpha": [1.0, 2.5, "<x>"], "mid": {"b": null, "a": true}}]}"#,
    );
    let file = read_examples(&path, &SftKeys::default()).unwrap();
    let Example::Chat { messages, tools } = &file.examples[0].1 else {
        panic!("not a chat");
    };
    let template = ChatTemplate::new(
        "tools",
        "{{ tools | tojson }}|{{ messages[0] | tojson(indent=2) }}",
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        template.render(messages, tools.as_ref(), false).unwrap(),
        "[{\"zeta\": 1, \"alpha\": [1.0, 2.5, \"<x>\"], \"mid\": {\"b\": null, \"a\": true}}]|{\n  \"role\": \"user\",\n  \"content\": \"é\"\n}"
    );
}

/// A Hugging Face tokenizer reads the whole text, and the prompt's length is counted by the
/// tokens' offsets: a token that straddles the prompt's end is the completion's. Tokenizing the
/// two parts apart would make another token there (`ca`, unknown, then `t`).
#[test]
fn the_prompt_length_comes_from_the_offsets_of_the_whole_text() {
    use lmx_runtime::data::{HfTokenizer, Tokenizer};
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    let vocab = [
        ("[UNK]", 0),
        ("the", 1),
        ("cat", 2),
        ("sat", 3),
        ("</s>", 4),
    ];
    let model = WordLevel::builder()
        .vocab(vocab.iter().map(|&(w, id)| (w.to_owned(), id)).collect())
        .unk_token("[UNK]".to_owned())
        .build()
        .unwrap();
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(Whitespace {}));
    let tokenizer = HfTokenizer::from_tokenizer(inner);
    assert_eq!(
        tokenizer.encode_split("the cat sat", 4).unwrap(),
        (vec![1, 2, 3], 1)
    );
    assert_eq!(
        tokenizer.encode_split("the cat sat", 6).unwrap(),
        (vec![1, 2, 3], 1),
        "`cat` straddles the split"
    );
    assert_eq!(
        tokenizer.encode_split("the cat sat", 7).unwrap(),
        (vec![1, 2, 3], 2)
    );
}

/// Llama 3's templates date their system turn with `strftime_now("%d %b %Y")` where it exists
/// (`transformers` gives it) and with a fixed 2024 date where it does not: the date must be
/// today's, as the system's `date` writes it.
#[test]
fn strftime_now_writes_the_local_date() {
    let source = r#"{% if strftime_now is defined %}{{ strftime_now("%d %b %Y|%H%%") }}{% else %}26 Jul 2024{% endif %}"#;
    let template = ChatTemplate::new("date.jinja", source, None, None).unwrap();
    let expected = std::process::Command::new("date")
        .arg("+%d %b %Y|%H%%")
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let rendered = template.render(&[], None, false).unwrap();
    assert_eq!(
        rendered,
        String::from_utf8(expected.stdout).unwrap().trim_end()
    );
    let bad = ChatTemplate::new("bad.jinja", r#"{{ strftime_now("%Q") }}"#, None, None).unwrap();
    assert_eq!(
        bad.render(&[], None, false).unwrap_err().to_string(),
        "chat template bad.jinja: strftime_now: `%Q` is not a strftime format (line 1)"
    );
}

/// A `tokenizer.json` of four words whose post-processor frames a document as `single` says
/// (Llama's: `<s> $A`), as `transformers` and mlx-lm read it.
fn framed_tokenizer(single: &str) -> lmx_runtime::data::HfTokenizer {
    let json = format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
          {{"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}},
          {{"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}}],
        "normalizer": null, "pre_tokenizer": {{"type": "Whitespace"}},
        "post_processor": {{"type": "TemplateProcessing", "single": {single},
          "pair": [{{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}],
          "special_tokens": {{"<s>": {{"id": "<s>", "ids": [0], "tokens": ["<s>"]}},
                             "</s>": {{"id": "</s>", "ids": [1], "tokens": ["</s>"]}}}}}},
        "decoder": null,
        "model": {{"type": "WordLevel", "vocab": {{"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "d": 5}}, "unk_token": "a"}}}}"#
    );
    lmx_runtime::data::HfTokenizer::from_json(json.as_bytes()).unwrap()
}

/// mlx-lm encodes a text example with `tokenizer.encode(text)`, which puts the post-processor's
/// special tokens around it (Llama's BOS first), then appends EOS unless it ends the ids already;
/// a chat template writes its own and is tokenized without them.
#[test]
fn text_examples_get_the_tokenizers_own_special_tokens() {
    let bos = r#"[{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]"#;
    let tokenizer = framed_tokenizer(bos);
    let encoder = SftEncoder::new(&tokenizer, None, false);
    let text = encoder.encode(&Example::Text("a b c".into())).unwrap();
    assert_eq!(text.ids, vec![0, 2, 3, 4, 1]);
    // A prompt given to generation is framed the same way (no EOS: it is continued).
    assert_eq!(tokenizer.encode_framed("a b c").unwrap(), vec![0, 2, 3, 4]);
    // With the prompt masked, BOS is the prompt's: the loss starts at the completion's first id.
    let masked = SftEncoder::new(&tokenizer, None, true);
    let completion = Example::Completion {
        prompt: "a b ".into(),
        completion: "c d".into(),
    };
    let tokenized = masked.encode(&completion).unwrap();
    assert_eq!(
        (tokenized.ids, tokenized.prompt_len),
        (vec![0, 2, 3, 4, 5, 1], 3)
    );
    // A post-processor that also closes the document with EOS gets no second one.
    let both = r#"[{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}]"#;
    let tokenizer = framed_tokenizer(both);
    let encoder = SftEncoder::new(&tokenizer, None, false);
    let text = encoder.encode(&Example::Text("d".into())).unwrap();
    assert_eq!(text.ids, vec![0, 5, 1]);
    // Through a template, the template's text alone decides: no BOS is added.
    let template = ChatTemplate::new(
        "t.jinja",
        "{% for m in messages %}{{ m.content }} {% endfor %}",
        None,
        None,
    )
    .unwrap();
    let tokenizer = framed_tokenizer(bos);
    let templated = SftEncoder::new(&tokenizer, Some(&template), false);
    let chat = Example::Chat {
        messages: vec![minijinja::Value::from_serialize(
            serde_json::json!({"role": "user", "content": "b"}),
        )],
        tools: None,
    };
    assert_eq!(templated.encode(&chat).unwrap().ids, vec![3, 1]);
}
