//! `lmx train --step dpo` and `lmx train --teacher DIR`: a run that trains an objective over
//! frozen models instead of the model's own step (`lmx_runtime::objectives`), with the step's
//! optimizer, clipping and accumulation. The objective is recorded in `run.json`, so a resumed
//! run rebuilds the same frozen models: DPO's reference is the run's starting parameters (the
//! seed's initialisation or `--init`'s weights), the teacher is read again from its folder.

use super::registry::{Registered, Registry};
use super::resolve::{resolve, Resolved};
use super::run_file::{checkpoint_of, load_params, RunFile, RUN_FILE};
use super::sft::SftSettings;
use super::steps::{and_list, DeclaredSteps, BUILT_IN, BUILT_IN_PREFIX};
use super::tokenizer::TokenizerSpec;
use lmx::runtime::data::sft::SftEncoder;
use lmx::runtime::data::{read_preferences, PreferenceRows, Rows, Tokenizer};
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::objectives::{self, Teacher};
use lmx::runtime::train::{Objective, TrainData};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A run's objective, as `run.json` records it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ObjectiveSettings {
    /// DPO on preference pairs against a frozen copy of the starting parameters.
    Dpo {
        /// lmxlab's `beta` (`--beta`, 0.1 by default).
        beta: f32,
        /// The chat template's file (`--chat-template`); else the one beside the tokenizer.
        chat_template: Option<PathBuf>,
    },
    /// GRPO on prompts, against a frozen copy of the starting parameters: each update samples
    /// `group` completions of `--batch-size` prompts of up to `--seq-len` tokens.
    Grpo {
        /// `--reward`: `exact`, `regex:PATTERN` or `length[:CHARS]`.
        reward: String,
        /// `--group`, 8 by default.
        group: usize,
        /// `--temperature`, the sampling temperature, 1 by default.
        temperature: f32,
        /// `--beta`, the KL penalty's weight, 0.04 by default.
        beta: f32,
    },
    /// Multi-token prediction: the model trained with lmxlab's heads (`n_predict` and
    /// `mtp_weight` are settings of the run's model configuration, `--n-predict`,
    /// `--mtp-weight`). Its checkpoints hold the heads beside the model; generation, evaluation
    /// and export read the model alone.
    Mtp {},
    /// A step the model declares besides its default one (`step dpo` in its `.lmx` file), with
    /// the frozen models and metrics it declares; one named `dpo` reads preference pairs as the
    /// built-in DPO does.
    Step {
        /// The step's name.
        name: String,
        /// A `dpo` step's chat template (`--chat-template`); else the one beside the tokenizer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chat_template: Option<PathBuf>,
    },
    /// Distillation from the frozen teacher in `teacher` on the run's text.
    Distill {
        /// A run directory (its latest checkpoint) or a Hugging Face folder, of any registered
        /// model of the student's vocabulary.
        teacher: PathBuf,
        /// `--temperature`, 4 by default.
        temperature: f32,
        /// `--alpha`, the weight of the soft loss, 0.7 by default.
        alpha: f32,
    },
}

/// The objective flags of `lmx train`, as given.
pub struct ObjectiveFlags<'a> {
    pub step: Option<&'a str>,
    pub teacher: Option<&'a Path>,
    pub beta: Option<f32>,
    pub temperature: Option<f32>,
    pub alpha: Option<f32>,
    pub chat_template: Option<&'a Path>,
    pub reward: Option<&'a str>,
    pub group: Option<usize>,
}

