//! `run.json`: what a run directory was trained with, so that `generate` and `--resume` need
//! nothing but the directory, and so that a resumed run can tell what it would change.

use super::tokenizer::TokenizerSpec;
use lmx::runtime::checkpoint::{self, Checkpoints, MODEL_FILE};
use lmx::runtime::hf::{self, Family, HfFolder};
use lmx::runtime::lora;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::objectives::is_head_tensor;
use lmx::runtime::quant;
use lmx::runtime::train::TrainConfig;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The name of the file in the run directory.
pub const RUN_FILE: &str = "run.json";

/// The contents of `RUN/run.json`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunFile {
    /// The bundled model's name.
    pub model: String,
    /// The preset the configuration came from.
    pub preset: String,
    /// The model's configuration.
    pub model_config: serde_json::Value,
    /// The tokenizer.
    pub tokenizer: TokenizerSpec,
    /// The training data's files, as given (empty in runs recorded before they were).
    #[serde(default)]
    pub data: Vec<PathBuf>,
    /// How many tokens the data held: a file changed under the same name changes it.
    #[serde(default)]
    pub data_tokens: Option<u64>,
    /// How supervised examples were read, for data that is a folder of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sft: Option<super::sft::SftSettings>,
    /// The training settings.
    pub train: TrainConfig,
    /// The adapters a LoRA run (`lmx lora`) trains on top of the frozen model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<super::lora::LoraRun>,
    /// The Hugging Face model folder whose weights the run started from (`--init`); none for
    /// freshly initialised weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<PathBuf>,
    /// The fingerprint of the `--init` folder's weights when the run started
    /// (`Weights::fingerprint`): a LoRA run's checkpoints leave its frozen base there, so a
    /// folder whose weights changed since is refused rather than read as the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_weights: Option<String>,
    /// The objective trained instead of the model's own step (`--step dpo`, `--teacher`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<super::objective::ObjectiveSettings>,
    /// The easy data of a difficulty curriculum (`--curriculum-easy`), `data` being the hard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curriculum: Option<DifficultySettings>,
    /// The layers its checkpoints hold packed, as mlx-lm's `quantization` entry with every
    /// quantized layer named (`quant::layout::record`): a run `lmx quantize` wrote, or one whose
    /// model started from packed weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<serde_json::Value>,
}

/// A difficulty curriculum as `run.json` records it: every batch mixes rows of `easy` with
/// rows of the run's data, from all easy to all hard over `warmup_fraction` of the run
/// (lmxlab's `difficulty_curriculum`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DifficultySettings {
    /// The easy data's files (`--curriculum-easy`).
    pub easy: Vec<PathBuf>,
    /// The fraction of the run over which the hard share grows to 1 (`--curriculum-warmup`).
    pub warmup_fraction: f64,
    /// How many tokens the easy data held (set once read): a file changed under the same name
    /// changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub easy_tokens: Option<u64>,
}

/// The training settings that change what a run computes; the others (overlap, state packing,
/// evaluation, checkpoints, logging, the run directory) may change when it resumes.
const RUN_DEFINING: &[&str] = &[
    "steps",
    "batch_size",
    "seq_len",
    "accumulation",
    "schedule",
    "seed",
    "precision",
    "validation_fraction",
];

/// A setting that differs between a run's record and a resumed run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Its place in `run.json`, dotted: `train.schedule.lr`, `model_config.n_layers`.
    pub setting: String,
    /// The recorded value (`-` if none).
    pub old: String,
    /// The new value (`-` if none).
    pub new: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} -> {}", self.setting, self.old, self.new)
    }
}

