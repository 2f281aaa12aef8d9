//! Times the front end on generated inputs that are long (a million tokens) or many-error:
//! `cargo run --release -p lmx-grammar --example front_end_bench`. Each row doubles the input, so
//! linear stages double their time (docs/benchmarks.md, "The front end").

use std::time::Instant;

/// A valid model with `statements` statements of 12 tokens in its forward pass.
fn long_forward(statements: usize) -> String {
    let body = "    let y = w(x) + x * 2\n".repeat(statements);
    format!(
        "model M {{\n  config {{ d: int = 4 }}\n  params {{ w: linear(d, d) }}\n  \
         forward(x: [B, d]) -> [B, d] {{\n{body}    w(x)\n  }}\n}}\n"
    )
}

/// A model with `count` misspelt names, each a diagnostic with a "did you mean".
fn many_errors(count: usize) -> String {
    let body: String = (0..count)
        .map(|i| format!("    let y = x * d_modl{}\n", i % 10))
        .collect();
    format!(
        "model M {{\n  config {{ d: int = 4  d_model1: int = 8 }}\n  \
         params {{ w: linear(d, d) }}\n  forward(x: [B, d]) -> [B, d] {{\n{body}    w(x)\n  }}\n}}\n"
    )
}

fn time(label: &str, size: usize, source: &str) {
    let start = Instant::now();
    let model = lmx_grammar::parse(source);
    let parsed = start.elapsed();
    let diagnostics = match model.map(|m| lmx_grammar::check(&m)) {
        Ok(Ok(_)) => Vec::new(),
        Ok(Err(diagnostics)) => diagnostics,
        Err(syntax) => vec![syntax],
    };
    let checked = start.elapsed();
    let _ = lmx_grammar::render(&diagnostics, "bench.lmx", source);
    let rendered = start.elapsed();
    let diagnostics = diagnostics.len();
    println!(
        "{label:<14} {size:>8} {:>7.2} MB  parse {:>8.1} ms  check {:>8.1} ms  render {:>8.1} ms  ({diagnostics} diagnostics)",
        source.len() as f64 / 1e6,
        parsed.as_secs_f64() * 1e3,
        (checked - parsed).as_secs_f64() * 1e3,
        (rendered - checked).as_secs_f64() * 1e3,
    );
}

fn main() {
    for statements in [20_000, 40_000, 80_000] {
        time("statements", statements, &long_forward(statements));
    }
    for errors in [2_000, 4_000, 8_000] {
        time("misspellings", errors, &many_errors(errors));
    }
    for depth in [10_000, 100_000, 1_000_000] {
        time(
            "prefix run",
            depth,
            &format!("model M {{ config {{ d: int = {}1 }} }}", "-".repeat(depth)),
        );
    }
}
