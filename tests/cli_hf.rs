//! Hugging Face folders through the `lmx` command, end to end at tiny size: train from a
//! transformers-saved fixture (`--init`), validation loss falls, export the run, reload the
//! export and generate from it; a run starts from the folder's weights, not fresh ones.

use lmx::models::llama;
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::tree;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lmx(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .output()
        .expect("lmx runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "lmx {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// A small text file for the fixture's tokenizer (trained on this kind of text).
fn data(dir: &Path) -> PathBuf {
    let path = dir.join("data.txt");
    let line = "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak.\n";
    std::fs::write(&path, line.repeat(60)).unwrap();
    path
}

/// Trains `steps` steps from the llama fixture into `run` at learning rate `lr`.
fn train_from_fixture(dir: &Path, run: &Path, steps: &str, lr: &str) -> String {
    let data = data(dir);
    lmx(&[
        "train",
        "--init",
        fixture("llama").to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--steps",
        steps,
        "--lr",
        lr,
        "--warmup",
        "0",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--eval-every",
        "10",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run.to_str().unwrap(),
    ])
}

fn eval_losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "eval")
        .map(|value| value["val_loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn train_from_a_folder_export_reload_and_generate() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let trained = train_from_fixture(dir.path(), &run, "30", "1e-2");
    assert!(trained.contains("trained llama to step 30"), "{trained}");
    let losses = eval_losses(&run);
    assert!(
        losses.len() >= 2 && losses.last() < losses.first(),
        "validation loss falls: {losses:?}"
    );

    let exported = dir.path().join("exported");
    lmx(&[
        "export",
        "--run",
        run.to_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
    ]);
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(exported.join(file).is_file(), "{file} exported");
    }
    let generated = lmx(&[
        "generate",
        "--model",
        exported.to_str().unwrap(),
        "--prompt",
        "First Citizen:",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ]);
    assert!(generated.starts_with("First Citizen:"), "{generated}");
}

#[test]
fn a_run_starts_from_the_folder_s_weights() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // One step at a vanishing learning rate: the checkpoint holds the folder's weights.
    train_from_fixture(dir.path(), &run, "1", "1e-9");
    let exported = dir.path().join("exported");
    lmx(&[
        "export",
        "--run",
        run.to_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
        "--max-shard-size",
        "40KB",
    ]);
    assert!(exported.join(hf::INDEX_FILE).is_file(), "sharded");
    let load = |dir: &Path| {
        let folder = HfFolder::open(dir).unwrap();
        hf::load_model::<llama::Llama>(&folder, None).unwrap().1
    };
    let (original, after) = (load(&fixture("llama")), load(&exported));
    for ((name, a), b) in tree::names(&original)
        .iter()
        .zip(tree::flatten(&original))
        .zip(tree::flatten(&after))
    {
        let error = a.subtract(&b).unwrap().abs().unwrap().max(false).unwrap();
        let error = error.item_exact::<f32>();
        assert!(error < 1e-6, "{name} moved by {error}");
    }
}

/// `lmx generate --model DIR --chat` renders the prompt as a user's message through the
/// folder's chat template (the fixture's writes `<|role|>content` and the end-of-sequence token
/// after each message, then `<|assistant|>`) and continues it as it continues that text given
/// whole; without a folder it is refused.
#[test]
fn chat_prompts_go_through_the_folder_s_template() {
    let folder = fixture("llama");
    let folder = folder.to_str().unwrap();
    let greedy = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            folder,
            "--max-tokens",
            "6",
            "--temperature",
            "0",
        ];
        args.extend_from_slice(extra);
        lmx(&args)
    };
    let rendered = "<|user|>Double 3.</s><|assistant|>";
    let chat = greedy(&["--chat", "--prompt", "Double 3."]);
    assert!(chat.starts_with(rendered), "{chat}");
    assert_eq!(chat, greedy(&["--prompt", rendered]));

    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(["generate", "--chat", "--prompt", "hi"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains(
        "--chat renders the prompt through a Hugging Face folder's chat template: give the \
         folder with --model DIR"
    ));
}

/// `lmx generate` of `max_tokens` greedy tokens after "Before we" from the Llama fixture, with
/// `extra` flags.
fn greedy_from_llama(max_tokens: &str, extra: &[&str]) -> Output {
    let folder = fixture("llama");
    let mut args = vec![
        "generate",
        "--model",
        folder.to_str().unwrap(),
        "--max-tokens",
        max_tokens,
        "--temperature",
        "0",
        "--prompt",
        "Before we",
    ];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(&args)
        .output()
        .expect("lmx runs")
}

/// `lmx generate --draft DIR --draft-tokens K`: speculative decoding with a draft folder of the
/// same family prints the model's own greedy text and reports how many drafted tokens were kept;
/// a draft of another family and a draft size of 0 are refused, naming the flag.
#[test]
fn speculative_generation_from_the_command_line() {
    let generate = |extra: &[&str]| greedy_from_llama("12", extra);
    let plain = generate(&[]);
    assert!(plain.status.success());
    let draft = fixture("llama-sharded");
    let draft = draft.to_str().unwrap();
    let speculative = generate(&["--draft", draft, "--draft-tokens", "3"]);
    let stderr = String::from_utf8_lossy(&speculative.stderr);
    assert!(speculative.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&speculative.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    let kept = stderr
        .split("draft acceptance ")
        .nth(1)
        .unwrap_or_else(|| panic!("no acceptance reported: {stderr}"));
    let counts: Vec<usize> = kept
        .split(['(', ' '])
        .filter_map(|word| word.parse().ok())
        .take(2)
        .collect();
    assert!(
        counts.len() == 2 && counts[0] <= counts[1] && counts[1] > 0,
        "{stderr}"
    );

    let other = fixture("gpt2");
    let refused = generate(&["--draft", other.to_str().unwrap()]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&format!("--draft {}", other.display())),
        "{stderr}"
    );
    let refused = generate(&["--draft", draft, "--draft-tokens", "0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--draft-tokens 0"));
}

