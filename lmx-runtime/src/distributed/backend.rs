//! Which of MLX's distributed backends a process starts.

use super::DistributedError;
use std::fmt;
use std::str::FromStr;

/// One of MLX's distributed backends, named as `mlx.core.distributed.init` names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The first one MLX can start, in its own order (`"any"`).
    #[default]
    Any,
    /// TCP sockets between the ranks, on any CPU (`MLX_HOSTFILE`).
    Ring,
    /// NVIDIA's collectives between CUDA GPUs (`MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT`).
    Nccl,
    /// An MPI installation's `libmpi`, started by `mpirun`.
    Mpi,
}

impl Backend {
    /// Every backend, in the order their names are listed in messages.
    pub const ALL: [Backend; 4] = [Backend::Any, Backend::Ring, Backend::Nccl, Backend::Mpi];

    /// The name MLX knows it by.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Nccl => "nccl",
            Backend::Mpi => "mpi",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = DistributedError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|backend| backend.name() == name)
            .ok_or_else(|| DistributedError::UnknownBackend(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_others_are_refused_naming_the_choices() {
        for backend in Backend::ALL {
            assert_eq!(backend.name().parse::<Backend>().unwrap(), backend);
        }
        assert_eq!(
            "gloo".parse::<Backend>().unwrap_err().to_string(),
            "unknown distributed backend `gloo`: use any, ring, nccl or mpi"
        );
    }
}
