//! Published parameter counts of the bundled models, computed from their `.lmx` files.

use lmx_grammar::report::report;

fn count(file: &str, preset: &str) -> u64 {
    let path = format!("{}/../models/{file}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).expect("model file");
    let model = lmx_grammar::check_source(&path, &source).unwrap_or_else(|e| panic!("{e}"));
    report(&model, preset, 1, None).expect("report").param_count
}

#[test]
fn gpt2_published_counts() {
    assert_eq!(count("gpt2.lmx", "124m"), 124_439_808);
    assert_eq!(count("gpt2.lmx", "355m"), 354_823_168);
    assert_eq!(count("gpt2.lmx", "774m"), 774_030_080);
    assert_eq!(count("gpt2.lmx", "1558m"), 1_557_611_200);
}
