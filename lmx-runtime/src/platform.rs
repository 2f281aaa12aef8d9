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

/// A one-paragraph description of the platform, for `lmx info` and bug reports.
pub fn describe() -> String {
    let show =
        |path: Option<PathBuf>| path.map_or("(not found)".to_owned(), |p| p.display().to_string());
    format!(
        "libmlx: {}\nBLAS:   {}\nGPU:    {}",
        show(mlx_library()),
        show(blas_library()),
        match device_count(DeviceKind::Gpu) {
            0 => "none (CPU-only MLX build)".to_owned(),
            n => format!("{n} device(s)"),
        }
    )
}
