//! Choosing where arrays are computed: the CPU, or the GPU of a Metal or CUDA build of MLX.

use crate::error::{Error, Result};
use mlx_rs::{Device, DeviceType};
use std::fmt;
use std::str::FromStr;

/// A device kind, as named on the command line (`cpu`, `gpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU backend, present in every MLX build.
    Cpu,
    /// The GPU backend: Metal on macOS, CUDA on a CUDA build of MLX on Linux.
    Gpu,
}

impl DeviceKind {
    fn mlx_type(self) -> DeviceType {
        match self {
            DeviceKind::Cpu => DeviceType::Cpu,
            DeviceKind::Gpu => DeviceType::Gpu,
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        })
    }
}

impl FromStr for DeviceKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "cpu" => Ok(DeviceKind::Cpu),
            "gpu" => Ok(DeviceKind::Gpu),
            other => Err(Error::Device(format!(
                "unknown device `{other}`: use `cpu` or `gpu`"
            ))),
        }
    }
}

/// How many devices of `kind` this MLX build offers (0 for the GPU of a CPU-only build).
pub fn device_count(kind: DeviceKind) -> usize {
    let mut count = 0;
    // SAFETY: `count` outlives the call; mlx-c writes one int and reports failure by status.
    let status = unsafe { mlx_sys::mlx_device_count(&mut count, mlx_type_raw(kind)) };
    if status == 0 {
        usize::try_from(count).unwrap_or(0)
    } else {
        0
    }
}

fn mlx_type_raw(kind: DeviceKind) -> mlx_sys::mlx_device_type {
    match kind {
        DeviceKind::Cpu => mlx_sys::mlx_device_type__MLX_CPU,
        DeviceKind::Gpu => mlx_sys::mlx_device_type__MLX_GPU,
    }
}

/// Makes `kind` the default device for every array operation that follows.
///
/// Asking for the GPU of a CPU-only MLX build is an error, not a panic:
///
/// ```
/// use lmx_runtime::device::{select, DeviceKind};
/// select(DeviceKind::Cpu).unwrap();
/// ```
pub fn select(kind: DeviceKind) -> Result<Device> {
    if device_count(kind) == 0 {
        return Err(Error::Device(format!(
            "the MLX build in use (linked from {}) has no {kind} backend; for the GPU, run on \
             macOS or point LD_LIBRARY_PATH at MLX's CUDA build (or build with LMX_MLX=cuda13)",
            mlx_sys::MLX_LIB_DIR
        )));
    }
    let device = Device::new(kind.mlx_type(), 0);
    Device::set_default(&device);
    Ok(device)
}

/// The kind of the current default device.
pub fn default_kind() -> Result<DeviceKind> {
    Ok(match Device::try_default()?.get_type()? {
        DeviceType::Gpu => DeviceKind::Gpu,
        DeviceType::Cpu => DeviceKind::Cpu,
    })
}
