//! The runtime's error type.

use std::path::PathBuf;

/// What can go wrong in the runtime, each variant naming the cause and the place.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MLX reported an error (a shape mismatch in an op, an unavailable kernel, ...). Its text is
    /// the message (so it is not also a `source()`); where in the bindings it was raised is not.
    #[error("MLX: {}", .0.what())]
    Mlx(mlx_rs::error::Exception),
    /// A device was asked for that this MLX build cannot provide.
    #[error("{0}")]
    Device(String),
    /// A tree or compiled state did not have the layout its declaration promises.
    #[error("state layout: {0}")]
    Layout(String),
    /// A checkpoint or tensor file could not be used.
    #[error("{path}: {message}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// A new folder was asked for where something is already.
    #[error("{}: exists and is not an empty folder; give a new one", path.display())]
    FolderTaken {
        /// The folder.
        path: PathBuf,
    },
    /// Training data could not be read or cut into batches.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// The loss stopped being finite: training diverged.
    #[error("the loss became {loss} at step {step}; {}", match resume_from {
        Some((dir, loss)) => format!("training can continue from {} (its parameters' loss {loss:.4})", dir.display()),
        None => "no checkpoint saved before it has a sane loss to continue from".into(),
    })]
    Diverged {
        /// The loss.
        loss: f32,
        /// The update that produced it.
        step: u64,
        /// The checkpoint to continue from and its parameters' loss: the latest checkpoint whose
        /// loss is within [`SANE_LOSS_RATIO`](crate::checkpoint::SANE_LOSS_RATIO) of the best
        /// one's.
        resume_from: Option<(PathBuf, f32)>,
    },
    /// Another process holds the run folder's lock.
    #[error("run folder {} is in use by {}", dir.display(), pid.map_or("another process".into(), |pid| format!("process {pid}")))]
    RunInUse {
        /// The run folder.
        dir: PathBuf,
        /// The process holding it, as it wrote itself into the lock file.
        pid: Option<u32>,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// A Hugging Face model folder could not be read as published.
    #[error(transparent)]
    Hf(#[from] crate::hf::HfError),
    /// A model has no Hugging Face equivalent to be exported as.
    #[error(transparent)]
    HfExport(#[from] crate::hf::Inexpressible),
    /// A quantization that cannot be made, read or written (see `quant::QuantError`).
    #[error(transparent)]
    Quantization(#[from] crate::quant::QuantError),
    /// The processes of a data-parallel run could not start or work together.
    #[error(transparent)]
    Distributed(#[from] crate::distributed::DistributedError),
    /// A step that declares frozen models was asked for its loss without them.
    #[error(
        "step `{step}` reads the frozen model `{name}`: train it through its objective \
         (`Objective::declared`), which passes its frozen models to the compiled step"
    )]
    FrozenModelsMissing {
        /// The step.
        step: &'static str,
        /// The first frozen model it declares.
        name: &'static str,
    },
    /// A named setting is out of its range.
    #[error("{name} is {value}; it must be {expected}")]
    Setting {
        /// The setting's name, as the API spells it (`top_p`).
        name: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// More blocks asked to take adapters (counted from the last) than the model has.
    #[error(
        "num_layers is {asked}, but the model has {blocks} blocks: at most {blocks}, or -1 for all"
    )]
    TooManyBlocks {
        /// The blocks asked for.
        asked: i64,
        /// The model's blocks.
        blocks: usize,
    },
    /// No layer of the model was chosen to take an adapter: training would change nothing, or,
    /// with no adapter to freeze the base, the whole model.
    #[error(
        "no layer takes an adapter: by default the linear layers inside a list of blocks do (in \
         the last num_layers of them), and this choice finds none; name the layers to adapt in \
         `keys` (`--keys`): the model's linear layers are {}", linear.join(", ")
    )]
    NothingToAdapt {
        /// The model's linear layers and stacked expert projections, by dotted name.
        linear: Vec<String>,
    },
    /// A layer asked to take an adapter has one already (adapters go over a base model, or over
    /// one whose adapters were fused into it).
    #[error("layer `{layer}` already has an adapter")]
    AlreadyAdapted {
        /// The layer's dotted name.
        layer: String,
    },
    /// Speculative decoding with a model whose recurrent layers (a scan's state) cannot go back
    /// to the last accepted token.
    #[error("speculative decoding needs caches that can drop rejected tokens; {model}'s recurrent layers keep states that cannot (generate without a draft model)")]
    RecurrentRewind {
        /// The model (`LanguageModel::NAME`).
        model: &'static str,
    },
}

impl Error {
    /// The error as an MLX exception, for a closure that MLX calls (a compiled or differentiated
    /// function) to return: an MLX error passes through unchanged, any other becomes its message.
    pub fn into_exception(self) -> mlx_rs::error::Exception {
        match self {
            Error::Mlx(exception) => exception,
            other => mlx_rs::error::Exception::custom(other.to_string()),
        }
    }
}

impl From<mlx_rs::error::Exception> for Error {
    fn from(exception: mlx_rs::error::Exception) -> Self {
        Error::Mlx(exception)
    }
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A chain printer (`{:#}` in the CLI) shows each cause once: the variants that put their
    /// cause in the message do not also return it as their source.
    #[test]
    fn a_cause_in_the_message_is_not_also_the_source() {
        let mlx = Error::from(mlx_rs::error::Exception::custom("no such kernel"));
        let io = Error::Io {
            path: PathBuf::from("corpus.txt"),
            cause: std::io::Error::other("disk on fire"),
        };
        for (err, cause) in [(mlx, "no such kernel"), (io, "disk on fire")] {
            assert!(err.to_string().contains(cause), "{err}");
            assert!(err.source().is_none(), "{err}");
        }
    }

    #[test]
    fn an_mlx_error_crosses_a_closure_boundary_unchanged() {
        let mlx = Error::from(mlx_rs::error::Exception::custom("no such kernel"));
        assert_eq!(mlx.to_string(), "MLX: no such kernel");
        let back = Error::from(mlx.into_exception());
        assert_eq!(back.to_string(), "MLX: no such kernel");
        let layout = Error::Layout("two trees".into());
        assert_eq!(
            Error::from(layout.into_exception()).to_string(),
            "MLX: state layout: two trees"
        );
    }
}
