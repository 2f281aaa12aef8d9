//! A compiled model's configuration checked at run time with the rules of its `.lmx` file, the
//! ones `lmx check` applies to every preset (`lmx_grammar::rules`): generated `Config::validate`
//! methods call [`validate`], so that a configuration changed in a program or by
//! `lmx train --set` is refused as a preset with the same values would be.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use lmx_grammar::eval::{Env, Value};
use lmx_grammar::types::StaticTy;
use lmx_grammar::CheckedModel;
use lmx_runtime::{Error, Result};

/// Fails with [`Error::Config`], naming the model and the setting at fault, if `config` breaks a
/// rule of the model declared in `source` (the `.lmx` text it was compiled from).
pub fn validate<C: serde::Serialize>(source: &'static str, config: &C) -> Result<()> {
    let model = checked(source)?;
    let settings = settings(&model, config)?;
    lmx_grammar::rules::validate(&model, &settings)
        .map_err(|message| Error::Config(format!("{}: {message}", model.name)))
}

/// The checked model of `source`, checked once per process.
fn checked(source: &'static str) -> Result<Arc<CheckedModel>> {
    static CHECKED: OnceLock<Mutex<HashMap<&'static str, Arc<CheckedModel>>>> = OnceLock::new();
    let mut cache = CHECKED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(model) = cache.get(source) {
        return Ok(model.clone());
    }
    // The build script checked this source before generating the model's code.
    let model = lmx_grammar::check_source("model.lmx", source).map_err(Error::Config)?;
    let model = Arc::new(model);
    cache.insert(source, model.clone());
    Ok(model)
}

/// The settings of `config` as the checker's values, read by each setting's declared type. JSON
/// has no NaN or infinity: serde writes a non-finite float as `null`, read back here as NaN,
/// which the rules refuse by name.
fn settings<C: serde::Serialize>(model: &CheckedModel, config: &C) -> Result<Env> {
    let json = serde_json::to_value(config).map_err(|err| Error::Config(err.to_string()))?;
    let mut settings = Env::new();
    for item in model.config.iter().filter(|item| !item.derived) {
        let field = json.get(&item.name).unwrap_or(&serde_json::Value::Null);
        let value = match (&item.ty, field) {
            (StaticTy::Int(_), field) => field.as_i64().map(Value::Int),
            (StaticTy::Float, serde_json::Value::Null) => Some(Value::Float(f64::NAN)),
            (StaticTy::Float, field) => field.as_f64().map(Value::Float),
            (StaticTy::Bool, field) => field.as_bool().map(Value::Bool),
            (StaticTy::Str, field) => field.as_str().map(|s| Value::Str(s.to_owned())),
            (StaticTy::Enum(_), field) => field.as_str().map(|s| Value::Enum(s.to_owned())),
        };
        let value = value.ok_or_else(|| {
            Error::Config(format!(
                "{}: `{}` is {field}, not {}",
                model.name,
                item.name,
                item.ty.name()
            ))
        })?;
        settings.insert(item.name.clone(), value);
    }
    Ok(settings)
}
