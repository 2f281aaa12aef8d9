//! Checks `.lmx` files and prints their diagnostics: `cargo run --example lmx_check -- FILE...`.

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let source = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{path}: {e}");
                failed = true;
                continue;
            }
        };
        match lmx_grammar::check_source(&path, &source) {
            Ok(m) => println!("{path}: ok ({})", m.name),
            Err(text) => {
                eprint!("{text}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
