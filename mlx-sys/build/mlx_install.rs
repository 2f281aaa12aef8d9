//! Finding MLX: `MLX_DIR`, else the Python package `mlx`, else MLX's official wheel fetched with pip
//! into the cache. The version is pinned to the MLX that mlx-c 0.7.0 is written against.

use crate::{fail, python};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The MLX release mlx-c 0.7.0 (and so mlx-rs 0.33) expects.
pub const MLX_VERSION: &str = "0.32.2";

/// An MLX installation prefix: `lib/libmlx.{so,dylib}` and `include/mlx/mlx.h`.
pub struct Mlx {
    prefix: PathBuf,
}

impl Mlx {
    pub fn include_dir(&self) -> PathBuf {
        self.prefix.join("include")
    }

    pub fn lib_dir(&self) -> PathBuf {
        self.prefix.join("lib")
    }

    /// Why `prefix` is not a usable MLX, if it is not.
    fn problem(prefix: &Path) -> Option<String> {
        let lib = ["libmlx.so", "libmlx.dylib"]
            .iter()
            .any(|name| prefix.join("lib").join(name).is_file());
        if !lib {
            return Some(format!(
                "{} has no lib/libmlx.so or lib/libmlx.dylib",
                prefix.display()
            ));
        }
        if !prefix.join("include/mlx/mlx.h").is_file() {
            return Some(format!("{} has no include/mlx/mlx.h", prefix.display()));
        }
        match installed_version(prefix) {
            Some(version) if version != MLX_VERSION => Some(format!(
                "{} holds MLX {version}, but mlx-c 0.7.0 needs MLX {MLX_VERSION}",
                prefix.display()
            )),
            _ => None,
        }
    }
}

/// Which of MLX's official builds to fetch when none is given.
#[derive(Clone, Copy)]
enum Flavor {
    Cpu,
    Cuda13,
    Metal,
}

impl Flavor {
    fn requested() -> Flavor {
        match env::var("LMX_MLX").as_deref() {
            Ok("cuda13" | "cuda") => Flavor::Cuda13,
            Ok("cpu") => Flavor::Cpu,
            Ok("metal") => Flavor::Metal,
            Ok(other) if !other.is_empty() => fail::with(format!(
                "LMX_MLX={other} is not a known MLX build; use cpu, cuda13 or metal"
            )),
            _ if cfg!(target_os = "macos") => Flavor::Metal,
            _ => Flavor::Cpu,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Flavor::Cpu => "cpu",
            Flavor::Cuda13 => "cuda13",
            Flavor::Metal => "metal",
        }
    }

    fn wheel(self) -> &'static str {
        match self {
            Flavor::Cpu => "mlx-cpu",
            Flavor::Cuda13 => "mlx-cuda-13",
            Flavor::Metal => "mlx-metal",
        }
    }
}

/// Finds MLX, fetching its wheel if nothing else is found.
pub fn locate(cache: &Path) -> Mlx {
    if let Some(dir) = env::var_os("MLX_DIR").filter(|dir| !dir.is_empty()) {
        let prefix = PathBuf::from(dir);
        if let Some(problem) = Mlx::problem(&prefix) {
            fail::with(format!("MLX_DIR is set, but {problem}"));
        }
        return Mlx { prefix };
    }
    let flavor = Flavor::requested();
    if env::var_os("LMX_MLX").is_none() {
        if let Some(prefix) = python_mlx() {
            return Mlx { prefix };
        }
    }
    install_wheel(flavor, cache)
}

/// The prefix of the Python package `mlx`, when it is installed with the right version.
fn python_mlx() -> Option<PathBuf> {
    let output = python::run(&["-m", "mlx", "--cmake-dir"])?;
    if !output.status.success() {
        return None;
    }
    let cmake_dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    // <prefix>/share/cmake/MLX
    let prefix = cmake_dir.ancestors().nth(3)?.to_path_buf();
    match Mlx::problem(&prefix) {
        None => Some(prefix),
        Some(problem) => {
            println!("cargo:warning=ignoring the Python package mlx: {problem}");
            None
        }
    }
}

fn installed_version(prefix: &Path) -> Option<String> {
    let config = fs::read_to_string(prefix.join("share/cmake/MLX/MLXConfigVersion.cmake")).ok()?;
    let start = config.find("PACKAGE_VERSION \"")? + "PACKAGE_VERSION \"".len();
    let len = config[start..].find('"')?;
    Some(config[start..start + len].to_owned())
}

/// Installs MLX's wheel for `flavor` under `cache`, once; later builds reuse it.
fn install_wheel(flavor: Flavor, cache: &Path) -> Mlx {
    let requirement = format!("{}=={MLX_VERSION}", flavor.wheel());
    // The CUDA build needs NVIDIA's runtime wheels beside it; the others are self-contained.
    let with_deps = matches!(flavor, Flavor::Cuda13);
    let name = format!("mlx-{MLX_VERSION}-{}", flavor.name());
    let root = match python::install_once(cache, &name, &[&requirement], with_deps) {
        Ok(root) => root,
        Err(python::InstallError::Pip(pip_error)) => fail::with(format!(
            "no MLX {MLX_VERSION} was found, and pip could not fetch {requirement}:\n{pip_error}\n\n\
             Provide one of:\n  \
             1. MLX_DIR=<prefix of an MLX {MLX_VERSION} build, holding lib/ and include/>\n  \
             2. the Python package: {} -m pip install mlx=={MLX_VERSION} {requirement}\n  \
             3. network access to PyPI, so that this build fetches {requirement} itself",
            python::interpreter().to_string_lossy()
        )),
        Err(python::InstallError::Cache(why)) => fail::with(why),
    };
    let prefix = root.join("mlx");
    if let Some(problem) = Mlx::problem(&prefix) {
        fail::with(format!(
            "the {requirement} wheel is not laid out as expected: {problem}"
        ));
    }
    Mlx { prefix }
}
