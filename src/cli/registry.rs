//! The models a program's `lmx` command line can train and sample, which the program registers:
//! the stock `lmx` binary its bundled models, a user's crate its own (see `lmx new`).
//!
//! ```ignore
//! mod models {
//!     include!(concat!(env!("OUT_DIR"), "/models.rs"));
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     lmx::cli::Registry::new()
//!         .sources(models::SOURCES)
//!         .model::<models::tiny::Train>()
//!         .main()
//! }
//! ```

use super::eval::{self, EvalRequest};
use super::export::{self, ExportRequest};
use super::hf_model::{self, FolderGenerateRequest};
use super::objective::ObjectiveSettings;
use super::quantize::{self, QuantizeRequest};
use super::run_file::RunFile;
use super::train::{self, GenerateRequest, TrainRequest};
use lmx::runtime::device::DeviceKind;
use lmx::runtime::hf::HfFolder;
use lmx::runtime::model::{Frozen, LanguageModel, StepVisitor, TrainingStep};
use lmx::runtime::objectives::{Backbone, Mtp, Teacher};
use lmx::runtime::optim::Optimizer;
use lmx::runtime::tree::Tree;
use lmx::runtime::Array;
use std::path::Path;

/// `(module name, file name, source)` of `.lmx` models, as `build.rs` compiled them
/// (`models::SOURCES` of the generated code).
pub type Sources = &'static [(&'static str, &'static str, &'static str)];

/// The models a command line knows, by name: their training steps, and the `.lmx` sources that
/// `lmx check`, `info`, `count` and `models` report on.
#[derive(Default)]
pub struct Registry {
    steps: Vec<Registered>,
    sources: Vec<(&'static str, &'static str, &'static str)>,
}

/// A registered model: its name and its training step's `train`, `sample` and `evaluate`.
#[derive(Clone, Copy)]
pub struct Registered {
    /// The model's name (`LanguageModel::NAME`), which `--model` gives and `run.json` records.
    pub name: &'static str,
    /// Its presets' names (`LanguageModel::presets`).
    pub presets: fn() -> &'static [&'static str],
    train: fn(TrainRequest) -> anyhow::Result<bool>,
    /// Trains the model with multi-token heads (`--step mtp`), where the model exposes its hidden
    /// states ([`Registry::multi_token`]).
    train_mtp: Option<fn(TrainRequest) -> anyhow::Result<bool>>,
    generate: fn(&RunFile, GenerateRequest) -> anyhow::Result<()>,
    evaluate: fn(&RunFile, EvalRequest) -> anyhow::Result<()>,
    fuse: fn(&RunFile, &super::lora::FuseArgs) -> anyhow::Result<()>,
    generate_folder: fn(&HfFolder, FolderGenerateRequest) -> anyhow::Result<()>,
    export: fn(ExportRequest) -> anyhow::Result<()>,
    quantize: fn(QuantizeRequest) -> anyhow::Result<()>,
    serve: fn(super::serve::Source, &super::serve::ServeArgs, DeviceKind) -> anyhow::Result<()>,
    read_teacher: fn(&Path) -> anyhow::Result<Teacher>,
    steps: fn() -> Vec<NamedStep>,
}

/// A training step of a registered model, by the name its declaration gives it (`step dpo`):
/// what `lmx train --step dpo` trains when the model declares it.
#[derive(Clone, Copy)]
pub struct NamedStep {
    /// The step's name (`TrainingStep::NAME`).
    pub name: &'static str,
    /// The frozen models it declares.
    pub frozen: &'static [Frozen],
    /// The metrics it reports beside its loss.
    pub metrics: &'static [&'static str],
    train: fn(TrainRequest) -> anyhow::Result<bool>,
}

impl NamedStep {
    fn of<S: TrainingStep>() -> NamedStep
    where
        Leaves<S>: Clone + 'static,
    {
        NamedStep {
            name: S::NAME,
            frozen: S::FROZEN,
            metrics: S::METRICS,
            train: train::train::<S>,
        }
    }
}

/// A tree of step `S`'s optimizer leaves over its model's parameters (what the trainer clones).
type Leaves<S> = <<<S as TrainingStep>::Model as LanguageModel>::Params as Tree<Array>>::Of<
    Option<<<S as TrainingStep>::Optimizer as Optimizer>::Leaf>,
>;

/// Collects the steps a model declares ([`LanguageModel::declared_steps`]).
struct Collect(Vec<NamedStep>);

impl<M: LanguageModel> StepVisitor<M> for Collect {
    fn visit<S: TrainingStep<Model = M>>(&mut self)
    where
        <M::Params as Tree<Array>>::Of<Option<<S::Optimizer as Optimizer>::Leaf>>: Clone + 'static,
    {
        if self.0.iter().all(|step| step.name != S::NAME) {
            self.0.push(NamedStep::of::<S>());
        }
    }
}

