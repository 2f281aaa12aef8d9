//! The parser, checker and report never panic, on random text or on mutations of the
//! bundled models. Bounded for CI (64 cases per property); set `LMX_FUZZ_CASES` to run longer.

use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("LMX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

fn models() -> Vec<String> {
    let dir = format!("{}/../models", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("models dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "lmx"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("model"))
        .collect()
}

/// Runs every stage that takes user input.
fn exercise(source: &str) {
    match lmx_grammar::compile_str(source) {
        Ok(model) => {
            for preset in &model.presets {
                let _ = lmx_grammar::report::report(&model, &preset.name, 2, Some(8));
            }
        }
        Err(diags) => {
            let _ = lmx_grammar::render(&diags, "fuzz.lmx", source);
        }
    }
}

const TOKENS: &[&str] = &[
    "model",
    "config",
    "preset",
    "params",
    "block",
    "forward",
    "step",
    "let",
    "for",
    "in",
    "if",
    "else",
    "while",
    "tied",
    "tensor",
    "int",
    "float",
    "bool",
    "enum",
    "optimizer",
    "update",
    "metrics",
    "accumulate",
    "x",
    "B",
    "T",
    "d_model",
    "n_heads",
    "0",
    "1",
    "2.5",
    "\"LG\"",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ";",
    "=",
    "==",
    "+",
    "-",
    "*",
    "/",
    "%",
    "@",
    "**",
    ".",
    "..",
    "...",
    "->",
    "and",
    "or",
    "not",
    "\n",
    " ",
    "//",
    "linear",
    "embedding",
    "attention",
    "item",
    "reshape",
    "split",
    "where",
    "grad",
    "forward(x)",
    "0..n",
    "-1",
];

/// One edit of a source text, at a relative position.
#[derive(Debug, Clone)]
enum Mutation {
    Delete(f64, usize),
    Insert(f64, usize),
    Duplicate(f64, usize),
    Swap(f64, f64, usize),
}

fn at(s: &str, pos: f64) -> usize {
    let mut i = ((s.len() as f64) * pos) as usize;
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i.min(s.len())
}

fn span(s: &str, start: usize, len: usize) -> usize {
    let mut end = (start + len).min(s.len());
    while end < s.len() && !s.is_char_boundary(end) {
        end += 1;
    }
    end
}

fn apply(mut s: String, m: &Mutation) -> String {
    match m {
        Mutation::Delete(p, n) => {
            let a = at(&s, *p);
            let b = span(&s, a, *n);
            s.replace_range(a..b, "");
        }
        Mutation::Insert(p, t) => {
            let a = at(&s, *p);
            s.insert_str(a, TOKENS[t % TOKENS.len()]);
        }
        Mutation::Duplicate(p, n) => {
            let a = at(&s, *p);
            let b = span(&s, a, *n);
            let copy = s[a..b].to_string();
            s.insert_str(b, &copy);
        }
        Mutation::Swap(p, q, n) => {
            let (a, c) = (at(&s, *p), at(&s, *q));
            let (a, c) = (a.min(c), a.max(c));
            let b = span(&s, a, *n).min(c);
            let d = span(&s, c, *n);
            let (x, y) = (s[a..b].to_string(), s[c..d].to_string());
            s = format!("{}{}{}{}{}", &s[..a], y, &s[b..c], x, &s[d..]);
        }
    }
    s
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0.0..1.0f64, 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (0.0..1.0f64, 0usize..1000).prop_map(|(p, t)| Mutation::Insert(p, t)),
        (0.0..1.0f64, 1usize..200).prop_map(|(p, n)| Mutation::Duplicate(p, n)),
        (0.0..1.0f64, 0.0..1.0f64, 1usize..30).prop_map(|(p, q, n)| Mutation::Swap(p, q, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics(s in "\\PC{0,300}") {
        exercise(&s);
    }

    #[test]
    fn random_tokens_never_panic(toks in prop::collection::vec(0usize..1000, 0..120)) {
        let s: Vec<&str> = toks.iter().map(|t| TOKENS[t % TOKENS.len()]).collect();
        exercise(&format!("model M {{ {} }}", s.join(" ")));
    }

    #[test]
    fn mutated_models_never_panic(which in 0usize..100, edits in prop::collection::vec(mutation(), 1..6)) {
        let all = models();
        let mut s = all[which % all.len()].clone();
        for m in &edits {
            s = apply(s, m);
        }
        exercise(&s);
    }
}

#[test]
fn deep_nesting_is_a_diagnostic() {
    let s = format!(
        "model M {{ forward(x: [B]) {{ {}x{} }} }}",
        "(".repeat(5000),
        ")".repeat(5000)
    );
    let diags = lmx_grammar::compile_str(&s).expect_err("too deep");
    assert_eq!(diags[0].code, "lmx::syntax::nesting");
}
