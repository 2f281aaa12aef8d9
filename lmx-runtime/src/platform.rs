//! What this process runs on: which libmlx and which BLAS were loaded, and the backends available.

use crate::device::{device_count, DeviceKind};
use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// The file that provides the C symbol `symbol` in this process, if any library does.
fn library_providing(symbol: &str) -> Option<PathBuf> {
    let name = CString::new(symbol).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT searches the loaded objects; dladdr only reads the address
    // it is given and fills `info`, whose `dli_fname` is a C string owned by the loader.
    unsafe {
        let address = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
        if address.is_null() {
            return None;
        }
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(address, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(PathBuf::from(
            CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned(),
        ))
    }
}

/// The libmlx this process loaded (the library defining `mlx::core::array::~array`).
pub fn mlx_library() -> Option<PathBuf> {
    library_providing("_ZN3mlx4core5arrayD1Ev")
}

/// The library whose `cblas_sgemm` MLX's CPU backend calls: OpenBLAS when it was linked ahead of
/// MLX (see the README), MLX's bundled reference BLAS otherwise, Accelerate on macOS.
pub fn blas_library() -> Option<PathBuf> {
    library_providing("cblas_sgemm")
}

/// OpenBLAS's description of itself (version, build options, the kernels chosen for this CPU)
/// when `library` is OpenBLAS, or forwards to it as the build's `liblmx_blas.so` does.
fn openblas_config(library: &std::path::Path) -> Option<String> {
    let path = CString::new(library.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: RTLD_NOLOAD only looks up a library that is already loaded (and counts one more
    // reference to it, which dlclose gives back); `openblas_get_config` takes no argument and
    // returns a static C string.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        let symbol = libc::dlsym(handle, c"openblas_get_config".as_ptr());
        let config = (!symbol.is_null()).then(|| {
            let get_config: extern "C" fn() -> *const libc::c_char = std::mem::transmute(symbol);
            CStr::from_ptr(get_config())
                .to_string_lossy()
                .trim()
                .to_owned()
        });
        libc::dlclose(handle);
        config
    }
}

/// The BLAS line of [`describe`]: the library, and what it is.
fn describe_blas() -> String {
    let Some(library) = blas_library() else {
        return "(not found)".to_owned();
    };
    let what = match openblas_config(&library) {
        Some(config) => config,
        None if cfg!(target_os = "linux") && mlx_sys::LINKED_BLAS.is_empty() => {
            "MLX's bundled reference BLAS (slow: see the README's \"BLAS on the CPU\")".to_owned()
        }
        None => return library.display().to_string(),
    };
    format!("{what} ({})", library.display())
}

/// A one-paragraph description of the platform, for `lmx info` and bug reports.
pub fn describe() -> String {
    let show =
        |path: Option<PathBuf>| path.map_or("(not found)".to_owned(), |p| p.display().to_string());
    format!(
        "libmlx: {}\nBLAS:   {}\nGPU:    {}",
        show(mlx_library()),
        describe_blas(),
        match device_count(DeviceKind::Gpu) {
            0 => "none (CPU-only MLX build)".to_owned(),
            n => format!("{n} device(s)"),
        }
    )
}
