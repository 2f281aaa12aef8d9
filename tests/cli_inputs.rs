//! Bad input to `lmx train` and `lmx generate` fails before any work, naming the cause and place:
//! token ids past the vocabulary, `--set` values the model's rules forbid, sampling flags out of
//! range, an over-long prompt. Sampled bytes that are not UTF-8 come out as U+FFFD, not dropped.

use crate::support::cli::lmx;
use std::path::Path;

/// Runs `lmx`, expecting it to fail; returns its stderr.
fn fails(args: &[&str]) -> String {
    let output = lmx(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "lmx {args:?} succeeded:\n{}\n{stderr}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

/// A token file of `count` ids below 257 with `bad` at `position`, as `lmx` writes them.
fn token_file(path: &Path, count: usize, position: usize, bad: u32) {
    let mut bytes = b"LMXTOKEN".to_vec();
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(2u32.to_le_bytes());
    bytes.extend((count as u64).to_le_bytes());
    bytes.extend([0u8; 8]);
    for index in 0..count {
        let id = if index == position {
            bad
        } else {
            (index % 250) as u32
        };
        bytes.extend((id as u16).to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_token_file_id_past_the_vocabulary_is_named_with_its_position_before_training() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [257, 300, 60_000] {
        let data = dir.path().join(format!("ids-{bad}.tokens"));
        token_file(&data, 5000, 4321, bad);
        let out = dir.path().join(format!("run-{bad}"));
        let stderr = fails(&[
            "train",
            "--preset",
            "tiny-bytes",
            "--steps",
            "2",
            "--seq-len",
            "32",
            "--quiet",
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            stderr.contains(&format!(
                "{}: token 4321 is id {bad}, outside the model's vocabulary of 257 ids",
                data.display()
            )),
            "{stderr}"
        );
        assert!(
            !out.join("run.json").exists(),
            "nothing written for a refused run"
        );
    }
}

/// `--set` values that break the model's rules, each with a fragment its error must hold.
const BAD_SETTINGS: &[(&str, &str, &str)] = &[
    (
        "gpt2",
        "n_heads=0",
        "`head_dim = d_model / n_heads` divides by zero: 32 / 0",
    ),
    (
        "gpt2",
        "n_heads=3",
        "`head_dim = d_model / n_heads` does not divide exactly: 32 / 3",
    ),
    (
        "gpt2",
        "pdrop=1.0",
        "`pdrop` is 1.0: a dropout probability must be in [0, 1)",
    ),
    (
        "gpt2",
        "pdrop=1.5",
        "`pdrop` is 1.5: a dropout probability must be in [0, 1)",
    ),
    ("gpt2", "pdrop=NaN", "`pdrop` is a finite float, not `NaN`"),
    ("gpt2", "d_model=0", "`d_model` is 0"),
    ("gpt2", "d_model=-32", "`d_model` is -32"),
    (
        "llama",
        "n_kv_heads=0",
        "`kv_dim = n_kv_heads * head_dim` is 0",
    ),
    (
        "llama",
        "n_kv_heads=3",
        "`n_heads` is 4, not a multiple of `n_kv_heads` (3)",
    ),
    ("llama", "d_ff=0", "`d_ff` is 0"),
];

#[test]
fn set_values_go_through_the_checker_and_fail_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    for &(model, setting, message) in BAD_SETTINGS {
        let preset = if model == "gpt2" {
            "tiny-bytes"
        } else {
            "tiny"
        };
        let out = dir.path().join(setting);
        let stderr = fails(&[
            "train",
            "--model",
            model,
            "--preset",
            preset,
            "--set",
            setting,
            "--steps",
            "1",
            "--seq-len",
            "32",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ]);
        let name = setting.split('=').next().unwrap();
        assert!(
            stderr.contains(message) && stderr.contains(name),
            "--set {setting}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "--set {setting}: {stderr}");
        assert!(
            !out.join("run.json").exists(),
            "--set {setting}: nothing written"
        );
    }
}

/// A sequence longer than the preset's context (here the default 128 against tiny-bytes' 64)
/// fails before any work, naming both lengths, the model and preset, and the flag that fixes it.
#[test]
fn a_sequence_past_the_context_names_the_preset_and_the_longest_it_takes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("text.txt");
    std::fs::write(&data, "some text ".repeat(100)).unwrap();
    let out = dir.path().join("run");
    let stderr = fails(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--steps",
        "1",
        "--quiet",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains(
            "seq_len 128 is longer than the context of gpt2 (preset tiny-bytes), 64 tokens: \
             give --seq-len 64 or less"
        ),
        "{stderr}"
    );
    assert!(!out.join("run.json").exists(), "nothing written: {stderr}");
}

/// A run of the byte-level GPT trained two steps: it samples nearly uniform bytes, most of them
/// not UTF-8 in the order they come.
fn barely_trained_run(dir: &Path) -> String {
    let run = dir.join("run");
    let output = lmx(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    run.to_str().unwrap().to_owned()
}

#[test]
fn generate_validates_its_flags_and_prints_undecodable_bytes_as_replacement_characters() {
    let dir = tempfile::tempdir().unwrap();
    let run = barely_trained_run(dir.path());
    for (flags, message) in [
        (
            ["--temperature", "-1"],
            "--temperature -1: it must be 0 (greedy) or a finite positive number",
        ),
        (
            ["--temperature", "NaN"],
            "--temperature NaN: it must be 0 (greedy) or a finite positive number",
        ),
        (["--top-p", "0"], "--top-p 0: it must be in (0, 1]"),
        (["--top-p", "-0.5"], "--top-p -0.5: it must be in (0, 1]"),
        (["--top-p", "1.5"], "--top-p 1.5: it must be in (0, 1]"),
        (["--top-p", "NaN"], "--top-p NaN: it must be in (0, 1]"),
    ] {
        let stderr = fails(&[&["generate", "--run", &run][..], &flags].concat());
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
    }

    let long = "x".repeat(65);
    let output = lmx(&["generate", "--run", &run, "--prompt", &long]);
    assert!(!output.status.success());
    assert!(
        output.stdout.is_empty(),
        "the over-long prompt is not echoed"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the prompt has 65 tokens, more than the model's context of 64"),
        "{stderr}"
    );

    let output = lmx(&[
        "generate",
        "--run",
        &run,
        "--prompt",
        "A",
        "--temperature",
        "1",
        "--top-k",
        "0",
        "--max-tokens",
        "60",
        "--seed",
        "3",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let tokens: usize = stderr
        .lines()
        .find_map(|line| line.split_once(" tokens; prompt"))
        .and_then(|(count, _)| count.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {stderr}"));
    let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");
    let text = stdout
        .strip_prefix('A')
        .unwrap()
        .strip_suffix('\n')
        .unwrap();
    assert!(
        text.contains('\u{FFFD}'),
        "the sample holds undecodable bytes: {text:?}"
    );
    // Every byte sampled shows: a character has at most 4 bytes, an end-of-text id none.
    assert!(
        4 * text.chars().count() >= tokens - 1,
        "{tokens} tokens sampled, {} characters printed: {text:?}",
        text.chars().count()
    );
}

/// The sampling flags beyond temperature, top-k and top-p are checked too, and `--stop` ends the
/// printed text before the first occurrence of its string, which greedy decoding makes exact.
#[test]
fn generate_checks_its_sampling_flags_and_ends_at_a_stop_string() {
    let dir = tempfile::tempdir().unwrap();
    let run = barely_trained_run(dir.path());
    for (flags, message) in [
        (vec!["--min-p", "2"], "--min-p 2: it must be in [0, 1]"),
        (
            vec!["--repetition-penalty", "0"],
            "--repetition-penalty 0: it must be a finite positive number",
        ),
        (
            vec!["--presence-penalty", "inf"],
            "--presence-penalty inf: it must be a finite number",
        ),
        (vec!["--logit-bias", "7"], "\"7\" is not ID=AMOUNT"),
        (
            vec!["--logit-bias", "300=1"],
            "logit_bias is token id 300; it must be ids below the model's vocabulary size",
        ),
    ] {
        let stderr = fails(&[&["generate", "--run", &run][..], &flags].concat());
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
    }
    let greedy = |stop: &[&str]| -> String {
        let mut args = vec![
            "generate",
            "--run",
            &run,
            "--prompt",
            "A",
            "--temperature",
            "0",
        ];
        args.extend(["--max-tokens", "40"]);
        for s in stop {
            args.extend(["--stop", s]);
        }
        let output = lmx(&args);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");
        stdout
            .strip_prefix('A')
            .unwrap()
            .strip_suffix('\n')
            .unwrap()
            .to_owned()
    };
    let free = greedy(&[]);
    let chars: Vec<char> = free.chars().collect();
    assert!(chars.len() >= 8, "a greedy sample of 40 bytes: {free:?}");
    let stop: String = chars[5..7].iter().collect();
    let end = free.find(&stop).expect("present");
    assert_eq!(greedy(&[&stop]), free[..end]);
    assert_eq!(greedy(&["no such text"]), free);
}

#[test]
fn info_count_and_check_refuse_a_preset_whose_sizes_overflow_instead_of_saturating() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wide.lmx");
    let gpt2 =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/gpt2.lmx")).unwrap();
    let wide = gpt2.replace(
        "preset 124m { }",
        "preset 124m { }\n    preset wide { d_model = 1200000000000 }",
    );
    std::fs::write(&file, wide).unwrap();
    let file = file.to_str().unwrap();
    for args in [
        vec!["info", file, "--preset", "wide"],
        vec!["count", file],
        vec!["check", file, "--preset", "wide"],
    ] {
        let output = lmx(&args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stdout}");
        assert!(
            !stdout.contains("18,446,744,073,709,551,615"),
            "{args:?}: {stdout}"
        );
        assert!(
            stderr.contains("with preset `wide`, the parameter count does not fit in 64 bits"),
            "{args:?}: {stderr}"
        );
    }
}
