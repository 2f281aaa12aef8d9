//! Compile-fail cases: each diagnostic of `#[lmx::model]` and `#[lmx::step]`, exactly.

#[test]
fn diagnostics() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
