//! mlx-c's sources, taken from the published `mlx-sys` 0.7.0 crate (never copied into this
//! repository), and a patched copy of them in `OUT_DIR`.

use crate::fail;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The published crate whose `src/mlx-c` holds mlx-c 0.7.0.
const PUBLISHED: &str = "mlx-sys-0.7.0";

/// Copies mlx-c into `OUT_DIR/mlx-c`, patches it, and returns that directory.
pub fn prepare(out_dir: &Path, cache: &Path) -> PathBuf {
    let published = published_sources(cache);
    let copy = out_dir.join("mlx-c");
    let _ = fs::remove_dir_all(&copy);
    copy_dir(&published.join("mlx/c"), &copy.join("mlx/c"));
    fs::copy(
        published.join("CMakeLists.txt"),
        copy.join("CMakeLists.txt"),
    )
    .unwrap_or_else(|err| fail::with(format!("cannot copy mlx-c's CMakeLists.txt: {err}")));
    patch(&copy);
    copy
}

/// The translation units mlx-c's CMakeLists.txt compiles, in its order.
pub fn sources(mlx_c: &Path) -> Vec<PathBuf> {
    let cmake = fs::read_to_string(mlx_c.join("CMakeLists.txt"))
        .unwrap_or_else(|err| fail::with(format!("cannot read mlx-c's CMakeLists.txt: {err}")));
    let sources: Vec<PathBuf> = cmake
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("${CMAKE_CURRENT_LIST_DIR}/"))
        .filter(|file| file.ends_with(".cpp"))
        .map(|file| mlx_c.join(file.trim_end_matches(')')))
        .collect();
    if sources.is_empty() {
        fail::with("mlx-c's CMakeLists.txt lists no sources");
    }
    sources
}

/// mlx-c's public headers, sorted, for bindgen.
pub fn headers(mlx_c: &Path) -> Vec<PathBuf> {
    let dir = mlx_c.join("mlx/c");
    let mut headers: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|err| fail::with(format!("cannot list {}: {err}", dir.display())))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "h"))
        .collect();
    headers.sort();
    headers
}

/// `src/mlx-c` of the published crate: from the cargo registry if it is there, else fetched.
fn published_sources(cache: &Path) -> PathBuf {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .unwrap_or_else(|| fail::with("neither CARGO_HOME nor HOME is set"));
    let registry = cargo_home.join("registry");
    if let Some(unpacked) = in_registry(&registry.join("src"), |dir| dir.join(PUBLISHED)) {
        return unpacked.join("src/mlx-c");
    }
    let unpacked = cache.join(PUBLISHED);
    if unpacked.join("src/mlx-c/CMakeLists.txt").is_file() {
        return unpacked.join("src/mlx-c");
    }
    let archive = in_registry(&registry.join("cache"), crate_file)
        .unwrap_or_else(|| fetch_published(cache, &cargo_home));
    unpack(&archive, cache);
    unpacked.join("src/mlx-c")
}

fn crate_file(index_dir: &Path) -> PathBuf {
    index_dir.join(format!("{PUBLISHED}.crate"))
}

/// The first `<registry>/<index>/...` path made by `candidate` that exists.
fn in_registry(dir: &Path, candidate: impl Fn(&Path) -> PathBuf) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok())
        .map(|entry| candidate(&entry.path()))
        .find(|path| path.exists())
}

/// Downloads the published crate with `cargo fetch` on a throwaway manifest. It runs with a
/// CARGO_HOME of its own (the outer cargo holds the registry's lock) that keeps the user's config.
fn fetch_published(cache: &Path, cargo_home: &Path) -> PathBuf {
    let project = cache.join("fetch-mlx-c");
    let home = project.join("cargo-home");
    fs::create_dir_all(project.join("src"))
        .and_then(|()| fs::create_dir_all(&home))
        .and_then(|()| {
            fs::write(
                project.join("Cargo.toml"),
                "[package]\nname = \"fetch-mlx-c\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
                 # Outside any enclosing workspace (the cache sits in a target directory).\n\
                 [workspace]\n\n\
                 [dependencies]\nmlx-sys = { version = \"=0.7.0\", default-features = false }\n",
            )
        })
        .and_then(|()| fs::write(project.join("src/lib.rs"), ""))
        .unwrap_or_else(|err| fail::with(format!("cannot write {}: {err}", project.display())));
    for config in ["config.toml", "config"] {
        if cargo_home.join(config).is_file() {
            let _ = fs::copy(cargo_home.join(config), home.join(config));
        }
    }
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .arg("fetch")
        .current_dir(&project)
        .env("CARGO_HOME", &home)
        .env_remove("CARGO_TARGET_DIR")
        .status();
    if !status.is_ok_and(|status| status.success()) {
        fail::with(format!(
            "mlx-c's sources come from the published {PUBLISHED} crate, which is not in the cargo \
             registry and `cargo fetch` could not download it. Run `cargo fetch` with network \
             access once, or place {PUBLISHED}.crate under {}",
            cargo_home.join("registry/cache/<index>").display()
        ));
    }
    in_registry(&home.join("registry/cache"), crate_file)
        .unwrap_or_else(|| fail::with("`cargo fetch` succeeded but left no mlx-sys-0.7.0.crate"))
}

fn unpack(archive: &Path, into: &Path) {
    fs::create_dir_all(into)
        .unwrap_or_else(|err| fail::with(format!("cannot create {}: {err}", into.display())));
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .status();
    if !status.is_ok_and(|status| status.success()) {
        fail::with(format!("cannot unpack {} with tar", archive.display()));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to)
        .unwrap_or_else(|err| fail::with(format!("cannot create {}: {err}", to.display())));
    let entries = fs::read_dir(from)
        .unwrap_or_else(|err| fail::with(format!("cannot read {}: {err}", from.display())));
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            fs::copy(&path, &target)
                .unwrap_or_else(|err| fail::with(format!("cannot copy {}: {err}", path.display())));
        }
    }
}

/// Patches for what mlx-c 0.7.0 assumes of its compiler and target:
/// - `private/io.h` formats its messages with `std::format`, which g++ 12 lacks;
/// - `half.h` declares the float16/bfloat16 accessors only on aarch64, while mlx-rs calls them on
///   every target.
fn patch(mlx_c: &Path) {
    let csrc = Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc");
    for (file, into) in [("format_compat.h", "mlx/c/private"), ("half.h", "mlx/c")] {
        fs::copy(csrc.join(file), mlx_c.join(into).join(file))
            .unwrap_or_else(|err| fail::with(format!("cannot copy csrc/{file}: {err}")));
    }
    replace_in(
        &mlx_c.join("mlx/c/private/io.h"),
        &[
            (
                "#include <streambuf>\n",
                "#include <streambuf>\n\n#include \"mlx/c/private/format_compat.h\"\n",
            ),
            ("std::format(", "mlx_c_compat::format("),
        ],
    );
}

/// Replaces each pattern in `file`, failing loudly when one is missing (mlx-c changed).
fn replace_in(file: &Path, replacements: &[(&str, &str)]) {
    let mut text = fs::read_to_string(file)
        .unwrap_or_else(|err| fail::with(format!("cannot read {}: {err}", file.display())));
    for (pattern, replacement) in replacements {
        if !text.contains(pattern) {
            fail::with(format!("{} no longer contains {pattern:?}", file.display()));
        }
        text = text.replace(pattern, replacement);
    }
    fs::write(file, text)
        .unwrap_or_else(|err| fail::with(format!("cannot write {}: {err}", file.display())));
}
