fn main() {
    for path in std::env::args().skip(1) {
        let src = std::fs::read_to_string(&path).unwrap();
        match lmx_grammar::check_source(&path, &src) {
            Err(e) => println!("== {path}: REJECTED\n{e}"),
            Ok(m) => match lmx_grammar::codegen::generate(&m) {
                Ok(_) => println!("== {path}: ok"),
                Err(d) => println!(
                    "== {path}: CODEGEN FAILED\n{}",
                    lmx_grammar::render(&d, &path, &src)
                ),
            },
        }
    }
}
