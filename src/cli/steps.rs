//! The training steps a model declares, by name: what `lmx train --step NAME` picks from before
//! lmx's own objectives, and what `lmx check` lists.

use super::registry::Registry;
use super::resolve::{resolve, Resolved};

/// The objectives lmx trains over any model (`--step NAME`, or `--step builtin:NAME` where the
/// model declares a step of the same name).
pub const BUILT_IN: [&str; 4] = ["dpo", "grpo", "distill", "mtp"];

/// The prefix that picks a built-in objective over a declared step of the same name.
pub const BUILT_IN_PREFIX: &str = "builtin:";

/// A model's declared steps.
pub struct DeclaredSteps {
    /// The model, as `--model` names it.
    pub model: String,
    /// Its steps' names in declaration order; the first is its default.
    pub names: Vec<String>,
}

impl DeclaredSteps {
    /// The steps of `model` (a registered name, a Hugging Face folder, or a `.lmx` file, whose
    /// source is checked here even when it runs in a program built for it).
    pub fn of(registry: &Registry, model: &str) -> anyhow::Result<DeclaredSteps> {
        let names = match resolve(registry, model)? {
            Resolved::Registered(registered) | Resolved::Folder(registered, _) => registered
                .steps()
                .iter()
                .map(|step| step.name.to_owned())
                .collect(),
            Resolved::File(file) => {
                let checked =
                    lmx_grammar::check_source(&file.path.display().to_string(), &file.source)
                        .map_err(|rendered| anyhow::anyhow!("{rendered}"))?;
                checked.steps.iter().map(|step| step.name.clone()).collect()
            }
        };
        Ok(DeclaredSteps {
            model: model.to_owned(),
            names,
        })
    }

    /// Whether the model declares a step `name`.
    pub fn declares(&self, name: &str) -> bool {
        self.names.iter().any(|declared| declared == name)
    }

    /// Whether `name` is the model's default step (training without `--step` trains it).
    pub fn is_default(&self, name: &str) -> bool {
        self.names.first().is_some_and(|first| first == name)
    }

    /// `train (its default), anchor and dpo`.
    pub fn listed(&self) -> String {
        let named: Vec<String> = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| match i {
                0 => format!("{name} (its default)"),
                _ => name.clone(),
            })
            .collect();
        and_list(&named)
    }
}

/// `a, b and c`.
pub fn and_list(items: &[impl AsRef<str>]) -> String {
    match items {
        [] => String::new(),
        [one] => one.as_ref().to_owned(),
        [init @ .., last] => {
            let init: Vec<&str> = init.iter().map(AsRef::as_ref).collect();
            format!("{} and {}", init.join(", "), last.as_ref())
        }
    }
}
