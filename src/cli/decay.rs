//! `--decay`: which parameters weight decay applies to.

use lmx::runtime::optim::DecayScope;

/// [`DecayScope`], as a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DecayArg {
    /// Weight matrices only (lmx's default): not biases, norms or embeddings.
    Weights,
    /// Every parameter, as MLX's AdamW does.
    All,
}

impl From<DecayArg> for DecayScope {
    fn from(decay: DecayArg) -> Self {
        match decay {
            DecayArg::Weights => DecayScope::Weights,
            DecayArg::All => DecayScope::All,
        }
    }
}
