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

/// Where lmx keeps what it builds (the programs of model files, kernels' headers):
/// `LMX_CACHE_DIR`, else `$XDG_CACHE_HOME/lmx`, else `~/.cache/lmx`; an empty variable counts as
/// unset, and a relative `XDG_CACHE_HOME` is ignored, as the XDG specification says; `None`
/// without any of them.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(dir) = var("LMX_CACHE_DIR") {
        return Some(dir.into());
    }
    if let Some(dir) = var("XDG_CACHE_HOME").map(PathBuf::from) {
        if dir.is_absolute() {
            return Some(dir.join("lmx"));
        }
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache").join("lmx"))
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

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, Array};

    /// Values in [-1.5, 1.5] that differ from entry to entry and from `seed` to `seed`.
    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 97) as f32 / 32.0 - 1.5)
            .collect()
    }

    /// `rows x cols` row-major values as an array, or as the transposed view of their transpose
    /// (so that MLX hands BLAS a transposed operand).
    fn matrix(data: &[f32], rows: usize, cols: usize, transposed: bool) -> Array {
        if !transposed {
            return Array::from_slice(data, &[rows as i32, cols as i32]);
        }
        let flipped: Vec<f32> = (0..cols * rows)
            .map(|i| data[(i % rows) * cols + i / rows])
            .collect();
        Array::from_slice(&flipped, &[cols as i32, rows as i32]).t()
    }

    /// `a (m x k) @ b (k x n)`, summed in f64.
    fn direct(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            out[i * n + j] = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
        }
        out
    }

    fn assert_close(got: &Array, want: &[f64], what: &str) {
        got.eval().expect("the product evaluates");
        let got = got.as_slice::<f32>();
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{what}: entry {i} is {g}, the direct sum {w}"
            );
        }
    }

    /// On the CPU a product with one row or one column of output goes to the BLAS's
    /// matrix-vector routine (liblmx_blas.so's `cblas_sgemm`): every orientation of its operands,
    /// and `addmm`'s scaled sum into an existing output, equal sums taken directly.
    #[test]
    fn products_with_one_row_or_column_equal_direct_sums() {
        for (m, k, n) in [(1, 37, 53), (41, 29, 1), (1, 64, 1), (3, 5, 7)] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let want = direct(&a, &b, m, k, n);
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let product = matrix(&a, m, k, ta)
                    .matmul(matrix(&b, k, n, tb))
                    .expect("the shapes agree");
                assert_close(&product, &want, &format!("{m}x{k} @ {k}x{n}, {ta} {tb}"));
            }
            let c = values(m * n, 3);
            let scaled: Vec<f64> = want
                .iter()
                .zip(&c)
                .map(|(p, c)| 0.5 * p + 2.0 * f64::from(*c))
                .collect();
            let c = Array::from_slice(&c, &[m as i32, n as i32]);
            let sum = ops::addmm(
                &c,
                matrix(&a, m, k, false),
                matrix(&b, k, n, true),
                0.5,
                2.0,
            )
            .expect("the shapes agree");
            assert_close(&sum, &scaled, &format!("addmm {m}x{k} @ {k}x{n}"));
        }
    }
}
