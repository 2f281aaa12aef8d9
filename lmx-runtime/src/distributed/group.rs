//! A group of processes and its collectives, over mlx-c's distributed API.

use super::{Backend, DistributedError, BACKEND_VAR};
use crate::error::Result;
use mlx_rs::{Array, Stream};
use std::ffi::CString;
use std::rc::Rc;

/// The variables MLX's backends read, named in an initialisation error.
const ENVIRONMENT: [&str; 5] = [
    "MLX_RANK",
    "MLX_HOSTFILE",
    "MLX_WORLD_SIZE",
    "NCCL_HOST_IP",
    "NCCL_PORT",
];

/// The processes of a data-parallel run, as MLX's backend connected them. Cheap to clone (the
/// compiled step holds one); not `Send`, as nothing of MLX's is.
#[derive(Clone)]
pub struct Group {
    inner: Rc<Raw>,
}

struct Raw {
    group: mlx_sys::mlx_distributed_group,
    rank: usize,
    size: usize,
    backend: Backend,
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the group was made by `mlx_distributed_init` and is freed once, here.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.group);
        }
    }
}

impl Group {
    /// Starts `backend` from this process's environment and connects to the other ranks
    /// (strictly: a backend that cannot start is an error, not a group of one).
    pub fn init(backend: Backend) -> Result<Group> {
        let name = CString::new(backend.name()).expect("backend names have no NUL");
        let name_ptr = match backend {
            Backend::Any => std::ptr::null(),
            _ => name.as_ptr(),
        };
        // SAFETY: `name` outlives the calls; the group handle is written by mlx-c and owned here.
        unsafe {
            if !mlx_sys::mlx_distributed_is_available(name_ptr) {
                return Err(DistributedError::Unavailable {
                    backend: backend.to_string(),
                }
                .into());
            }
            let mut group = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut group, true, name_ptr) != 0 || group.ctx.is_null()
            {
                return Err(DistributedError::Init {
                    backend: backend.to_string(),
                    environment: environment(),
                }
                .into());
            }
            let rank = mlx_sys::mlx_distributed_group_rank(group);
            let size = mlx_sys::mlx_distributed_group_size(group);
            Ok(Group {
                inner: Rc::new(Raw {
                    group,
                    rank: usize::try_from(rank).unwrap_or(0),
                    size: usize::try_from(size).unwrap_or(1).max(1),
                    backend,
                }),
            })
        }
    }

    /// The group this process belongs to when it was started as one rank of several
    /// (`MLX_RANK` is set), with the backend `LMX_DISTRIBUTED_BACKEND` names (any by default);
    /// `None` for a process started on its own.
    pub fn from_environment() -> Result<Option<Group>> {
        if std::env::var_os("MLX_RANK").is_none() {
            return Ok(None);
        }
        let backend = match std::env::var(BACKEND_VAR) {
            Ok(name) => name.parse()?,
            Err(_) => Backend::Any,
        };
        Group::init(backend).map(Some)
    }

    /// This process's rank, from 0.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// How many processes the group has.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The backend it was started with.
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// The elementwise sum of `x` over the ranks, on every rank.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        self.collective("all_sum", x, mlx_sys::mlx_distributed_all_sum)
    }

    /// Every rank's `x` concatenated along the first axis, in rank order, on every rank.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        self.collective("all_gather", x, mlx_sys::mlx_distributed_all_gather)
    }

    /// The sum over the ranks of `x`, of which each rank gets its part: the first axis cut into
    /// as many equal parts as there are ranks (a reduce-scatter).
    pub fn sum_scatter(&self, x: &Array) -> Result<Array> {
        self.collective("sum_scatter", x, mlx_sys::mlx_distributed_sum_scatter)
    }

    fn collective(
        &self,
        operation: &'static str,
        x: &Array,
        call: unsafe extern "C" fn(
            *mut mlx_sys::mlx_array,
            mlx_sys::mlx_array,
            mlx_sys::mlx_distributed_group,
            mlx_sys::mlx_stream,
        ) -> std::os::raw::c_int,
    ) -> Result<Array> {
        // The stream a caller chose (`mlx_rs::with_stream`), else the default device's: MLX runs
        // the collective where its backend works (NCCL on the GPU's stream, the ring on the CPU's).
        let stream = Stream::thread_local_or_default();
        // SAFETY: every handle is live for the call; the result is a new array owned by the
        // returned `Array`, or freed here on failure.
        unsafe {
            let mut result = mlx_sys::mlx_array_new();
            if call(&mut result, x.as_ptr(), self.inner.group, stream.as_ptr()) != 0 {
                mlx_sys::mlx_array_free(result);
                return Err(DistributedError::Collective {
                    operation,
                    shape: x.shape().to_vec(),
                    size: self.size(),
                }
                .into());
            }
            Ok(Array::from_ptr(result))
        }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("backend", &self.backend())
            .finish()
    }
}

/// The backends' variables as this process has them, for an initialisation error.
fn environment() -> String {
    ENVIRONMENT
        .iter()
        .map(|name| match std::env::var(name) {
            Ok(value) => format!("{name}={value}"),
            Err(_) => format!("{name} unset"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
