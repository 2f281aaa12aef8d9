//! Writes the programs this crate compiles into `OUT_DIR`: mutants of each bundled model
//! (`models/*.lmx`, mutated by `src/mutate.rs` from `SEED`, `ROUNDS` per kind of mutation) and every accept case
//! of the checker's corpus (`grammar/tests/accept/*.lmx`), each renamed to a model name of its
//! own. Each program is checked; those the checker accepts are generated into
//! `OUT_DIR/programs/ID.rs` (one module each, next to its source `ID.lmx`) and listed in
//! `OUT_DIR/programs.rs` with the outcome of every program, which `src/lib.rs` includes. A
//! program that the code generator refuses is recorded, not fatal: the tests report it.

include!("../../mlx-sys/link_args.rs");

#[path = "src/known.rs"]
mod known;
#[path = "src/mutate.rs"]
mod mutate;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use known::Stage;

/// The seed of the mutation engine: changing it (or a bundled model) draws other mutants, whose
/// numbers the known-failures list would then no longer match.
const SEED: u64 = 20;

/// Mutants drawn per bundled model and kind of mutation the model offers: each kind leads
/// this many mutants of each model. Each mutant adds a model module to this crate (about
/// 0.3 s of debug compilation) and a forward pass to its tests.
const ROUNDS: usize = 1;

/// One program to compile.
struct Candidate {
    /// The model name it is renamed to (its module is that name in snake case).
    name: String,
    /// The file it comes from, relative to the workspace.
    origin: String,
    /// The mutations applied (none for an accept case).
    mutations: Vec<String>,
    /// Its full source.
    source: String,
    /// For a mutant whose mutations all keep the logits, the path of the bundled model it
    /// came from (`::lmx::models::gpt2::Gpt2`), whose forward pass it must match.
    reference: Option<String>,
}

fn main() {
    mlx_link_args("MLX");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=known-failures.txt");
    if let Err(message) = run(&root, &manifest, &out) {
        for line in message.lines() {
            println!("cargo::error={line}");
        }
    }
}

fn run(root: &Path, manifest: &Path, out: &Path) -> Result<(), String> {
    let known_text = read(&manifest.join("known-failures.txt"))?;
    let known = known::parse(&known_text)?;
    let mut candidates = Vec::new();
    for file in lmx_files(&root.join("models"))? {
        candidates.extend(mutants(&file, &relative(root, &file))?);
    }
    for file in lmx_files(&root.join("grammar/tests/accept"))? {
        candidates.push(accept_case(&file, &relative(root, &file))?);
    }
    let dir = out.join("programs");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut modules = String::new();
    let mut sources = String::new();
    let mut programs = String::new();
    let mut used = std::collections::BTreeSet::new();
    for c in &candidates {
        let lmx_path = dir.join(format!("{}.lmx", c.name));
        write(&lmx_path, &c.source)?;
        let outcome = match lmx_grammar::compile_str(&c.source) {
            Err(diags) => {
                let first = diags.first().map_or(String::new(), |d| {
                    let at = d.labels.first().map_or(0, |l| l.span.start);
                    format!(
                        "{} at {}: {}",
                        d.code,
                        mutate::position(&c.source, at),
                        d.message
                    )
                });
                format!("crate::Outcome::Rejected({first:?})")
            }
            Ok(checked) => {
                let id = lmx_grammar::codegen::module_name(&checked);
                if !used.insert(id.clone()) {
                    return Err(format!("{}: a second program named `{id}`", c.origin));
                }
                let skipped = known
                    .iter()
                    .find(|k| k.id == c.name && k.stage == Stage::Rustc);
                let generated = lmx_grammar::codegen::generate_items(&checked)
                    .map_err(|d| lmx_grammar::render(&d, &format!("{}.lmx", c.name), &c.source))
                    .and_then(|items| {
                        syn::parse2::<syn::File>(items)
                            .map_err(|e| format!("the code generator produced invalid Rust: {e}"))
                    });
                match (skipped, generated) {
                    (Some(k), _) => format!("crate::Outcome::Skipped({:?})", k.error),
                    (None, Err(text)) => format!("crate::Outcome::NotGenerated({text:?})"),
                    (None, Ok(file)) => {
                        let rs_path = dir.join(format!("{}.rs", c.name));
                        write(&rs_path, &prettyplease::unparse(&file))?;
                        let _ = writeln!(
                            modules,
                            "#[path = {:?}]\npub mod {id};",
                            rs_path.display().to_string()
                        );
                        let _ = writeln!(
                            sources,
                            "    ({id:?}, {:?}, include_str!({:?})),",
                            c.origin,
                            lmx_path.display().to_string()
                        );
                        let (preset, params) = run_preset(&checked);
                        let reference = c.reference.as_ref().map_or("None".to_string(), |r| {
                            format!("Some(crate::forward_once::<{r}>)")
                        });
                        format!(
                            "crate::Outcome::Compiled {{ preset: {preset:?}, params: {params}, forward: crate::forward_once::<{id}::{}>, reference: {reference} }}",
                            checked.name
                        )
                    }
                }
            }
        };
        let _ = writeln!(
            programs,
            "    crate::Program {{ name: {:?}, origin: {:?}, mutations: &{:?}, source: include_str!({:?}), outcome: {outcome} }},",
            c.name,
            c.origin,
            c.mutations,
            lmx_path.display().to_string()
        );
    }
    let text = format!(
        "// Generated by build.rs from models/*.lmx (seed {SEED}) and grammar/tests/accept/*.lmx.\n\n\
         {modules}\n\
         /// Every compiled program: its module name, its origin and its source.\n\
         pub const SOURCES: &[(&str, &str, &str)] = &[\n{sources}];\n\n\
         /// Every program, compiled or not, with its outcome.\n\
         pub const PROGRAMS: &[crate::Program] = &[\n{programs}];\n"
    );
    write(&out.join("programs.rs"), &text)
}

