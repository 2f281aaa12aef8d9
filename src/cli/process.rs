//! The process around the command line: its setup, its error messages and its exit status.

use super::registry::Registry;

/// Parses the arguments, runs the command over `registry`'s models, prints an error and exits
/// with its status.
pub fn main(registry: &Registry) -> std::process::ExitCode {
    #[cfg(unix)]
    end_quietly_on_a_closed_pipe();
    one_blas_thread_on_few_cores();
    no_lifetime_cache_fuse();
    match super::run(super::Cli::parse_noting_given(), registry) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A run stopped by a signal is no error: it says where it stopped, and exits as the
        // signal would have.
        Err(err) => match err.downcast_ref::<super::Interrupted>() {
            Some(interrupted) => {
                eprintln!("{interrupted}");
                interrupted.exit_code()
            }
            None => {
                eprintln!("error: {err:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Makes a closed pipe end the program quietly, as it ends any Unix command (`lmx bench report
/// runs.jsonl | head`): Rust starts programs with SIGPIPE ignored, so printing to a closed pipe
/// would panic instead.
#[cfg(unix)]
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: called first in `main`, before any other thread exists, and it only restores the
    // signal's default action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Turns off the check of MLX's CUDA caches (cuDNN attention graphs, CUDA graphs, convolutions)
/// that throws once a cache has ever missed twice its capacity: a lifetime count, never reset,
/// so a long generation or server whose shapes vary (speculative decoding's drafts, prompts of
/// every length) ended with "Cache thrashing is happening" after a few hundred distinct shapes
/// however often the cache hit. The caches themselves keep their sizes and evict as before. A
/// value the user set is left alone. Done first in `main`: MLX reads it when a cache is made.
fn no_lifetime_cache_fuse() {
    const CHECK: &str = "MLX_ENABLE_CACHE_THRASHING_CHECK";
    if std::env::var_os(CHECK).is_none() {
        std::env::set_var(CHECK, "0");
    }
}

/// Keeps OpenBLAS to one thread on a machine of at most two cores, unless `OPENBLAS_NUM_THREADS`
/// (or `OMP_NUM_THREADS`) says otherwise. OpenBLAS splits a product evenly between a worker per
/// core, which spins between products: with anything else busy on two cores, the product waits
/// for its descheduled half, and training and decoding both fell below one thread's speed
/// (docs/benchmarks.md, "BLAS threads on two cores"); idle, the second thread paid only where
/// products are large.
fn one_blas_thread_on_few_cores() {
    let set = ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"]
        .iter()
        .any(|var| std::env::var_os(var).is_some());
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if set || cores > 2 {
        return;
    }
    // SAFETY: dlsym only looks the symbol up; where it is found it is OpenBLAS's
    // `void openblas_set_num_threads(int)` (or the build's forwarder to it).
    unsafe {
        let symbol = libc::dlsym(libc::RTLD_DEFAULT, c"openblas_set_num_threads".as_ptr());
        if !symbol.is_null() {
            let set_threads: extern "C" fn(libc::c_int) = std::mem::transmute(symbol);
            set_threads(1);
        }
    }
}