impl RunFile {
    /// Writes `dir/run.json`, atomically.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(RUN_FILE);
        let temporary = dir.join(".run.json.partial");
        let io = |err: std::io::Error| anyhow::anyhow!("{}: {err}", path.display());
        std::fs::write(&temporary, serde_json::to_vec_pretty(self)?).map_err(io)?;
        std::fs::rename(&temporary, &path).map_err(io)?;
        Ok(())
    }

    /// Reads `dir/run.json`.
    pub fn read(dir: &Path) -> anyhow::Result<RunFile> {
        let path = dir.join(RUN_FILE);
        let text = std::fs::read_to_string(&path).map_err(|err| {
            anyhow::anyhow!(
                "{}: {err} (is {} a run directory?)",
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_str(&text).map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))
    }

    /// The settings that change what the run computes, by dotted name. The data is compared
    /// only where both records have it.
    fn defining(&self, other: &RunFile) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        out.insert("model".into(), self.model.clone());
        if let Some(init) = &self.init {
            out.insert("init".into(), init.display().to_string());
        }
        flatten("model_config", &self.model_config, &mut out);
        flatten("tokenizer", &json(&self.tokenizer), &mut out);
        if !self.data.is_empty() && !other.data.is_empty() {
            out.insert("data".into(), json(&self.data).to_string());
        }
        if let (Some(tokens), Some(_)) = (self.data_tokens, other.data_tokens) {
            out.insert("data_tokens".into(), tokens.to_string());
        }
        if let (Some(weights), Some(_)) = (&self.init_weights, &other.init_weights) {
            out.insert("init_weights".into(), weights.clone());
        }
        if let Some(sft) = &self.sft {
            flatten("sft", &json(sft), &mut out);
        }
        if let Some(objective) = &self.objective {
            flatten("objective", &json(objective), &mut out);
        }
        if let Some(curriculum) = &self.curriculum {
            flatten("curriculum", &json(curriculum), &mut out);
        }
        if let Some(lora) = &self.lora {
            // Where the adapters are written does not change what the run computes.
            flatten("lora.parameters", &json(&lora.parameters), &mut out);
            out.insert("lora.num_layers".into(), lora.num_layers.to_string());
            out.insert(
                "lora.fine_tune_type".into(),
                lora.fine_tune_type.name().into(),
            );
        }
        let train = json(&self.train);
        for name in RUN_DEFINING {
            flatten(&format!("train.{name}"), &train[name], &mut out);
        }
        out
    }

    /// What `new` changes of this run's record, setting by setting.
    pub fn changes(&self, new: &RunFile) -> Vec<Change> {
        let (old, new) = (self.defining(new), new.defining(self));
        let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        let value = |map: &BTreeMap<String, String>, name: &String| {
            map.get(name).cloned().unwrap_or_else(|| "-".into())
        };
        names
            .into_iter()
            .filter(|name| old.get(*name) != new.get(*name))
            .map(|name| Change {
                setting: name.clone(),
                old: value(&old, name),
                new: value(&new, name),
            })
            .collect()
    }
}

fn json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("plain data serializes")
}

/// The leaves of `value` under `prefix`, by dotted name.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(fields) => {
            for (name, value) in fields {
                flatten(&format!("{prefix}.{name}"), value, out);
            }
        }
        Value::String(text) => {
            out.insert(prefix.into(), text.clone());
        }
        // An f32 setting reaches JSON values widened to f64 (0.003 as 0.003000000026077032):
        // shown as the f32 it is.
        Value::Number(number) if number.is_f64() => {
            let wide = number.as_f64().unwrap_or(f64::NAN);
            let text = if f64::from(wide as f32) == wide {
                readable(wide as f32)
            } else {
                readable(wide)
            };
            out.insert(prefix.into(), text);
        }
        other => {
            out.insert(prefix.into(), other.to_string());
        }
    }
}

