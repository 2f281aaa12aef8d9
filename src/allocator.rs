//! The process's allocator: mimalloc on Linux (the `mimalloc` feature, on by default), for every
//! binary that links lmx, a crate of one's own as the bundled command line.
//!
//! MLX allocates and frees small C++ objects for every operation of every evaluation (arrays,
//! their shared state, graph nodes, strings), and on a host-bound path such as batch-1 decoding
//! of a small model, glibc's `malloc` and `free` were a fifth of the host thread's samples. The
//! feature `override` of mimalloc defines `malloc`, `free` and their kin in this binary, which the
//! dynamic linker then binds for `libmlx` and the CUDA libraries too, so the two sides of every
//! allocation agree. Not on macOS, where overriding needs malloc zones that have not been
//! measured, nor on Windows, where mimalloc overrides only as a DLL.

#[cfg(all(feature = "mimalloc", target_os = "linux"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