/// `lmx generate --max-kv-size N --keep K`: a bound the generation never reaches leaves the greedy
/// text as it is; a bound it passes still generates every token (the rotating cache); a bound
/// that keeps every position for good, and a bound beside --draft, are refused naming the flags.
#[test]
fn a_bounded_key_value_cache_from_the_command_line() {
    let generate = |extra: &[&str]| greedy_from_llama("24", extra);
    let plain = generate(&[]);
    assert!(plain.status.success());
    let roomy = generate(&["--max-kv-size", "256"]);
    assert!(roomy.status.success());
    assert_eq!(roomy.stdout, plain.stdout);
    let tight = generate(&["--max-kv-size", "8", "--keep", "2"]);
    let stderr = String::from_utf8_lossy(&tight.stderr);
    assert!(tight.status.success(), "{stderr}");
    assert!(stderr.starts_with("24 tokens;"), "{stderr}");
    let refused = generate(&["--max-kv-size", "4", "--keep", "4"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--max-kv-size 4 with --keep 4"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(refused.stdout.is_empty());
    let draft = fixture("llama-sharded");
    let refused = generate(&["--max-kv-size", "64", "--draft", draft.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--max-kv-size"));
}

/// A run trained with a Hugging Face tokenizer file of another name exports it as the folder's
/// `tokenizer.json`, with the tokenizer's `tokenizer_config.json` and SentencePiece model beside
/// it (and not a model's generation defaults found there), and the folder generates; a run trained with `--eos`
/// exports the tokenizer's settings with that end-of-sequence token, as its `config.json` says.
#[test]
fn a_tokenizer_file_of_any_name_is_exported_as_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer_dir = dir.path().join("tokenizer");
    std::fs::create_dir(&tokenizer_dir).unwrap();
    let tokenizer = tokenizer_dir.join("my_tokenizer.json");
    std::fs::copy(fixture("llama").join("tokenizer.json"), &tokenizer).unwrap();
    for file in ["tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(fixture("llama").join(file), tokenizer_dir.join(file)).unwrap();
    }
    // A SentencePiece model beside it, binary (not UTF-8), carried as it is.
    let sentencepiece = [0xff_u8, 0xfe, 0x00, 0x80];
    std::fs::write(tokenizer_dir.join("tokenizer.model"), sentencepiece).unwrap();
    let data = data(dir.path());
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    // Trains two steps with the tokenizer (and `extra` flags) into `name`, exported beside it.
    let train_and_export = |name: &str, extra: &[&str]| {
        let (run, exported) = (
            dir.path().join(name),
            dir.path().join(format!("{name}-out")),
        );
        let train = "train --model llama --preset tiny --set vocab=288 --steps 2 --batch-size 2 \
                     --seq-len 16 --quiet --sample 0";
        let mut args: Vec<String> = train.split_whitespace().map(String::from).collect();
        for (flag, value) in [
            ("--tokenizer", &tokenizer),
            ("--data", &data),
            ("--out", &run),
        ] {
            args.extend([flag.to_owned(), path(value)]);
        }
        args.extend(extra.iter().map(|&arg| arg.to_owned()));
        lmx(&args.iter().map(String::as_str).collect::<Vec<_>>());
        lmx(&["export", "--run", &path(&run), "--out", &path(&exported)]);
        exported
    };
    let exported = train_and_export("run", &[]);
    let mut files: Vec<String> = std::fs::read_dir(&exported)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer.model",
            "tokenizer_config.json"
        ]
    );
    let same = |name: &str, source: &Path| {
        std::fs::read(exported.join(name)).unwrap() == std::fs::read(source).unwrap()
    };
    assert!(same("tokenizer.json", &tokenizer));
    assert!(same(
        "tokenizer_config.json",
        &tokenizer_dir.join("tokenizer_config.json")
    ));
    let generate = format!(
        "generate --max-tokens 4 --temperature 0 --model {}",
        path(&exported)
    );
    let mut args: Vec<&str> = generate.split_whitespace().collect();
    args.extend(["--prompt", "First Citizen:"]);
    let generated = lmx(&args);
    assert!(generated.starts_with("First Citizen:"), "{generated}");

    // With `--eos`, the folder's tokenizer settings and config.json name the run's token.
    let exported = train_and_export("eos-run", &["--eos", "<s>"]);
    let json = |path: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let mut expected = json(&tokenizer_dir.join("tokenizer_config.json"));
    expected["eos_token"] = "<s>".into();
    assert_eq!(json(&exported.join("tokenizer_config.json")), expected);
    let carried = std::fs::read(exported.join("tokenizer.model")).unwrap();
    assert_eq!(carried, sentencepiece);
    let folder = HfFolder::open(&exported).unwrap();
    assert_eq!(folder.eos_token().as_deref(), Some("<s>"));
    let source = lmx::runtime::data::HfTokenizer::from_file(&tokenizer).unwrap();
    let bos_id = source.inner().token_to_id("<s>").unwrap();
    assert_eq!(json(&exported.join("config.json"))["eos_token_id"], bos_id);
}