impl ObjectiveFlags<'_> {
    /// The objective the flags ask for of a model that declares `steps`; `None` for the model's
    /// default step. `--step NAME` picks the model's own step of that name where it declares
    /// one, else lmx's built-in objective; `--step builtin:NAME` always the built-in one.
    pub fn settings(&self, steps: &DeclaredSteps) -> anyhow::Result<Option<ObjectiveSettings>> {
        let step = match self.step {
            Some(name) => match name.strip_prefix(BUILT_IN_PREFIX) {
                Some(built_in) if BUILT_IN.contains(&built_in) => Some(built_in),
                Some(_) => anyhow::bail!(
                    "unknown --step `{name}`: lmx's own objectives are {}",
                    and_list(&BUILT_IN)
                ),
                None if steps.declares(name) => return self.declared(name, steps),
                None if BUILT_IN.contains(&name) => Some(name),
                None => anyhow::bail!(
                    "unknown --step `{name}`: {} declares the steps {}; lmx's own objectives are \
                     {} ({BUILT_IN_PREFIX}NAME where the model declares a step of that name)",
                    steps.model,
                    steps.listed(),
                    and_list(&BUILT_IN)
                ),
            },
            None => None,
        };
        self.built_in(step)
    }

    /// The model's own step `name`: its declaration holds its loss, frozen models and settings,
    /// so the built-in objectives' flags do not apply to it.
    fn declared(
        &self,
        name: &str,
        steps: &DeclaredSteps,
    ) -> anyhow::Result<Option<ObjectiveSettings>> {
        let flags = [
            ("--teacher", self.teacher.is_some()),
            ("--beta", self.beta.is_some()),
            ("--temperature", self.temperature.is_some()),
            ("--alpha", self.alpha.is_some()),
            ("--reward", self.reward.is_some()),
            ("--group", self.group.is_some()),
        ];
        if let Some((flag, _)) = flags.iter().find(|(_, given)| *given) {
            let built_in = match BUILT_IN.contains(&name) {
                true => format!(" (--step {BUILT_IN_PREFIX}{name} trains lmx's own {name})"),
                false => String::new(),
            };
            anyhow::bail!(
                "{flag} applies to lmx's own objectives, and --step {name} trains the step `{name}` \
                 that {} declares, whose frozen models and settings its declaration \
                 holds{built_in}",
                steps.model
            );
        }
        Ok((!steps.is_default(name)).then(|| ObjectiveSettings::Step {
            name: name.to_owned(),
            chat_template: self.chat_template.map(Path::to_owned),
        }))
    }

    /// lmx's own objective `step` (or distillation, given a teacher).
    fn built_in(&self, step: Option<&str>) -> anyhow::Result<Option<ObjectiveSettings>> {
        let distill_flags = self.temperature.is_some() || self.alpha.is_some();
        let settings = match (step, self.teacher) {
            (None, None) => None,
            (Some("dpo"), None) => Some(ObjectiveSettings::Dpo {
                beta: self.beta.unwrap_or(0.1),
                chat_template: self.chat_template.map(Path::to_owned),
            }),
            (Some("dpo"), Some(_)) => anyhow::bail!(
                "--teacher distils from a teacher, --step dpo trains against a frozen copy of \
                 the model: give one of them"
            ),
            (None | Some("distill"), Some(teacher)) => Some(ObjectiveSettings::Distill {
                teacher: teacher_dir(teacher)?,
                temperature: self.temperature.unwrap_or(4.0),
                alpha: self.alpha.unwrap_or(0.7),
            }),
            (Some("distill"), None) => {
                anyhow::bail!("--step distill needs the teacher: --teacher DIR")
            }
            (Some("grpo"), None) => {
                let reward = self.reward.ok_or_else(|| {
                    anyhow::anyhow!("--step grpo needs --reward: exact, regex:PATTERN or length")
                })?;
                // Refused here, before anything is read or trained.
                parse_reward(reward, 1)?;
                Some(ObjectiveSettings::Grpo {
                    reward: reward.to_owned(),
                    group: self.group.unwrap_or(8),
                    temperature: self.temperature.unwrap_or(1.0),
                    beta: self.beta.unwrap_or(0.04),
                })
            }
            (Some("mtp"), None) => Some(ObjectiveSettings::Mtp {}),
            (Some("mtp"), Some(_)) => anyhow::bail!(
                "--teacher distils from a teacher, --step mtp trains the model with multi-token \
                 heads: give one of them"
            ),
            (Some("grpo"), Some(_)) => anyhow::bail!(
                "--teacher distils from a teacher, --step grpo trains against a frozen copy of \
                 the model: give one of them"
            ),
            (Some(other), _) => anyhow::bail!("unknown --step `{other}`"),
        };
        let grpo = matches!(settings, Some(ObjectiveSettings::Grpo { .. }));
        if (self.reward.is_some() || self.group.is_some()) && !grpo {
            anyhow::bail!("--reward and --group apply to --step grpo");
        }
        if self.group == Some(0) {
            anyhow::bail!("--group must be at least 1");
        }
        let dpo = matches!(settings, Some(ObjectiveSettings::Dpo { .. }));
        let distill = matches!(settings, Some(ObjectiveSettings::Distill { .. }));
        if self.beta.is_some() && !dpo && !grpo {
            anyhow::bail!("--beta applies to --step dpo and --step grpo");
        }
        if self.alpha.is_some() && !distill {
            anyhow::bail!("--temperature and --alpha apply to distillation (--teacher DIR)");
        }
        if distill_flags && !distill && !grpo {
            anyhow::bail!("--temperature and --alpha apply to distillation (--teacher DIR)");
        }
        Ok(settings)
    }
}

