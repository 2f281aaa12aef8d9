//! libclang for bindgen: `LIBCLANG_PATH`, the system's, or the `libclang` wheel from PyPI.

use crate::{fail, python};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `libclang` wheel fetched when the system has none.
const WHEEL: &str = "libclang==18.1.1";

/// Makes libclang loadable by bindgen and returns the extra clang arguments it needs.
pub fn prepare(cache: &Path) -> Vec<String> {
    if env::var_os("LIBCLANG_PATH").is_some() || system_libclang().is_some() {
        return Vec::new();
    }
    let dir = wheel_libclang(cache);
    env::set_var("LIBCLANG_PATH", &dir);
    // The wheel ships libclang without clang's builtin headers (stddef.h, float.h, ...): use the C
    // compiler's own.
    compiler_include_dir()
        .map(|include| vec![format!("-isystem{}", include.display())])
        .unwrap_or_default()
}

/// A libclang that clang-sys finds by itself in the usual places.
fn system_libclang() -> Option<PathBuf> {
    let patterns = [
        "/usr/lib/llvm-*/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/Library/Developer/CommandLineTools/usr/lib",
        "/Applications/Xcode.app/Contents/Developer/Toolchains/XcodeDefault.xctoolchain/usr/lib",
    ];
    patterns
        .iter()
        .flat_map(|pattern| expand(pattern))
        .find_map(|dir| {
            fs::read_dir(&dir)
                .ok()?
                .filter_map(Result::ok)
                .find_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let is_libclang = name == "libclang.dylib"
                        || name == "libclang.so"
                        || (name.starts_with("libclang.so.") || name.starts_with("libclang-"))
                            && name.contains(".so")
                            && !name.contains("cpp");
                    is_libclang.then(|| entry.path())
                })
        })
}

/// Expands one trailing-free `*` in a directory pattern.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let Some((head, tail)) = pattern.split_once('*') else {
        return vec![PathBuf::from(pattern)];
    };
    let (parent, prefix) = head.rsplit_once('/').unwrap_or(("", head));
    let Ok(entries) = fs::read_dir(if parent.is_empty() { "/" } else { parent }) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| PathBuf::from(format!("{}{tail}", entry.path().display())))
        .filter(|dir| dir.is_dir())
        .collect();
    dirs.sort();
    dirs.reverse();
    dirs
}

/// The directory of `libclang.so` from the PyPI wheel, installed under `cache` once.
fn wheel_libclang(cache: &Path) -> PathBuf {
    match python::install_once(cache, "libclang-18.1.1", &[WHEEL], false) {
        Ok(root) => root.join("clang/native"),
        Err(python::InstallError::Pip(pip_error)) => fail::with(format!(
            "bindgen needs libclang: none was found on the system and pip could not fetch \
             {WHEEL}:\n{pip_error}\n\nInstall libclang (e.g. Debian's libclang-dev) or set \
             LIBCLANG_PATH to the directory that holds libclang.so"
        )),
        Err(python::InstallError::Cache(why)) => fail::with(why),
    }
}

/// The C compiler's own header directory (`cc -print-file-name=include`).
fn compiler_include_dir() -> Option<PathBuf> {
    let compiler = env::var_os("CC").unwrap_or_else(|| "cc".into());
    let output = Command::new(compiler)
        .arg("-print-file-name=include")
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    dir.is_dir().then_some(dir)
}
