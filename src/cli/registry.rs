//! The bundled models the `lmx` command can train and sample, each by its declared training step.

use super::run_file::RunFile;
use super::train::{self, GenerateRequest, TrainRequest};

/// Declares `train` and `generate`, dispatching on a bundled model's name to its step type.
macro_rules! registry {
    ($($name:literal => $step:ty),* $(,)?) => {
        /// The names of the models `lmx train` knows.
        pub const TRAINABLE: &[&str] = &[$($name),*];

        /// Trains the model `request.model`; `false` when there was nothing to train.
        pub fn train(request: TrainRequest) -> anyhow::Result<bool> {
            match request.model.as_str() {
                $($name => train::train::<$step>(request),)*
                other => unknown(other),
            }
        }

        /// Samples from a run of the model it names.
        pub fn generate(run: &RunFile, request: GenerateRequest) -> anyhow::Result<()> {
            match run.model.as_str() {
                $($name => train::sample::<$step>(run, request),)*
                other => unknown(other),
            }
        }
    };
}

registry! {
    "gpt2" => lmx::models::gpt2::Train,
    "llama" => lmx::models::llama::Train,
    "gemma" => lmx::models::gemma::Train,
    "mistral" => lmx::models::mistral::Train,
    "mixtral" => lmx::models::mixtral::Train,
    "mpt" => lmx::models::mpt::Train,
}

fn unknown<T>(model: &str) -> anyhow::Result<T> {
    anyhow::bail!(
        "no trainable model `{model}`; the bundled ones are {}",
        TRAINABLE.join(", ")
    )
}

#[cfg(test)]
mod tests {
    /// A model added to `models/` fails here until the registry above names its step type.
    #[test]
    fn every_bundled_model_is_trainable() {
        let mut bundled: Vec<&str> = super::super::bundled::MODELS
            .iter()
            .map(|(name, _, _)| *name)
            .collect();
        let mut trainable = super::TRAINABLE.to_vec();
        bundled.sort_unstable();
        trainable.sort_unstable();
        assert_eq!(bundled, trainable);
    }
}
