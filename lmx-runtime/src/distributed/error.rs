//! What can go wrong between the processes of a data-parallel run.

/// A distributed run's failure, naming the backend, the rank or the setting.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// A backend name MLX does not know.
    #[error("unknown distributed backend `{0}`: use any, ring, nccl or mpi")]
    UnknownBackend(String),
    /// This MLX build cannot start the backend (NCCL on a CPU build, MPI without `libmpi`).
    #[error("MLX's `{backend}` distributed backend is not available in this build or machine")]
    Unavailable {
        /// The backend asked for.
        backend: String,
    },
    /// The backend did not start: its environment is missing or wrong, or the peers did not
    /// answer.
    #[error(
        "MLX's `{backend}` distributed backend did not start ({environment}); start the ranks \
         with `lmx launch` or with the environment it sets"
    )]
    Init {
        /// The backend asked for.
        backend: String,
        /// The variables it reads, as this process has them.
        environment: String,
    },
    /// A collective could not be built (MLX refused its input).
    #[error("MLX refused {operation} over an array of shape {shape:?} in a group of {size}")]
    Collective {
        /// `all_sum`, `all_gather` or `sum_scatter`.
        operation: &'static str,
        /// The input's shape.
        shape: Vec<i32>,
        /// The group's size.
        size: usize,
    },
    /// A setting the environment gives is not a number or out of range.
    #[error("{name}={value}: {expected}")]
    Environment {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A size that must split evenly across the ranks does not.
    #[error(
        "{what} is {value}, which {ranks} ranks cannot share evenly: make it a multiple of {ranks}"
    )]
    Uneven {
        /// What it is (`batch_size`).
        what: &'static str,
        /// Its value.
        value: usize,
        /// The ranks.
        ranks: usize,
    },
    /// The training loop made no progress for the run's timeout: another rank most likely died
    /// or hangs in a collective.
    #[error(
        "rank {rank} of {size}: no training progress for {seconds} s (the distributed timeout, \
         {var}); another rank has most likely failed, so this one stops"
    )]
    Timeout {
        /// This process's rank.
        rank: usize,
        /// The ranks.
        size: usize,
        /// The timeout.
        seconds: u64,
        /// The variable that sets it.
        var: &'static str,
    },
}
