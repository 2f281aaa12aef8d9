//! The `lmx` command over the bundled models: see `lmx --help`. A crate of one's own runs the
//! same command line over its own models (`lmx new`).

fn main() -> std::process::ExitCode {
    lmx::cli::Registry::bundled().main()
}
