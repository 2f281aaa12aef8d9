//! How far the trainer's host work runs ahead of the device's.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;

/// How far the trainer's host work runs ahead of the device's.
///
/// MLX allocates a step's buffers while it hands the step to the device and frees them when the
/// device is done with them, so every step handed over before the previous one is done adds its
/// buffers to the peak. `Submit`, the default, is the fastest wherever the host's encoding of a
/// step is on the critical path (GPT-2 124M on an H100: 34.35 ms a step, 37.71 ms with
/// `Build`). On CUDA it keeps within one step's memory: its first steps run in `Build` order,
/// and MLX's memory limit is then set just above their peak, so that MLX's encoder waits for the
/// device to free memory rather than take more (`train/memory_cap.rs`; docs/benchmarks.md).
///
/// In a settings file it is a name: `"off"`, `"build"` or `"submit"`. Run files written before
/// the three orders existed hold a flag, which still reads: `true` as `Build` (its meaning in the
/// last version with the flag; earlier it meant today's `Submit`, which computes the same numbers),
/// `false` as `Off`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// One step at a time: build its graph, run it to completion (MLX's synchronous `eval`, as
    /// Python MLX's `mx.eval`), read its loss. MLX marks a completed step's outputs ready, so the
    /// next step does not ask the device about each of them, as it must in the other orders
    /// (one `cudaEventQuery` per parameter and moment on CUDA).
    Off,
    /// Build step `n + 1`'s graph while the device computes step `n`; hand it over once step `n`
    /// is done. The host's graph building is hidden and at most one step is on the device.
    Build,
    /// Also hand step `n + 1` to the device before step `n` is done, so that the device never
    /// waits for the host to encode a step: the fastest order where the host's encoding is on
    /// the step's critical path. Elsewhere than on CUDA two steps' buffers can be alive at once.
    #[default]
    Submit,
}

impl<'de> serde::Deserialize<'de> for Overlap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OverlapVisitor)
    }
}

/// Reads an [`Overlap`] by its name, or by the flag of older run files.
struct OverlapVisitor;

impl Visitor<'_> for OverlapVisitor {
    type Value = Overlap;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("one of \"off\", \"build\", \"submit\"")
    }

    fn visit_bool<E: de::Error>(self, flag: bool) -> Result<Overlap, E> {
        Ok(if flag { Overlap::Build } else { Overlap::Off })
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Overlap, E> {
        match name {
            "off" => Ok(Overlap::Off),
            "build" => Ok(Overlap::Build),
            "submit" => Ok(Overlap::Submit),
            other => Err(E::unknown_variant(other, &["off", "build", "submit"])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Result<Overlap, String> {
        serde_json::from_str(json).map_err(|err| err.to_string())
    }

    #[test]
    fn names_read_back_as_written() {
        for overlap in [Overlap::Off, Overlap::Build, Overlap::Submit] {
            let written = serde_json::to_string(&overlap).unwrap();
            assert_eq!(read(&written), Ok(overlap), "{written}");
        }
        assert_eq!(
            serde_json::to_string(&Overlap::Submit).unwrap(),
            "\"submit\""
        );
    }

    #[test]
    fn the_flag_of_older_run_files_still_reads() {
        assert_eq!(read("true"), Ok(Overlap::Build));
        assert_eq!(read("false"), Ok(Overlap::Off));
    }

    #[test]
    fn anything_else_is_refused_naming_the_choices() {
        assert_eq!(
            read("\"sideways\""),
            Err(
                "unknown variant `sideways`, expected one of `off`, `build`, `submit` at line 1 \
                 column 10"
                    .to_string()
            )
        );
        assert_eq!(
            read("2"),
            Err(
                "invalid type: integer `2`, expected one of \"off\", \"build\", \"submit\" at \
                 line 1 column 1"
                    .to_string()
            )
        );
    }
}