/// Step `S` (the registered one, the model's default) and every other step its model declares.
fn named_steps<S: TrainingStep>() -> Vec<NamedStep>
where
    Leaves<S>: Clone + 'static,
{
    let mut steps = Collect(vec![NamedStep::of::<S>()]);
    S::Model::declared_steps(&mut steps);
    steps.0
}

impl Registered {
    /// Trains this model; `false` when there was nothing to train.
    pub fn train(&self, request: TrainRequest) -> anyhow::Result<bool> {
        if let Some(ObjectiveSettings::Step { name, .. }) = &request.objective {
            let step = self.steps().into_iter().find(|step| step.name == name);
            let step = step.ok_or_else(|| {
                let names: Vec<&str> = self.steps().iter().map(|step| step.name).collect();
                anyhow::anyhow!(
                    "{} declares no step `{name}` in this program; its steps are {}",
                    self.name,
                    names.join(", ")
                )
            })?;
            return (step.train)(request);
        }
        if !request.objective.as_ref().is_some_and(|o| o.multi_token()) {
            return (self.train)(request);
        }
        let train = self.train_mtp.ok_or_else(|| {
            anyhow::anyhow!(
                "{} does not expose its hidden states, embedding and output head to multi-token \
                 heads (--step mtp): its program implements lmx::runtime::objectives::Backbone \
                 for it and registers it with Registry::multi_token",
                self.name
            )
        })?;
        train(request)
    }

    /// The model's training steps by name: the registered one (its default) first, then the
    /// others its declaration holds.
    pub fn steps(&self) -> Vec<NamedStep> {
        (self.steps)()
    }

    /// Samples from a run of this model.
    pub fn generate(&self, run: &RunFile, request: GenerateRequest) -> anyhow::Result<()> {
        (self.generate)(run, request)
    }

    /// Evaluates a run of this model on supervised examples.
    pub fn evaluate(&self, run: &RunFile, request: EvalRequest) -> anyhow::Result<()> {
        (self.evaluate)(run, request)
    }

    /// Fuses the adapters of a run of this model into its weights.
    pub fn fuse(&self, run: &RunFile, args: &super::lora::FuseArgs) -> anyhow::Result<()> {
        (self.fuse)(run, args)
    }

    /// Samples from a Hugging Face model folder of this model's family.
    pub fn generate_folder(
        &self,
        folder: &HfFolder,
        request: FolderGenerateRequest,
    ) -> anyhow::Result<()> {
        (self.generate_folder)(folder, request)
    }

    /// Exports a run's checkpoint, or a folder, of this model as a Hugging Face folder.
    pub fn export(&self, request: ExportRequest) -> anyhow::Result<()> {
        (self.export)(request)
    }

    /// Quantizes (or dequantizes) a run's checkpoint, or a folder, of this model.
    pub fn quantize(&self, request: QuantizeRequest) -> anyhow::Result<()> {
        (self.quantize)(request)
    }

    /// Reads a run or Hugging Face folder of this model as a distillation teacher of any student
    /// (`--teacher DIR`): its own configuration, its weights as frozen inputs.
    pub fn read_teacher(&self, dir: &Path) -> anyhow::Result<Teacher> {
        (self.read_teacher)(dir)
    }

    /// Serves a model of this model's type over HTTP (`lmx serve`).
    pub fn serve(
        &self,
        source: super::serve::Source,
        args: &super::serve::ServeArgs,
        device: DeviceKind,
    ) -> anyhow::Result<()> {
        (self.serve)(source, args, device)
    }
}

impl Registry {
    /// No models.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The bundled models of `models/`: what the stock `lmx` binary knows.
    pub fn bundled() -> Registry {
        use lmx::models::{
            deepseek_v2, deepseek_v3, gemma, gemma2, gemma3_text, gpt2, hybrid, llama, mamba2,
            mistral, mixtral, mpt, phi3, qwen2, qwen3, qwen3_next,
        };
        Registry::new()
            .sources(lmx::models::SOURCES)
            .model::<gpt2::Train>()
            .model::<llama::Train>()
            .model::<gemma::Train>()
            .model::<mistral::Train>()
            .model::<mixtral::Train>()
            .model::<mpt::Train>()
            .model::<qwen2::Train>()
            .model::<qwen3::Train>()
            .model::<gemma2::Train>()
            .model::<gemma3_text::Train>()
            .model::<phi3::Train>()
            .model::<deepseek_v2::Train>()
            .model::<mamba2::Train>()
            .model::<hybrid::Train>()
            .model::<qwen3_next::Train>()
            .model::<deepseek_v3::Train>()
            .multi_token::<llama::Train>()
    }