impl ObjectiveSettings {
    /// Whether the run trains the model with multi-token heads (its own step's optimizer, the
    /// heads' loss; no frozen model).
    pub fn multi_token(&self) -> bool {
        matches!(self, ObjectiveSettings::Mtp {})
    }

    /// Whether the run reads preference pairs (rows of two responses) instead of text: the
    /// built-in DPO, and a declared step named `dpo`.
    pub fn reads_pairs(&self) -> bool {
        match self {
            ObjectiveSettings::Dpo { .. } => true,
            ObjectiveSettings::Step { name, .. } => name == "dpo",
            _ => false,
        }
    }

    /// The chat template preference pairs are read through, where given.
    pub fn chat_template(&self) -> Option<&Path> {
        match self {
            ObjectiveSettings::Dpo { chat_template, .. }
            | ObjectiveSettings::Step { chat_template, .. } => chat_template.as_deref(),
            _ => None,
        }
    }

    /// Whether the run trains one of the model's own declared steps.
    pub fn declared_step(&self) -> bool {
        matches!(self, ObjectiveSettings::Step { .. })
    }

    /// The objective of a run of `M` at `config` that starts from `start`; `teacher` is the
    /// distillation's teacher, read by [`read_teacher`].
    pub fn build<M: LanguageModel>(
        &self,
        config: &M::Config,
        start: &M::Params,
        teacher: Option<Teacher>,
    ) -> anyhow::Result<Objective<M>> {
        Ok(match (self, teacher) {
            (ObjectiveSettings::Dpo { beta, .. }, _) => objectives::dpo::<M>(start, *beta),
            (ObjectiveSettings::Grpo { .. }, _) => {
                anyhow::bail!("--step grpo trains on its rollouts, through a GRPO run")
            }
            (ObjectiveSettings::Mtp {}, _) => {
                anyhow::bail!("--step mtp trains the model with its heads, over no frozen model")
            }
            (ObjectiveSettings::Step { name, .. }, _) => {
                anyhow::bail!("step `{name}` is the model's own, trained through its declaration")
            }
            (
                ObjectiveSettings::Distill {
                    temperature, alpha, ..
                },
                Some(teacher),
            ) => objectives::distillation_from::<M>(config, teacher, *temperature, *alpha)?,
            (ObjectiveSettings::Distill { teacher, .. }, None) => {
                anyhow::bail!("the teacher {} was not read", teacher.display())
            }
        })
    }
}

