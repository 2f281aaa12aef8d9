//! Data-parallel training over MLX's own distributed backends: NCCL on CUDA GPUs, the TCP ring on
//! CPUs, MPI where it is installed.
//!
//! A [`Group`] is the set of processes of one run, made by [`Group::init`] from the environment
//! that `lmx launch` (or Python MLX's `mlx.launch`) gives each process: `MLX_RANK`, and
//! `MLX_HOSTFILE` for the ring backend or `MLX_WORLD_SIZE`, `NCCL_HOST_IP` and `NCCL_PORT` for
//! NCCL. Its collectives ([`Group::all_sum`], [`Group::all_gather`], [`Group::sum_scatter`]) are
//! lazy operations like any other, so they run inside a compiled step.
//!
//! MLX's collectives have no timeout: NCCL waits forever for a peer that died. A [`Watchdog`]
//! ends the process with a message naming the rank when the training loop stops making progress
//! for longer than the run's timeout.

mod average;
mod backend;
mod error;
mod group;
mod shard;
mod watchdog;

pub(crate) use average::{average, mean_values, weigh, Mean, Weight};
pub use backend::Backend;
pub use error::DistributedError;
pub use group::Group;
pub use shard::Shard;
pub use watchdog::Watchdog;

/// The environment variable that names the backend a launched process initialises (`lmx launch`
/// sets it; without it a process under `MLX_RANK` takes the first backend MLX can start).
pub const BACKEND_VAR: &str = "LMX_DISTRIBUTED_BACKEND";

/// The environment variable holding the seconds a rank may go without progress before its
/// [`Watchdog`] ends it.
pub const TIMEOUT_VAR: &str = "LMX_DISTRIBUTED_TIMEOUT";

/// How a training step runs on the ranks of a [`Group`].
#[derive(Clone, Debug)]
pub struct DataParallel {
    /// The ranks.
    pub group: Group,
    /// Where the gradients are summed over the ranks.
    pub reduce: Reduce,
    /// Shard the optimizer state over the ranks (ZeRO stage 1): each rank keeps and updates its
    /// part of the flat state's optimizer buffers and the updated parameters are gathered.
    pub shard_optimizer: bool,
}

/// Where a data-parallel step sums the gradients over the ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduce {
    /// Inside the compiled step, between the backward pass and the update: one compiled function
    /// per step, and on a flat state one collective per buffer.
    #[default]
    InStep,
    /// Between two compiled functions, the gradients' and the update's (as a step with gradient
    /// accumulation always does): one collective per parameter.
    AfterStep,
    /// During the backward pass, on a flat state: its buffers cut into buckets of at most
    /// `bucket_bytes` (parameters in model order), and each bucket's packed gradients summed on a
    /// stream of their own as soon as the backward pass has them, while it computes the earlier
    /// layers' (as PyTorch's DDP buckets them).
    Overlap {
        /// The largest bucket, in bytes (a parameter larger than this is a bucket of its own).
        bucket_bytes: usize,
    },
}

impl Reduce {
    /// The bucket size PyTorch's DDP uses by default, 25 MiB.
    pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;
}
