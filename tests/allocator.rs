//! The process's allocator (`src/allocator.rs`): on Linux, with the default feature `mimalloc`,
//! the `malloc` that every library of the process binds to, MLX's included, is mimalloc's,
//! defined in this executable rather than in glibc.

#![cfg(all(target_os = "linux", feature = "mimalloc"))]

use std::ffi::{c_void, CStr};

/// The file of the object that defines `symbol` in the process's global scope, where the dynamic
/// linker looks it up for every library that calls it.
fn defined_in(symbol: &CStr) -> String {
    // SAFETY: dlsym and dladdr read the loader's tables; `info` is written by dladdr, and its
    // file name is a C string the loader owns for the life of the object.
    unsafe {
        let address = libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr());
        assert!(
            !address.is_null(),
            "{symbol:?} is not defined in the process"
        );
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert!(libc::dladdr(address as *const c_void, &mut info) != 0);
        CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    }
}

#[test]
fn every_library_allocates_with_mimalloc() {
    let executable = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    for symbol in [c"malloc", c"free", c"realloc", c"calloc", c"posix_memalign"] {
        let file = defined_in(symbol);
        let file = std::fs::canonicalize(&file).unwrap_or(file.into());
        assert_eq!(file, executable, "{symbol:?} comes from {}", file.display());
    }
    // What MLX allocates through C's malloc is then freed by mimalloc's free: an array made,
    // evaluated and dropped.
    let array = lmx::runtime::mlx_rs::Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    let sum = lmx::runtime::mlx_rs::ops::sum(&array, None).unwrap();
    assert_eq!(sum.item_exact::<f32>(), 6.0);
}