/// The reward `spec` names (`--reward`): `exact`, `regex:PATTERN`, `length` (`default_length`
/// characters) or `length:CHARS`.
pub fn parse_reward(
    spec: &str,
    default_length: usize,
) -> anyhow::Result<Box<dyn objectives::Reward>> {
    Ok(match spec.split_once(':') {
        None if spec == "exact" => Box::new(objectives::ExactAnswer),
        None if spec == "length" => Box::new(objectives::Length {
            target: default_length,
        }),
        Some(("regex", pattern)) => Box::new(objectives::Format::new(pattern)?),
        Some(("length", chars)) => match chars.parse::<usize>() {
            Ok(target) if target > 0 => Box::new(objectives::Length { target }),
            _ => anyhow::bail!(
                "--reward length:{chars}: the length is a positive number of characters"
            ),
        },
        _ => {
            anyhow::bail!("unknown --reward `{spec}`: exact, regex:PATTERN, length or length:CHARS")
        }
    })
}

/// `dir`, refused before anything is read or trained unless it is a run directory or a Hugging
/// Face model folder.
fn teacher_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if !dir.join(RUN_FILE).is_file() && !dir.join(hf::CONFIG_FILE).is_file() {
        anyhow::bail!(
            "--teacher {}: neither a run directory (run.json) nor a Hugging Face model folder \
             (config.json)",
            dir.display()
        );
    }
    Ok(dir.to_owned())
}

/// The model of the teacher in `dir` (a run directory or a Hugging Face folder, of any model
/// this program registers), found without reading its weights: what reads them
/// ([`Registered::read_teacher`]).
pub fn teacher_model<'r>(registry: &'r Registry, dir: &Path) -> anyhow::Result<&'r Registered> {
    let shown = dir.display();
    if teacher_dir(dir)?.join(RUN_FILE).is_file() {
        let run = RunFile::read(dir)?;
        return match resolve(registry, &run.model)? {
            Resolved::Registered(model) | Resolved::Folder(model, _) => Ok(model),
            Resolved::File(file) => anyhow::bail!(
                "the teacher {shown} is a run of {}, a model file this program does not hold: \
                 distil in a program that registers both models (a crate of your own, lmx new)",
                file.path.display()
            ),
        };
    }
    let folder = HfFolder::open(dir)?;
    let family = folder.family().model_name();
    registry.step(family).ok_or_else(|| {
        anyhow::anyhow!(
            "the teacher {shown} is a {family} model, which this program does not register"
        )
    })
}

/// The teacher in `dir`, a run of `T` (its latest checkpoint) or a Hugging Face folder of `T`'s
/// family, at its own configuration (another size is fine), as a frozen model of any type.
pub fn read_teacher<T: LanguageModel>(dir: &Path) -> anyhow::Result<Teacher> {
    if teacher_dir(dir)?.join(RUN_FILE).is_file() {
        let run = RunFile::read(dir)?;
        let config: T::Config = serde_json::from_value(run.model_config.clone())
            .map_err(|err| anyhow::anyhow!("{}: the model configuration: {err}", dir.display()))?;
        T::validate(&config)?;
        let checkpoint = checkpoint_of(dir, None)?;
        let params = load_params::<T>(&run, &config, &checkpoint, None)?;
        return Ok(Teacher::new::<T>(params, config));
    }
    let (config, params) = hf::load_model::<T>(&HfFolder::open(dir)?, None)?;
    Ok(Teacher::new::<T>(params, config))
}

/// The teacher of a distillation run, read by `model` (its registered model,
/// [`teacher_model`]), and the line that reports it; `None` for another objective.
pub fn run_teacher(
    objective: &ObjectiveSettings,
    model: Option<Registered>,
) -> anyhow::Result<Option<(Teacher, String)>> {
    let ObjectiveSettings::Distill { teacher: dir, .. } = objective else {
        return Ok(None);
    };
    let model = model
        .ok_or_else(|| anyhow::anyhow!("the teacher {}'s model is not known", dir.display()))?;
    let teacher = model.read_teacher(dir)?;
    let report = format!(
        "teacher: {} from {}, {} parameters, frozen inputs of the compiled step (no gradients, \
         no optimizer state)",
        teacher.model,
        dir.display(),
        super::check::group_digits(teacher.parameters() as u64)
    );
    Ok(Some((teacher, report)))
}