/// `ROUNDS` mutants per kind of mutation of the model in `file`.
fn mutants(file: &Path, origin: &str) -> Result<Vec<Candidate>, String> {
    let source = read(file)?;
    let model =
        lmx_grammar::parse(&source).map_err(|d| lmx_grammar::render(&[d], origin, &source))?;
    let original = lmx_grammar::check_source(origin, &source)?;
    let original = format!(
        "::lmx::models::{}::{}",
        lmx_grammar::codegen::module_name(&original),
        original.name
    );
    let sites = mutate::sites(&model, &source);
    let seed = SEED ^ fnv1a(origin.as_bytes());
    let mut out = Vec::new();
    let kinds: std::collections::BTreeSet<mutate::Kind> = sites.iter().map(|s| s.kind).collect();
    for (i, choice) in mutate::choose(&sites, kinds.len() * ROUNDS, seed)
        .iter()
        .enumerate()
    {
        let chosen: Vec<&mutate::Site> = choice.iter().map(|&s| &sites[s]).collect();
        let name = format!("{}M{i:03}", model.name.name);
        let mutations: Vec<String> = chosen.iter().map(|s| s.what.clone()).collect();
        let header = format!(
            "// Mutant {i} of {origin} (seed {SEED}; positions are the original file's): {}\n",
            mutations.join("; ")
        );
        let source = header + &mutate::apply(&model, &source, &chosen, &name);
        let same = chosen.iter().all(|s| s.kind.preserves_logits());
        out.push(Candidate {
            name,
            origin: origin.to_string(),
            mutations,
            source,
            reference: same.then(|| original.clone()),
        });
    }
    Ok(out)
}

/// An accept case, renamed `Accept` + its file name in camel case.
fn accept_case(file: &Path, origin: &str) -> Result<Candidate, String> {
    let source = read(file)?;
    let stem = file
        .file_stem()
        .map_or(String::new(), |s| s.to_string_lossy().into_owned());
    let name = format!("Accept{}", camel(&stem));
    // A case that does not parse is the corpus test's failure; here it is a rejected program.
    let source = match lmx_grammar::parse(&source) {
        Ok(model) => mutate::apply(&model, &source, &[], &name),
        Err(_) => source,
    };
    Ok(Candidate {
        name,
        origin: origin.to_string(),
        mutations: Vec::new(),
        source,
        reference: None,
    })
}

/// The preset a forward pass runs at, and its parameter count: `tiny` where there is one (the
/// bundled models' smallest, which a mutant's reference also has), else the one with the fewest
/// parameters (the first of equals).
fn run_preset(model: &lmx_grammar::CheckedModel) -> (String, u64) {
    let count = |name: &str| {
        lmx_grammar::report::report(model, name, 1, Some(8))
            .ok()
            .map(|r| r.param_count)
    };
    if let Some(params) = count("tiny") {
        return ("tiny".to_string(), params);
    }
    model
        .presets
        .iter()
        .filter_map(|p| count(&p.name).map(|params| (p.name.clone(), params)))
        .min_by_key(|(_, params)| *params)
        .unwrap_or_else(|| ("default".to_string(), u64::MAX))
}

/// The `.lmx` files of `dir`, sorted; cargo reruns the script when one changes.
fn lmx_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "lmx"))
        .collect();
    files.sort();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    Ok(files)
}

fn relative(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `text` unless the file already holds it (so that rustc's inputs keep their times).
fn write(path: &Path, text: &str) -> Result<(), String> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `full-slice` and `full_slice` to `FullSlice`.
fn camel(stem: &str) -> String {
    stem.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or(String::new(), |c| {
                c.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// FNV-1a, to derive each model's seed from its file name.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
