//! The rules every configuration obeys, applied the same way to presets (`lmx check`) and to
//! settings chosen at run time (`rules::validate`); and checking a file of many presets in time
//! linear in its length.

use lmx_grammar::eval::{Env, Value};
use lmx_grammar::CheckedModel;

fn bundled(file: &str) -> CheckedModel {
    let path = format!("{}/../models/{file}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).expect("model file");
    lmx_grammar::check_source(&path, &source).unwrap_or_else(|e| panic!("{e}"))
}

/// The settings of `preset` (its derived values left out) with `changes` made.
fn settings(model: &CheckedModel, preset: &str, changes: &[(&str, Value)]) -> Env {
    let values = &model.preset(preset).expect("preset").values;
    let mut settings: Env = model
        .config
        .iter()
        .filter(|item| !item.derived)
        .map(|item| (item.name.clone(), values[&item.name].clone()))
        .collect();
    for (name, value) in changes {
        settings.insert(name.to_string(), value.clone());
    }
    settings
}

#[test]
fn settings_that_break_a_rule_are_refused_naming_the_setting() {
    let gpt2 = bundled("gpt2.lmx");
    let llama = bundled("llama.lmx");
    let cases: [(&CheckedModel, &str, Value, &str); 11] = [
        (&gpt2, "n_heads", Value::Int(0), "`head_dim = d_model / n_heads` divides by zero: 32 / 0"),
        (&gpt2, "n_heads", Value::Int(3), "`head_dim = d_model / n_heads` does not divide exactly: 32 / 3 leaves a remainder"),
        (&gpt2, "pdrop", Value::Float(1.0), "`pdrop` is 1.0: a dropout probability must be in [0, 1)"),
        (&gpt2, "pdrop", Value::Float(1.5), "`pdrop` is 1.5: a dropout probability must be in [0, 1)"),
        (&gpt2, "pdrop", Value::Float(f64::NAN), "`pdrop` is NaN; a float setting must be a finite number"),
        (&gpt2, "d_model", Value::Int(0), "`d_model` is 0, a size of `wte`; sizes must be at least 1"),
        (&gpt2, "d_model", Value::Int(-32), "`d_model` is -32, a size of `wte`; sizes must be at least 1"),
        (&gpt2, "d_model", Value::Int(1 << 40), "with these settings, the parameter count does not fit in 64 bits (more than 18446744073709551615)"),
        (&llama, "n_kv_heads", Value::Int(0), "`kv_dim = n_kv_heads * head_dim` is 0, a size of `model.layers.0.self_attn.k_proj`; sizes must be at least 1"),
        (&llama, "n_kv_heads", Value::Int(3), "`n_heads` is 4, not a multiple of `n_kv_heads` (3): attention in `Attention` shares each key/value head among a whole number of query heads"),
        (&llama, "d_ff", Value::Int(0), "`d_ff` is 0, a size of `model.layers.0.mlp.gate_proj`; sizes must be at least 1"),
    ];
    for (model, name, value, message) in cases {
        let preset = if model.name == "Gpt2" {
            "tiny-bytes"
        } else {
            "tiny"
        };
        let changed = settings(model, preset, &[(name, value)]);
        assert_eq!(
            lmx_grammar::rules::validate(model, &changed).unwrap_err(),
            message,
            "{name}"
        );
    }
    for preset in ["tiny-bytes", "124m", "1558m"] {
        assert_eq!(
            lmx_grammar::rules::validate(&gpt2, &settings(&gpt2, preset, &[])),
            Ok(())
        );
    }
}

/// A copy of the bundled GPT-2 with `count` presets, each with `n_heads = 5` (which does not
/// divide `d_model`), one per line.
fn many_presets(count: usize) -> String {
    let source =
        std::fs::read_to_string(format!("{}/../models/gpt2.lmx", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    let at = source.find("    preset 124m").expect("the first preset");
    let presets: String = (0..count)
        .map(|i| format!("    preset p{i} {{ n_heads = 5 }}\n"))
        .collect();
    format!("{}{presets}{}", &source[..at], &source[at..])
}

/// Every preset of a long file gets its own diagnostic, each pointing at its own line: the
/// rendering finds a span's lines by binary search instead of scanning the file from its start
/// for each (quadratic: 13 s for 8,000 presets before).
#[test]
fn each_of_many_invalid_presets_is_reported_at_its_own_line() {
    let count = 4000;
    let source = many_presets(count);
    let first_line = source[..source.find("    preset p0 ").unwrap()]
        .lines()
        .count()
        + 1;
    let diagnostics = lmx_grammar::compile_str(&source).unwrap_err();
    assert_eq!(diagnostics.len(), count);
    let rendered = lmx_grammar::render(&diagnostics, "many.lmx", &source);
    // Each points at `d_model / n_heads` in the config and at its preset.
    let division = source.find("d_model / n_heads").unwrap();
    let line_start = source[..division].rfind('\n').map_or(0, |i| i + 1);
    let at = format!(
        "-[many.lmx:{}:{}]\n",
        source[..division].lines().count(),
        division - line_start + 1
    );
    assert_eq!(rendered.matches(&at).count(), count, "{at}");
    for i in [100, count / 2, count - 1] {
        let line = first_line + i;
        assert!(
            rendered.contains(&format!("-[many.lmx:{line}:12]\n")),
            "preset p{i} is located at line {line}"
        );
        assert!(
            rendered.contains(&format!(" {line} |     preset p{i} {{ n_heads = 5 }}\n")),
            "preset p{i} is shown at line {line}"
        );
    }
}
