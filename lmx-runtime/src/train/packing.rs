//! How the trainer lays out the state its compiled step reads and writes.

/// How the trainer lays out the training state: one array per parameter and optimizer state
/// array, or packed into flat buffers ([`FlatStep`](crate::flat::FlatStep)).
///
/// A flat state makes the update, the gradient norm and the clip a handful of kernels whatever
/// the model's size, where per-parameter state takes one or two each per parameter. That matters
/// where a step's time is its kernel launches: on CUDA at small sizes, where MLX's host encodes
/// every launch. On an H100 it made the anchors' tiny and small steps 1.3x to 2x Python MLX's,
/// where per-parameter state ran 0.78x to 0.97x, and the medium step 1.7x (docs/benchmarks.md).
/// It costs one more pass over the gradients (packing them) and the packed gradients' memory
/// beside the unpacked ones. In a settings file it is a name: `"auto"`, `"flat"` or
/// `"per-parameter"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StatePacking {
    /// Flat on a CUDA GPU where the optimizer's update is elementwise and the step does not
    /// accumulate gradients; per parameter otherwise (the CPU and Metal, where a step's time is
    /// not its launches, keep the layout whose numbers are measured there).
    #[default]
    Auto,
    /// Flat; a run whose optimizer or step cannot take it is refused.
    Flat,
    /// One array per parameter and per optimizer state array.
    PerParameter,
}
