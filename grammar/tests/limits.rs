//! Input that would exhaust a recursive parser or checker gets a diagnostic instead: long prefix,
//! postfix and `else if` chains, conditions that start with a conditional, and brackets, each
//! past its limit; within the limits the whole pipeline runs on a test thread's default stack.

use lmx_grammar::{compile_str, Diagnostic};

/// A model whose forward pass returns `expr` over `x: [B, T, d]` (in a block, as the model's own
/// forward pass takes token ids).
fn with_forward(expr: &str) -> String {
    format!(
        "model M {{\n  config {{ d: int = 4 }}\n  block E {{\n    params {{ w: linear(d, d) }}\n    \
         forward(x: [B, T, d]) -> [B, T, d] {{\n    {expr}\n    }}\n  }}\n  params {{ e: E }}\n  \
         forward(tokens: [B, T] int) -> [B, T, d] {{ e(one_hot(tokens, d)) }}\n}}\n"
    )
}

fn first_code(source: &str) -> &'static str {
    let diags: Vec<Diagnostic> = compile_str(source).expect_err("rejected");
    diags[0].code
}

#[test]
fn long_prefix_chains_are_a_diagnostic() {
    for op in ["-", "not "] {
        let source = with_forward(&format!("{}x", op.repeat(8000)));
        assert_eq!(first_code(&source), "lmx::syntax::depth", "{op}");
    }
}

#[test]
fn long_postfix_chains_are_a_diagnostic() {
    let source = with_forward(&format!("x{}", "[0]".repeat(3600)));
    assert_eq!(first_code(&source), "lmx::syntax::depth");
    let source = with_forward(&format!("x{}", ".T".repeat(5000)));
    assert_eq!(first_code(&source), "lmx::syntax::depth");
}

#[test]
fn long_else_if_chains_are_a_diagnostic() {
    let chain = "if d == 1 { x } else ".repeat(2700);
    let source = with_forward(&format!("{chain}{{ x }}"));
    assert_eq!(first_code(&source), "lmx::syntax::depth");
}

#[test]
fn a_condition_that_starts_with_a_conditional_is_a_syntax_error() {
    let source = with_forward(&format!(
        "{}d == 1{}",
        "if ".repeat(5000),
        " { x } else { x }".repeat(5000)
    ));
    assert_eq!(first_code(&source), "lmx::syntax");
}

#[test]
fn brackets_in_comments_and_strings_do_not_count() {
    let deep = "(".repeat(200);
    let source = format!(
        "// {deep}\nmodel M {{\n  config {{ d: int = 4  name: str = \"{deep}\" }}\n  \
         params {{ w: linear(d, d) }} // {deep}\n  forward(tokens: [B, T] int) -> [B, T, d] {{ w(one_hot(tokens, d)) }}\n}}\n"
    );
    compile_str(&source).expect("valid");
}

#[test]
fn brackets_in_a_comment_do_not_hide_deep_nesting() {
    let source = with_forward(&format!(
        "// {}\n    {}x{}",
        ")".repeat(100),
        "(".repeat(60),
        ")".repeat(60)
    ));
    assert_eq!(first_code(&source), "lmx::syntax::nesting");
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let source = format!("\u{feff}{}", with_forward("w(x)"));
    compile_str(&source).expect("valid");
}

/// Expressions at the depth limit go through the checker, the report and the code generator.
#[test]
fn expressions_at_the_limits_run_on_a_default_stack() {
    let depth = lmx_grammar::parse::MAX_DEPTH;
    let within = [
        format!("{}x", "-".repeat(depth - 8)),
        format!("x{}", "[...]".repeat(depth - 8)),
        format!("{}{{ x }}", "if d == 1 { x } else ".repeat(depth - 8)),
        format!("{}x{}", "w(".repeat(40), ")".repeat(40)),
        format!("x{}", " + x".repeat(depth - 8)),
    ];
    for expr in within {
        let source = with_forward(&expr);
        let codes: Result<Vec<&str>, Vec<&str>> =
            std::thread::spawn(move || match compile_str(&source) {
                Ok(model) => lmx_grammar::codegen::generate_module(&model, "")
                    .map(|_| Vec::new())
                    .map_err(|diags| diags.iter().map(|d| d.code).collect()),
                Err(diags) => Err(diags.iter().map(|d| d.code).collect()),
            })
            .join()
            .expect("no stack overflow");
        assert_eq!(codes, Ok(Vec::new()), "{expr:.60}");
    }
}

/// A million tokens: many statements, a wide preset table and long flat expressions. Whatever the
/// checker says, it says it without a crash (the time is in docs/benchmarks.md, not asserted).
#[test]
fn a_million_tokens_check_without_a_crash() {
    let statements = "    let y = w(x) + x * 2\n".repeat(95_000);
    let presets: String = (0..20)
        .map(|i| format!("  preset p{i} {{ d = {} }}\n", i % 7))
        .collect();
    let source = format!(
        "model M {{\n  config {{ d: int = 4 }}\n{presets}  params {{ w: linear(d, d) }}\n  \
         forward(tokens: [B, T] int) -> [B, T, d] {{\n    let x = one_hot(tokens, d)\n{statements}    w(x)\n  }}\n}}\n"
    );
    let tokens = token_count(&source);
    assert!(tokens > 1_000_000, "{tokens}");
    let outcome = compile_str(&source);
    if let Err(diags) = outcome {
        let _ = lmx_grammar::render(&diags, "big.lmx", &source);
    }
}

/// Names and numbers count one token each, every other visible character one.
fn token_count(source: &str) -> usize {
    let mut count = 0;
    let mut in_word = false;
    for c in source.chars() {
        let word = c.is_alphanumeric() || c == '_';
        if (word && !in_word) || (!word && !c.is_whitespace()) {
            count += 1;
        }
        in_word = word;
    }
    count
}
