//! Snapshot tests of rendered diagnostics: each `diagnostics/NAME.lmx` must render
//! exactly `diagnostics/NAME.stderr`. Run with `LMX_BLESS=1` to rewrite the snapshots
//! after reviewing a deliberate change.

use std::path::Path;

fn render_case(path: &Path) -> String {
    let source = std::fs::read_to_string(path).expect("case file");
    let name = format!(
        "{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    match lmx_grammar::check_source(&name, &source) {
        Ok(_) => "checked without errors\n".to_string(),
        Err(text) => text,
    }
}

#[test]
fn diagnostics_match_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .expect("diagnostics dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "lmx"))
        .collect();
    cases.sort();
    let bless = std::env::var_os("LMX_BLESS").is_some();
    let mut failures = Vec::new();
    let mut codes = std::collections::BTreeSet::new();
    for case in &cases {
        let got = render_case(case);
        let snapshot = case.with_extension("stderr");
        if bless {
            std::fs::write(&snapshot, &got).expect("write snapshot");
            continue;
        }
        let want = std::fs::read_to_string(&snapshot).unwrap_or_default();
        if got != want {
            failures.push(format!(
                "{}:\n--- want\n{want}\n--- got\n{got}",
                case.display()
            ));
        }
        for line in got.lines() {
            if let Some(code) = line
                .trim()
                .strip_suffix("")
                .and_then(|l| l.split_whitespace().next())
            {
                if code.starts_with("lmx::") {
                    codes.insert(code.to_string());
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every code a small file can reach has a case (all but the size limits, covered by
    // tests/limits.rs, and the code generator's); a case lost or merged shows here.
    assert!(
        bless || codes.len() >= 71,
        "only {} distinct diagnostics: {codes:?}",
        codes.len()
    );
}

#[test]
fn every_case_reports_one_diagnostic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    for entry in std::fs::read_dir(&dir).expect("diagnostics dir").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lmx") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("case file");
        let diags = lmx_grammar::compile_str(&source).err().unwrap_or_default();
        assert_eq!(diags.len(), 1, "{}: {diags:#?}", path.display());
    }
}

/// Every `accept/NAME.lmx` checks without a diagnostic and generates code.
#[test]
fn accept_cases_check_and_generate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/accept");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("accept dir").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lmx") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("case file");
        let name = path.display().to_string();
        let model =
            lmx_grammar::check_source(&name, &source).unwrap_or_else(|text| panic!("{text}"));
        for preset in &model.presets {
            lmx_grammar::report::report(&model, &preset.name, 1, None)
                .unwrap_or_else(|d| panic!("{name}: preset {}: {d:?}", preset.name));
        }
        lmx_grammar::codegen::generate_module(&model, "")
            .unwrap_or_else(|d| panic!("{}", lmx_grammar::render(&d, &name, &source)));
        count += 1;
    }
    assert!(count >= 39, "{count} accept cases");
}