    /// Adds the model that training step `S` trains, under its name: a `.lmx` model's generated
    /// `Train` (its first step), or any other type implementing `TrainingStep`. `S` is the
    /// model's default step; the other steps the model declares
    /// ([`LanguageModel::declared_steps`]) train by name (`--step NAME`). A later registration
    /// of the same name replaces the earlier one.
    pub fn model<S: TrainingStep>(mut self) -> Registry
    where
        <<S::Model as LanguageModel>::Params as Tree<Array>>::Of<
            Option<<S::Optimizer as Optimizer>::Leaf>,
        >: Clone + 'static,
    {
        let registered = Registered {
            name: S::Model::NAME,
            presets: S::Model::presets,
            train: train::train::<S>,
            train_mtp: None,
            generate: train::sample::<S>,
            evaluate: eval::evaluate::<S>,
            fuse: super::lora::fuse::<S>,
            generate_folder: hf_model::sample::<S::Model>,
            export: export::export::<S::Model>,
            quantize: quantize::quantize::<S::Model>,
            serve: super::serve::serve::<S::Model>,
            read_teacher: super::objective::read_teacher::<S::Model>,
            steps: named_steps::<S>,
        };
        self.steps.retain(|step| step.name != registered.name);
        self.steps.push(registered);
        self
    }

    /// Lets the model of step `S` train with multi-token heads (`lmx train --step mtp`): its
    /// hidden states, embedding and output head through [`Backbone`], the heads trained under
    /// `S`'s optimizer and options. Registers the model as [`model`](Self::model) does if it is
    /// not yet.
    pub fn multi_token<S: TrainingStep>(mut self) -> Registry
    where
        S::Model: Backbone,
        <<S::Model as LanguageModel>::Params as Tree<Array>>::Of<
            Option<<S::Optimizer as Optimizer>::Leaf>,
        >: Clone + 'static,
        <<Mtp<S::Model> as LanguageModel>::Params as Tree<Array>>::Of<
            Option<<S::Optimizer as Optimizer>::Leaf>,
        >: Clone + 'static,
    {
        if self.step(S::Model::NAME).is_none() {
            self = self.model::<S>();
        }
        for step in &mut self.steps {
            if step.name == S::Model::NAME {
                step.train_mtp = Some(train::train_mtp::<S>);
            }
        }
        self
    }

    /// Adds `.lmx` sources (a crate's `models::SOURCES`) for `lmx check`, `info`, `count` and
    /// `models` to name, and for `--model FILE.lmx` to match against.
    pub fn sources(mut self, sources: Sources) -> Registry {
        for &row in sources {
            self.sources.retain(|(name, _, _)| *name != row.0);
            self.sources.push(row);
        }
        self
    }

    /// Runs the command line over these models, as the `lmx` binary does: parses the arguments,
    /// runs the command, prints an error and exits with its status.
    pub fn main(self) -> std::process::ExitCode {
        super::process::main(&self)
    }

    /// The registered model named `name`.
    pub fn step(&self, name: &str) -> Option<&Registered> {
        self.steps.iter().find(|step| step.name == name)
    }

    /// The registered models, in registration order.
    pub fn registered(&self) -> &[Registered] {
        &self.steps
    }

    /// The names of the registered models.
    pub fn names(&self) -> Vec<&'static str> {
        self.steps.iter().map(|step| step.name).collect()
    }

    /// `(name, file name, source)` of every registered `.lmx` source.
    pub fn all_sources(&self) -> &[(&'static str, &'static str, &'static str)] {
        &self.sources
    }

    /// The registered source of the model named `name`.
    pub fn source_of(&self, name: &str) -> Option<&'static str> {
        self.sources
            .iter()
            .find(|(model, _, _)| *model == name)
            .map(|(_, _, source)| *source)
    }

    /// The error for a model that is neither registered nor a `.lmx` file.
    pub fn unknown(&self, model: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "no trainable model `{model}`; the registered ones are {}, or give a path to a .lmx \
             file or a Hugging Face model folder",
            self.names().join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Registry;

    /// A model added to `models/` fails here until `Registry::bundled` names its step type.
    #[test]
    fn every_bundled_model_is_trainable() {
        let registry = Registry::bundled();
        let mut bundled: Vec<&str> = lmx::models::SOURCES
            .iter()
            .map(|(name, _, _)| *name)
            .collect();
        let mut trainable = registry.names();
        bundled.sort_unstable();
        trainable.sort_unstable();
        assert_eq!(bundled, trainable);
    }
}