/// `value` in the shortest digits that read back as it, with an exponent where it is very large
/// or small (`1e38`, not 39 digits).
fn readable<F: std::fmt::Display + std::fmt::LowerExp + Into<f64> + Copy>(value: F) -> String {
    let magnitude = value.into().abs();
    if magnitude != 0.0 && !(1e-4..1e6).contains(&magnitude) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

/// The checkpoint `checkpoint` names, or the run's latest.
pub fn checkpoint_of(run: &Path, checkpoint: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match checkpoint {
        Some(dir) => Ok(dir),
        None => Checkpoints::new(run.join("checkpoints"))
            .latest()?
            .ok_or_else(|| anyhow::anyhow!("{} has no checkpoint yet", run.display())),
    }
}

/// `path` as a run's checkpoint, `(run directory, checkpoint)`: a run directory (its latest
/// checkpoint) or a checkpoint directory of one (`RUN/checkpoints/step-N`); `None` where it is
/// neither.
pub fn run_checkpoint(path: &Path) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
    if path.join(RUN_FILE).is_file() {
        return Ok(Some((path.to_owned(), checkpoint_of(path, None)?)));
    }
    let run = path
        .parent()
        .and_then(Path::parent)
        .filter(|run| path.join(MODEL_FILE).is_file() && run.join(RUN_FILE).is_file());
    Ok(run.map(|run| (run.to_owned(), path.to_owned())))
}

/// The parameters of `checkpoint` of `run`, a run of `M`, with the run's own adapters (a LoRA
/// run's checkpoints hold them) and then those of the folder `adapter`.
pub fn load_params<M: LanguageModel>(
    run: &RunFile,
    config: &M::Config,
    checkpoint: &Path,
    adapter: Option<&Path>,
) -> anyhow::Result<M::Params> {
    if adapter.is_some() && run.lora.is_some() {
        // Its checkpoints hold the run's own adapters, and an adapter folder loads over a model
        // without any: whatever layers the folder's cover, it cannot go on top.
        anyhow::bail!(
            "{} is a LoRA run's, which holds its adapters already: leave out --adapter to use \
             them, or fuse them first (`lmx fuse`) to add others over them",
            checkpoint.display()
        );
    }
    let folder = run.init.as_deref().map(HfFolder::open).transpose()?;
    let place = run_file_of(checkpoint);
    let mut template = match (&folder, &run.lora) {
        // A LoRA run's checkpoints leave out the frozen base, which is the folder's.
        (Some(folder), Some(_)) => run.train.precision.cast(&lora_base::<M>(run, folder)?)?,
        (folder, _) => template::<M>(run, config, 0, folder.as_ref(), &place)?,
    };
    if let Some(lora) = &run.lora {
        lora::attach(
            &mut template,
            &lora.parameters,
            lora.num_layers,
            0,
            lora.fine_tune_type,
        )?;
    }
    let file = checkpoint.join(MODEL_FILE);
    // A run with multi-token heads checkpoints them beside the model, which is read alone.
    let mut params = match run.objective.as_ref().is_some_and(|o| o.multi_token()) {
        true => checkpoint::load_tree_over_skipping(&file, &template, &is_head_tensor)?,
        false => checkpoint::load_tree_over(&file, &template)?,
    };
    if let Some(dir) = adapter {
        lora::load_adapters(&mut params, dir, Family::of_model(&run.model))?;
    }
    Ok(params)
}

/// The configuration and parameters of `checkpoint` of the run `run` (in `dir`), a run of `M`,
/// for a command (`what`) that reads the model alone: a LoRA run is refused.
pub fn read_model<M: LanguageModel>(
    run: &RunFile,
    dir: &Path,
    checkpoint: &Path,
    what: &str,
) -> anyhow::Result<(M::Config, M::Params)> {
    let config: M::Config = serde_json::from_value(run.model_config.clone())
        .map_err(|err| anyhow::anyhow!("{}'s model configuration: {err}", dir.display()))?;
    M::validate(&config)?;
    refuse_adapters(run, dir, what)?;
    let params = load_params::<M>(run, &config, checkpoint, None)?;
    Ok((config, params))
}

