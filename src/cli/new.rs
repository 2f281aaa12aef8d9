//! `lmx new NAME`: a crate of one's own, whose binary is the lmx command line over its models.

use std::path::{Path, PathBuf};

/// The lmx checkout this binary was built from: where `lmx new` points a crate's path
/// dependency, unless `--lmx-path` says otherwise.
pub const BUILT_FROM: &str = env!("CARGO_MANIFEST_DIR");

/// Names cargo or Rust keep for themselves: a package, binary or module cannot take them.
const RESERVED: &[&str] = &[
    "lmx",
    "test",
    "std",
    "core",
    "alloc",
    "proc_macro",
    "build",
    "deps",
    "examples",
    "incremental",
    "as",
    "break",
    "const",
    "continue",
    "crate",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "Self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "async",
    "await",
    "dyn",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "macro",
    "override",
    "priv",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "try",
    "gen",
];

/// A crate to write: its package name, the lmx it depends on, its `.lmx` models and `main.rs`.
pub struct CrateFiles {
    /// The package name.
    pub package: String,
    /// The lmx checkout of its path dependency (absolute).
    pub lmx: PathBuf,
    /// `(file name in models/, source)` of each model.
    pub models: Vec<(String, String)>,
    /// The default step of each model `main.rs` registers, as `module::Step` (its first declared
    /// step's type, which registers the others by name); the first is `train`'s default model.
    pub registered: Vec<String>,
    /// Whether to copy lmx's corpus into `data/`, which `lmx train` reads by default.
    pub corpus: bool,
}

/// Writes a new crate into `path` (which must not exist, or be an empty folder), with the
/// template model `models/NAME.lmx`, and says how to train it.
pub fn new(path: &Path, lmx_path: Option<&Path>) -> anyhow::Result<()> {
    let package = crate_name(path)?;
    refuse_unless_empty(path)?;
    let lmx = lmx_checkout(lmx_path)?;
    let (module, model) = template_model(&package)?;
    let files = CrateFiles {
        package: package.clone(),
        lmx,
        models: vec![(format!("{module}.lmx"), model)],
        registered: vec![format!("{module}::Train")],
        corpus: true,
    };
    write_crate(path, &files)?;
    println!(
        "created {package} in {}: models/{module}.lmx, trained by `cargo run --release -- train`",
        path.display()
    );
    Ok(())
}

/// The package name a folder gives: its last component, which must be a valid package and
/// module name.
pub fn crate_name(path: &Path) -> anyhow::Result<String> {
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| anyhow::anyhow!("`{}` names no folder", path.display()))?;
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        anyhow::bail!(
            "`{name}` is no valid crate name: it must start with a letter and hold only ASCII \
             letters, digits, `-` and `_`"
        );
    }
    let module = name.replace('-', "_");
    if RESERVED.contains(&name) || RESERVED.contains(&module.as_str()) {
        anyhow::bail!(
            "`{name}` is a name Rust or cargo keeps for itself (or lmx's own): choose another"
        );
    }
    Ok(name.to_owned())
}

fn refuse_unless_empty(path: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(path) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                anyhow::bail!(
                    "{} exists and is not empty: lmx new writes a crate into a new or empty folder",
                    path.display()
                );
            }
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) if path.exists() && !path.is_dir() => {
            anyhow::bail!("{} exists and is not a folder ({err})", path.display())
        }
        Err(err) => anyhow::bail!("cannot read {}: {err}", path.display()),
    }
}

/// The lmx checkout a crate depends on: `given`, or the one this binary was built from; it must
/// be lmx's own workspace (its `Cargo.toml` and `mlx-sys/`).
pub fn lmx_checkout(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = given.unwrap_or(Path::new(BUILT_FROM));
    let manifest = std::fs::read_to_string(path.join("Cargo.toml")).unwrap_or_default();
    let is_lmx = manifest.lines().any(|line| line.trim() == "name = \"lmx\"")
        && path.join("mlx-sys").join("Cargo.toml").is_file();
    if !is_lmx {
        anyhow::bail!(
            "{} is no lmx checkout (its Cargo.toml and mlx-sys/): give one with --lmx-path{}",
            path.display(),
            if given.is_none() {
                " (this binary was built there, but it is gone or moved)"
            } else {
                ""
            }
        );
    }
    std::fs::canonicalize(path).map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))
}

