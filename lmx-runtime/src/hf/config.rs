//! Reading `config.json`'s keys: typed, with transformers' defaults for the keys a config class
//! fills in when they are absent, and errors that name the file, the key and its value.

use super::error::HfError;
use serde_json::Value;
use std::path::Path;

/// One `config.json` (or a nested object of it, such as MPT's `attn_config`).
pub(crate) struct ConfigReader<'a> {
    path: &'a Path,
    prefix: String,
    object: &'a serde_json::Map<String, Value>,
}

/// The empty object that stands for an absent nested one.
static EMPTY: std::sync::LazyLock<serde_json::Map<String, Value>> =
    std::sync::LazyLock::new(serde_json::Map::new);

impl<'a> ConfigReader<'a> {
    /// The top level of `config`, read from `path`.
    pub(crate) fn new(path: &'a Path, config: &'a Value) -> Result<Self, HfError> {
        let object = config.as_object().ok_or_else(|| HfError::File {
            path: path.to_owned(),
            message: "not a JSON object".into(),
        })?;
        Ok(ConfigReader {
            path,
            prefix: String::new(),
            object,
        })
    }

    fn dotted(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The nested object `key` (an absent or null one reads as empty, its keys as defaults).
    pub(crate) fn nested(&self, key: &str) -> Result<ConfigReader<'a>, HfError> {
        let object = match self.object.get(key) {
            None | Some(Value::Null) => &*EMPTY,
            Some(Value::Object(object)) => object,
            Some(other) => return Err(self.error(key, other, "must be an object")),
        };
        Ok(ConfigReader {
            path: self.path,
            prefix: format!("{}.", self.dotted(key)),
            object,
        })
    }

    /// The error for `key` holding `value`.
    pub(crate) fn error(&self, key: &str, value: &Value, reason: impl Into<String>) -> HfError {
        HfError::Setting {
            path: self.path.to_owned(),
            key: self.dotted(key),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// The value of `key`, `None` when absent or null.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key).filter(|value| !value.is_null())
    }

    /// Whether `key` is present and null (transformers' way of turning a feature off).
    pub(crate) fn object_has_null(&self, key: &str) -> bool {
        matches!(self.object.get(key), Some(Value::Null))
    }

    /// A required integer of at least 1.
    pub(crate) fn size(&self, key: &str) -> Result<i64, HfError> {
        match self.get(key) {
            None => Err(HfError::Setting {
                path: self.path.to_owned(),
                key: self.dotted(key),
                value: "-".into(),
                reason: "is required".into(),
            }),
            Some(value) => value
                .as_i64()
                .filter(|&n| n >= 1)
                .ok_or_else(|| self.error(key, value, "must be an integer of at least 1")),
        }
    }

    /// An integer of at least 1, `default` when absent.
    pub(crate) fn size_or(&self, key: &str, default: i64) -> Result<i64, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.size(key),
        }
    }

    /// A finite number, `default` when absent.
    pub(crate) fn float_or(&self, key: &str, default: f64) -> Result<f64, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => value
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| self.error(key, value, "must be a finite number")),
        }
    }

    /// Fails unless `key` is absent, null, or `expected`; `reason` says why another value cannot
    /// be expressed.
    pub(crate) fn require(&self, key: &str, expected: Value, reason: &str) -> Result<(), HfError> {
        match self.get(key) {
            Some(value) if !same(value, &expected) => Err(self.error(key, value, reason)),
            _ => Ok(()),
        }
    }

    /// Fails unless `key` is absent, null, or one of `allowed`.
    pub(crate) fn one_of(&self, key: &str, allowed: &[&str], reason: &str) -> Result<(), HfError> {
        match self.get(key) {
            Some(value) if !allowed.iter().any(|name| value.as_str() == Some(name)) => {
                Err(self.error(key, value, reason))
            }
            _ => Ok(()),
        }
    }
}

/// JSON equality with numbers compared by value (`8` and `8.0` are the same).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// RoPE settings: the base, and a failure for any scaling (`rope_scaling`, or transformers 5's
/// `rope_parameters` with a type other than `default`), which the model does not apply.
pub(crate) fn rope_base(config: &ConfigReader, default: f64) -> Result<f64, HfError> {
    rope(
        config,
        default,
        &[],
        "the bundled models apply RoPE unscaled",
    )
    .map(|rope| rope.base)
}

/// RoPE settings that a model may scale: the base, the scaling's kind (`"default"` for none)
/// and the object that holds its parameters.
pub(crate) struct Rope<'a> {
    pub(crate) base: f64,
    pub(crate) kind: String,
    pub(crate) params: ConfigReader<'a>,
}

/// The RoPE settings of `config` (transformers 5's `rope_parameters`, or 4's `rope_theta` and
/// `rope_scaling`), failing with `reason` unless the scaling's kind is `default` or in `kinds`.
pub(crate) fn rope<'a>(
    config: &ConfigReader<'a>,
    default: f64,
    kinds: &[&str],
    reason: &str,
) -> Result<Rope<'a>, HfError> {
    // transformers 5 writes `rope_parameters` (the base in it); transformers 4 `rope_theta` and,
    // when scaled, `rope_scaling`, which then decides.
    let parameters = config.nested("rope_parameters")?;
    let base = parameters.float_or("rope_theta", config.float_or("rope_theta", default)?)?;
    let params = match config.get("rope_scaling") {
        Some(scaling) => {
            let params = config.nested("rope_scaling")?;
            if params.get("type").is_none() && params.get("rope_type").is_none() {
                return Err(config.error("rope_scaling", scaling, reason));
            }
            params
        }
        None => parameters,
    };
    rope_in(params, base, kinds, reason)
}

/// The RoPE settings held by one object (`rope_parameters`, or one layer kind's entry of it):
/// its `rope_theta` (`default` when absent) and kind, which must be `default` or in `kinds`.
pub(crate) fn rope_in<'a>(
    params: ConfigReader<'a>,
    default: f64,
    kinds: &[&str],
    reason: &str,
) -> Result<Rope<'a>, HfError> {
    // transformers 4 names the kind `type` before 4.45.
    let kind_key = if params.get("type").is_some() && params.get("rope_type").is_none() {
        "type"
    } else {
        "rope_type"
    };
    let kind = match params.get(kind_key) {
        Some(kind) => kind
            .as_str()
            .ok_or_else(|| params.error(kind_key, kind, "must be a string"))?
            .to_owned(),
        None => "default".to_owned(),
    };
    if kind != "default" && !kinds.contains(&kind.as_str()) {
        return Err(params.error(kind_key, &Value::String(kind), reason));
    }
    let base = params.float_or("rope_theta", default)?;
    Ok(Rope { base, kind, params })
}
