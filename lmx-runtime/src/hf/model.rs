//! A folder read as a bundled model: its configuration and its parameters.

use super::HfFolder;
use super::LoadOptions;
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use mlx_rs::Dtype;

/// The configuration of `M` that `folder`'s `config.json` gives: the settings it maps to over
/// `M`'s first preset (for those it does not give, such as dropout), checked by `M`'s rules.
pub fn model_config<M: LanguageModel>(folder: &HfFolder) -> Result<M::Config> {
    let expected = folder.family().model_name();
    if expected != M::NAME {
        return Err(Error::Config(format!(
            "{} holds a {expected} model, not {}",
            folder.dir().display(),
            M::NAME
        )));
    }
    let base = M::presets()
        .first()
        .and_then(|name| M::preset(name))
        .ok_or_else(|| Error::Config(format!("{} has no preset to start from", M::NAME)))?;
    let mut config = serde_json::to_value(base)
        .map_err(|err| Error::Config(format!("{}'s configuration: {err}", M::NAME)))?;
    if let Some(object) = config.as_object_mut() {
        object.extend(folder.lmx_config()?);
    }
    let config: M::Config = serde_json::from_value(config).map_err(|err| {
        Error::Config(format!(
            "{}: the settings do not make a {} configuration: {err}",
            folder.dir().display(),
            M::NAME
        ))
    })?;
    M::validate(&config)?;
    Ok(config)
}

/// `folder` as a model `M`: its configuration, and its parameters in `dtype` (floating-point
/// ones; `None`: float32, as `init` makes them).
pub fn load_model<M: LanguageModel>(
    folder: &HfFolder,
    dtype: Option<Dtype>,
) -> Result<(M::Config, M::Params)> {
    let config = model_config::<M>(folder)?;
    // The template's arrays are never evaluated: only their names and shapes are read.
    let mut template = M::init(&config, 0)?;
    crate::quant::layout::prepare_folder(&mut template, folder)?;
    let params = folder
        .load_into(
            &template,
            LoadOptions {
                dtype,
                ..LoadOptions::default()
            },
        )
        .map_err(|err| crate::quant::layout::loading_error(err, &template, folder))?;
    Ok((config, params))
}
