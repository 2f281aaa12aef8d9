//! `docs/language.md`'s table of built-ins is the builtin table's own rendering: a new or changed
//! entry fails here until the document shows it. `LMX_BLESS=1` rewrites the document's table.

use std::path::Path;

const START: &str = "<!-- builtins:start (generated from grammar/src/builtins/table.rs) -->\n";
const END: &str = "<!-- builtins:end -->";

#[test]
fn language_doc_lists_every_builtin_as_the_table_does() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/language.md");
    let doc = std::fs::read_to_string(&path).expect("docs/language.md");
    let (Some(a), Some(b)) = (doc.find(START), doc.find(END)) else {
        panic!("docs/language.md lacks the markers {START:?} and {END:?}");
    };
    let table = lmx_grammar::builtins::markdown_table();
    let shown = &doc[a + START.len()..b];
    if std::env::var_os("LMX_BLESS").is_some() {
        let updated = format!("{}{START}{table}{}", &doc[..a], &doc[b..]);
        std::fs::write(&path, updated).expect("write docs/language.md");
        return;
    }
    if let Some((doc_line, table_line)) = shown
        .lines()
        .zip(table.lines())
        .find(|(a, b)| a != b)
        .or_else(|| (shown.lines().count() != table.lines().count()).then_some(("(length)", "")))
    {
        panic!(
            "docs/language.md's built-in table differs from the builtin table (run with \
             LMX_BLESS=1 to rewrite it):\n  document: {doc_line}\n  table:    {table_line}"
        );
    }
}

#[test]
fn every_builtin_has_a_documented_form_and_unique_name() {
    let mut names = std::collections::HashSet::new();
    for b in lmx_grammar::builtins::TABLE {
        assert!(names.insert(b.name), "`{}` is listed twice", b.name);
        assert!(
            b.tensor.is_some() || b.statik.is_some(),
            "`{}` has no form",
            b.name
        );
        assert!(
            !b.doc.is_empty() && !b.result.is_empty(),
            "`{}` is undocumented",
            b.name
        );
    }
}