/// Refuses a teacher in `dir` whose tokenizer gives its ids other pieces than `student`'s does:
/// the soft targets would then teach the wrong tokens. A folder without `tokenizer.json` cannot
/// be compared and is let through.
pub fn check_teacher_tokenizer(dir: &Path, student: &dyn Tokenizer) -> anyhow::Result<()> {
    let (teacher, described) = if dir.join(RUN_FILE).is_file() {
        let run = RunFile::read(dir)?;
        let described = describe_tokenizer(&run.tokenizer);
        (run.tokenizer.load(dir)?, described)
    } else {
        let folder = HfFolder::open(dir)?;
        if folder.tokenizer_file().is_none() {
            return Ok(());
        }
        let spec = super::hf_model::tokenizer(&folder)?;
        let described = describe_tokenizer(&spec);
        (spec.load(dir)?, described)
    };
    let piece = |tokenizer: &dyn Tokenizer, id: u32| tokenizer.decode(&[id]).ok();
    let (theirs, ours) = (teacher.vocab_size(), student.vocab_size());
    let difference = if theirs != ours {
        Some(format!("{theirs} ids against the student's {ours}"))
    } else {
        (0..theirs as u32)
            .find(|&id| piece(teacher.as_ref(), id) != piece(student, id))
            .map(|id| {
                format!(
                    "id {id} is {:?} to the teacher and {:?} to the student",
                    piece(teacher.as_ref(), id).unwrap_or_default(),
                    piece(student, id).unwrap_or_default()
                )
            })
    };
    if let Some(difference) = difference {
        anyhow::bail!(
            "the teacher {} reads text with another tokenizer ({described}) than the student: \
             {difference}; distillation needs the same ids for the same text",
            dir.display()
        );
    }
    Ok(())
}

fn describe_tokenizer(spec: &TokenizerSpec) -> String {
    match spec {
        TokenizerSpec::Byte => "bytes".into(),
        TokenizerSpec::Bpe => "the BPE tokenizer trained for its run".into(),
        TokenizerSpec::HuggingFace { path, .. } => path.display().to_string(),
    }
}

/// The preference pairs of the one JSONL file `paths` names, as rows of `2 · seq_len` ids, the
/// last `validation_fraction` of them (at least one where the fraction is not 0) held out for
/// validation; and how many ids they hold.
pub fn preference_data(
    paths: &[PathBuf],
    seq_len: usize,
    validation_fraction: f64,
    tokenizer: &dyn Tokenizer,
    chat_template: Option<&Path>,
    tokenizer_file: Option<&Path>,
) -> anyhow::Result<(TrainData, u64)> {
    let [path] = paths else {
        anyhow::bail!("--step dpo reads one JSONL file of prompt, chosen and rejected");
    };
    let settings = SftSettings {
        mask_prompt: true,
        batching: Default::default(),
        chat_template: chat_template.map(Path::to_owned),
        keys: Default::default(),
    };
    let template = super::sft::template(&settings, tokenizer_file)?;
    let encoder = SftEncoder::new(tokenizer, template.as_ref(), true);
    let mut pairs = read_preferences(path, &encoder)?;
    let tokens = pairs
        .iter()
        .map(|pair| (pair.chosen.ids.len() + pair.rejected.ids.len()) as u64)
        .sum();
    let held_out = match validation_fraction {
        f if f > 0.0 => ((pairs.len() as f64 * f).round() as usize).max(1),
        _ => 0,
    };
    if held_out >= pairs.len() {
        anyhow::bail!(
            "{}: {} preference pairs leave none to train on after holding out a validation \
             fraction of {validation_fraction}",
            path.display(),
            pairs.len()
        );
    }
    let validation = pairs.split_off(pairs.len() - held_out);
    let train = PreferenceRows::new(path, pairs, seq_len)?;
    let validation = match validation.is_empty() {
        true => None,
        false => Some(Arc::new(PreferenceRows::new(path, validation, seq_len)?) as Arc<dyn Rows>),
    };
    Ok((
        TrainData {
            train: Arc::new(train),
            validation,
        },
        tokens,
    ))
}