/// Writes `files` as a crate into `path`: first into a sibling folder, which then takes the
/// name, so that a failure leaves no half-written crate.
pub fn write_crate(path: &Path, files: &CrateFiles) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent)
        .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", parent.display()))?;
    let staging = parent.join(format!(".{}.lmx-new-{}", files.package, std::process::id()));
    let written = write_into(&staging, files).and_then(|()| {
        std::fs::rename(&staging, path)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", path.display()))
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}

fn write_into(dir: &Path, files: &CrateFiles) -> anyhow::Result<()> {
    let write = |name: &str, contents: &[u8]| -> anyhow::Result<()> {
        let file = dir.join(name);
        if let Some(folder) = file.parent() {
            std::fs::create_dir_all(folder)
                .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", folder.display()))?;
        }
        std::fs::write(&file, contents)
            .map_err(|err| anyhow::anyhow!("cannot write {}: {err}", file.display()))
    };
    write(
        "Cargo.toml",
        manifest(&files.package, &files.lmx).as_bytes(),
    )?;
    write("build.rs", BUILD_RS.as_bytes())?;
    write(
        "src/main.rs",
        main_rs(&files.package, &files.registered).as_bytes(),
    )?;
    write(".gitignore", b"/target\n/runs\n")?;
    for (name, source) in &files.models {
        write(&format!("models/{name}"), source.as_bytes())?;
    }
    // The lock file lmx is tested with, so that the crate builds with the same dependency
    // versions (and, sharing a target folder, reuses their builds); and the corpus `lmx train`
    // reads by default.
    let corpus: &[&str] = if files.corpus {
        &["data/shakespeare.txt", "data/README.md"]
    } else {
        &[]
    };
    for copied in ["Cargo.lock"].iter().chain(corpus) {
        let from = files.lmx.join(copied);
        if from.is_file() {
            let contents = std::fs::read(&from)
                .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", from.display()))?;
            write(copied, &contents)?;
        }
    }
    Ok(())
}

/// `Cargo.toml`: lmx is the only dependency.
fn manifest(package: &str, lmx: &Path) -> String {
    let lmx_dir = toml::Value::String(lmx.display().to_string());
    let mlx_sys = toml::Value::String(lmx.join("mlx-sys").display().to_string());
    format!(
        r#"[package]
name = "{package}"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
lmx = {{ path = {lmx_dir} }}

# build.rs compiles models/*.lmx through `lmx::build`; without default features this copy of
# lmx compiles no MLX.
[build-dependencies]
lmx = {{ path = {lmx_dir}, default-features = false }}

# lmx builds MLX's C API through its own mlx-sys, which replaces the crates.io one that mlx-rs
# names. Cargo applies patches only in a workspace's root Cargo.toml: if this crate joins a
# workspace, move this table there.
[patch.crates-io]
mlx-sys = {{ path = {mlx_sys} }}

# A workspace of its own, so that it builds inside another project's folder too.
[workspace]
"#
    )
}

const BUILD_RS: &str = r#"// Compiles models/*.lmx into Rust (a file with errors fails the build with its diagnostics) and
// links the crate's binaries to MLX.
fn main() {
    lmx::build::compile_models("models");
}
"#;

/// `src/main.rs`: the lmx command line with the crate's models registered.
fn main_rs(package: &str, steps: &[String]) -> String {
    let registered: String = steps
        .iter()
        .map(|step| format!("        .model::<models::{step}>()\n"))
        .collect();
    format!(
        r#"//! {package}: the lmx command line over this crate's models (`cargo run --release -- --help`).

/// The models of `models/`, compiled by build.rs: one module per `.lmx` file.
// Each module holds more than the command line uses (its forward pass, its steps' parts).
#[allow(dead_code)]
mod models {{
    include!(concat!(env!("OUT_DIR"), "/models.rs"));
}}

fn main() -> std::process::ExitCode {{
    // The first model registered is `train`'s default. A model's first step is its default, its
    // other steps train by name (`--step NAME`); a model under `#[lmx::model]` registers its
    // training step the same way.
    lmx::cli::Registry::new()
        .sources(models::SOURCES)
{registered}        .main()
}}
"#
    )
}

/// A small decoder-only transformer of the crate's own (not a bundled model): learned positions,
/// RMSNorm, a ReLU feed-forward, untied input and output embeddings; named after the package,
/// and with the module name its generated code takes.
fn template_model(package: &str) -> anyhow::Result<(String, String)> {
    let model: String = package
        .split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or(String::new(), |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    let source = TEMPLATE.replace("Template", &model);
    let checked = lmx_grammar::check_source("template.lmx", &source)
        .map_err(|rendered| anyhow::anyhow!("the template model: {rendered}"))?;
    let module = lmx_grammar::codegen::module_name(&checked);
    if RESERVED.contains(&module.as_str()) {
        anyhow::bail!(
            "`{package}` makes the module name `{module}`, which Rust keeps: choose another"
        );
    }
    Ok((module, source))
}

const TEMPLATE: &str = r#"// A small decoder-only transformer: learned positions, pre-norm RMSNorm, a ReLU feed-forward
// and an output head of its own. Change it and run `cargo run --release -- train`; `cargo run --
// check models/FILE.lmx` shows what the checker says about it.
model Template {
    config {
        vocab: int = 2048
        ctx: int = 256
        d_model: int = 128
        n_layers: int = 2
        n_heads: int = 4
        eps: float = 1e-5
        head_dim = d_model / n_heads
        d_ff = 4 * d_model
    }

    // `lmx train`'s default preset: a 2,048-id BPE tokenizer trained on the data.
    preset bpe { }
    // A character-level model of bytes (256 bytes and an end-of-text id).
    preset bytes { vocab = 257 }
    preset tiny { d_model = 32, n_layers = 1, n_heads = 2, vocab = 257, ctx = 64 }

    block Attention {
        params {
            qkv: linear(d_model, 3 * d_model)
            out: linear(d_model, d_model)
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            let q, k, v = split(qkv(x), 3, axis = -1)
            let q = transpose(reshape(q, [B, T, n_heads, head_dim]), [0, 2, 1, 3])
            let k = transpose(reshape(k, [B, T, n_heads, head_dim]), [0, 2, 1, 3])
            let v = transpose(reshape(v, [B, T, n_heads, head_dim]), [0, 2, 1, 3])
            let a = attention(q, k, v, causal = true, scale = 1.0 / sqrt(head_dim))
            out(reshape(transpose(a, [0, 2, 1, 3]), [B, T, d_model]))
        }
    }

    block Layer {
        params {
            norm_1: rms_norm(d_model, eps = eps)
            attn: Attention
            norm_2: rms_norm(d_model, eps = eps)
            up: linear(d_model, d_ff)
            down: linear(d_ff, d_model)
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            let x = x + attn(norm_1(x))
            x + down(relu(up(norm_2(x))))
        }
    }

    params {
        embed: embedding(vocab, d_model)
        positions: embedding(ctx, d_model)
        layers: [Layer; n_layers]
        norm: rms_norm(d_model, eps = eps)
        head: linear(d_model, vocab, bias = false)
    }

    forward(tokens: [B, T] int) -> [B, T, vocab] {
        let x = embed(tokens) + positions(arange(T))
        for layer in layers {
            x = layer(x)
        }
        head(norm(x))
    }

    step train(tokens: [B, T] int, targets: [B, T] int) {
        optimizer adamw(beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1)
        let loss = cross_entropy(forward(tokens), targets)
        let grads, grad_norm = clip_grad_norm(grad(loss), 1.0)
        update grads
        metrics loss, grad_norm
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_model_checks_under_any_valid_name() {
        for (name, expected) in [
            ("tiny", "tiny"),
            ("my-model", "my_model"),
            ("shakespeare_2", "shakespeare2"),
            ("MyModel", "my_model"),
        ] {
            let package = crate_name(Path::new(name)).unwrap();
            let (module, source) = template_model(&package).unwrap();
            assert_eq!(module, expected);
            assert!(source.contains("model "), "{source}");
        }
    }

    #[test]
    fn invalid_names_are_refused_with_the_reason() {
        let err = |name: &str| crate_name(Path::new(name)).unwrap_err().to_string();
        assert_eq!(
            err("2fast"),
            "`2fast` is no valid crate name: it must start with a letter and hold only ASCII \
             letters, digits, `-` and `_`"
        );
        assert!(err("my model").contains("no valid crate name"));
        assert!(err("héllo").contains("no valid crate name"));
        assert_eq!(
            err("type"),
            "`type` is a name Rust or cargo keeps for itself (or lmx's own): choose another"
        );
        assert!(err("lmx").contains("keeps for itself"));
    }
}
