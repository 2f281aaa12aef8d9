//! `lmx train --set NAME=VALUE`: a model's declared settings changed from the command line, on
//! top of its preset (`--set pdrop=0.1`, `--set n_layers=2`).

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// One `NAME=VALUE` override.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The setting's name, as the `.lmx` file's `config` declares it.
    pub name: String,
    /// Its new value, as written.
    pub value: String,
}

impl std::str::FromStr for Setting {
    type Err = String;

    fn from_str(text: &str) -> Result<Setting, String> {
        match text.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() => Ok(Setting {
                name: name.trim().to_owned(),
                value: value.trim().to_owned(),
            }),
            _ => Err(format!("`{text}` is not NAME=VALUE")),
        }
    }
}

/// `config` with `settings` applied in order. Each value is read as the type the setting already
/// has (an integer, a finite float, a flag, or an enum's variant name); an unknown name or a value
/// of the wrong type is an error that names the setting and the model. Whether the values obey
/// the model's rules is for its `Config::validate` to say.
pub fn apply<C: Serialize + DeserializeOwned>(
    config: &C,
    settings: &[Setting],
    model: &str,
) -> anyhow::Result<C> {
    let mut value = serde_json::to_value(config)?;
    let fields = value
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("{model}'s configuration is not a set of named settings"))?;
    for setting in settings {
        let names = || fields.keys().cloned().collect::<Vec<_>>().join(", ");
        let Some(slot) = fields.get(&setting.name) else {
            anyhow::bail!(
                "{model} has no setting `{}`; its settings are {}",
                setting.name,
                names()
            );
        };
        let parsed = parse_like(slot, &setting.value).ok_or_else(|| {
            anyhow::anyhow!(
                "{model}'s `{}` is {}, not `{}`",
                setting.name,
                kind(slot),
                setting.value
            )
        })?;
        fields.insert(setting.name.clone(), parsed);
    }
    serde_json::from_value(value).map_err(|err| anyhow::anyhow!("{model}'s settings: {err}"))
}

/// `text` as a value of `like`'s type.
fn parse_like(like: &Value, text: &str) -> Option<Value> {
    match like {
        // JSON, which carries the configuration, has no NaN or infinity.
        Value::Number(n) if n.is_f64() => text
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(Value::from),
        Value::Number(_) => text.parse::<i64>().ok().map(Value::from),
        Value::Bool(_) => text.parse::<bool>().ok().map(Value::from),
        Value::String(_) => Some(Value::from(text)),
        _ => None,
    }
}

/// What kind of value `like` is, for errors.
fn kind(like: &Value) -> &'static str {
    match like {
        Value::Number(n) if n.is_f64() => "a finite float",
        Value::Number(_) => "an integer",
        Value::Bool(_) => "true or false",
        Value::String(_) => "a name",
        _ => "not settable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmx::models::gpt2;

    fn set(texts: &[&str]) -> Vec<Setting> {
        texts.iter().map(|text| text.parse().unwrap()).collect()
    }

    #[test]
    fn settings_apply_over_the_preset_with_their_own_types() {
        let tiny = gpt2::Config::preset("tiny").unwrap();
        let changed = apply(&tiny, &set(&["pdrop=0.1", "n_layers = 3"]), "gpt2").unwrap();
        assert_eq!((changed.pdrop, changed.n_layers), (0.1, 3));
        assert_eq!(changed.d_model, tiny.d_model, "the rest is the preset's");
    }

    #[test]
    fn unknown_names_and_wrong_types_are_errors_that_name_them() {
        let tiny = gpt2::Config::preset("tiny").unwrap();
        let unknown = apply(&tiny, &set(&["dropout=0.1"]), "gpt2")
            .unwrap_err()
            .to_string();
        assert!(
            unknown.starts_with("gpt2 has no setting `dropout`; its settings are ")
                && unknown.contains("pdrop"),
            "{unknown}"
        );
        let wrong = apply(&tiny, &set(&["n_layers=2.5"]), "gpt2")
            .unwrap_err()
            .to_string();
        assert_eq!(wrong, "gpt2's `n_layers` is an integer, not `2.5`");
        for text in ["NaN", "inf", "-inf"] {
            let wrong = apply(&tiny, &set(&[&format!("pdrop={text}")]), "gpt2")
                .unwrap_err()
                .to_string();
            assert_eq!(
                wrong,
                format!("gpt2's `pdrop` is a finite float, not `{text}`")
            );
        }
        assert_eq!(
            "pdrop".parse::<Setting>().unwrap_err(),
            "`pdrop` is not NAME=VALUE"
        );
    }
}
