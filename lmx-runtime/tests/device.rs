//! Device selection: the CPU always works; the GPU of a CPU-only build is an error, not a panic.

use lmx_runtime::device::{default_kind, device_count, select, DeviceKind};
use lmx_runtime::Error;

/// One test, because the default device is process-wide.
#[test]
fn cpu_always_works_and_gpu_follows_the_build() {
    assert_eq!(device_count(DeviceKind::Cpu), 1);
    select(DeviceKind::Cpu).expect("the CPU backend exists in every build");
    assert_eq!(default_kind().unwrap(), DeviceKind::Cpu);

    match select(DeviceKind::Gpu) {
        Ok(_) => {
            assert!(device_count(DeviceKind::Gpu) > 0);
            assert_eq!(default_kind().unwrap(), DeviceKind::Gpu);
        }
        Err(Error::Device(message)) => {
            assert_eq!(device_count(DeviceKind::Gpu), 0);
            assert!(message.contains("has no gpu backend"), "{message}");
            assert_eq!(
                default_kind().unwrap(),
                DeviceKind::Cpu,
                "a failed select changes nothing"
            );
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn device_names_parse() {
    assert_eq!("cpu".parse::<DeviceKind>().unwrap(), DeviceKind::Cpu);
    assert_eq!("gpu".parse::<DeviceKind>().unwrap(), DeviceKind::Gpu);
    let err = "tpu".parse::<DeviceKind>().unwrap_err();
    assert_eq!(err.to_string(), "unknown device `tpu`: use `cpu` or `gpu`");
}