/// The parameters a checkpoint of `run` (a run of `M` at `config`) loads into: `M`'s, initialised
/// from `seed`, laid out as the checkpoint's packed layers are (the quantization of `folder`, the
/// run's `--init`, and the run's own record; `place` names that record in errors), in the run's
/// precision.
pub fn template<M: LanguageModel>(
    run: &RunFile,
    config: &M::Config,
    seed: u64,
    folder: Option<&HfFolder>,
    place: &str,
) -> anyhow::Result<M::Params> {
    let mut template = M::init(config, seed)?;
    // The layout first, so that the precision casts the placeholders' scales as the
    // checkpoint holds them.
    if let Some(folder) = folder {
        quant::layout::prepare_folder(&mut template, folder)?;
    }
    if let Some(record) = &run.quantization {
        quant::layout::prepare_recorded(&mut template, record, place)?;
    }
    Ok(run.train.precision.cast(&template)?)
}

/// The record (`RUN/run.json`) of the run that `checkpoint` (`RUN/checkpoints/step-N`) belongs
/// to, as errors name it.
pub fn run_file_of(checkpoint: &Path) -> String {
    match checkpoint.parent().and_then(Path::parent) {
        Some(run) => run.join(RUN_FILE).display().to_string(),
        None => RUN_FILE.to_owned(),
    }
}

/// The frozen base of the LoRA run `run` over `folder` (its `--init`): the folder's weights, once
/// they are known to be those the run recorded.
fn lora_base<M: LanguageModel>(run: &RunFile, folder: &HfFolder) -> anyhow::Result<M::Params> {
    let now = folder.weights().fingerprint()?;
    if let Some(recorded) = run
        .init_weights
        .as_ref()
        .filter(|&recorded| *recorded != now)
    {
        anyhow::bail!(
            "the weights of {} changed since the run started from them (fingerprint {recorded}, \
             now {now}): the run's checkpoints hold its adapters only, over those weights",
            folder.dir().display()
        );
    }
    Ok(hf::load_model::<M>(folder, None)?.1)
}

/// Refuses a LoRA run where its model alone is to be written from its checkpoint (`what`: the
/// command, which reads no adapters): they must be fused into the weights first.
pub fn refuse_adapters(run: &RunFile, dir: &Path, what: &str) -> anyhow::Result<()> {
    if run.lora.is_some() {
        anyhow::bail!(
            "{} trains low-rank adapters over its model: fuse them into the weights first (`lmx \
             fuse --run {0} --out FUSED`), then {what} FUSED",
            dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmx::runtime::schedule::Schedule;
    use lmx::runtime::train::Overlap;

    fn run() -> RunFile {
        RunFile {
            model: "gpt2".into(),
            preset: "tiny-bytes".into(),
            model_config: serde_json::json!({"n_layers": 2, "pdrop": 0.0}),
            tokenizer: TokenizerSpec::Byte,
            data: vec!["data/shakespeare.txt".into()],
            data_tokens: Some(1000),
            sft: None,
            train: TrainConfig::default(),
            lora: None,
            init: None,
            init_weights: None,
            objective: None,
            curriculum: None,
            quantization: None,
        }
    }

    #[test]
    fn only_the_settings_that_change_the_run_are_changes() {
        let old = run();
        let mut new = run();
        new.train.overlap = Overlap::Off;
        new.train.eval_every = 7;
        new.train.out_dir = "elsewhere".into();
        assert_eq!(old.changes(&new), []);
        new.model_config["n_layers"] = 3.into();
        new.train.batch_size = 4;
        new.train.schedule = Schedule::Cosine {
            lr: 1e-3,
            warmup_steps: 30,
            total_steps: 300,
            final_lr: 1e-4,
        };
        new.data_tokens = Some(999);
        new.train.seed = 7;
        new.model_config["pdrop"] = 1e-5.into();
        let changes: Vec<String> = old.changes(&new).iter().map(Change::to_string).collect();
        assert_eq!(
            changes,
            [
                "data_tokens: 1000 -> 999",
                "model_config.n_layers: 2 -> 3",
                "model_config.pdrop: 0 -> 1e-5",
                "train.batch_size: 16 -> 4",
                "train.schedule.final_lr: 0.0003 -> 1e-4",
                "train.schedule.lr: 0.003 -> 0.001",
                "train.seed: 0 -> 7",
            ]
        );
    }
}
