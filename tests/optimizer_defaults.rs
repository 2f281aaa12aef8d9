//! The language's optimizer settings are the runtime's: every setting a `.lmx` step may write
//! exists on the runtime optimizer the step becomes, with the same default, so a setting left out
//! means what the runtime means by it.

use lmx::runtime::optim::{Adafactor, Adam, AdamW, Lion, Sgd};
use lmx_grammar::ir::{OptimizerKind, SettingDefault};
use serde_json::{Map, Value};

/// The runtime optimizer's fields by name, nested structs flattened (AdamW's `adam.beta1` is
/// `beta1`).
fn fields(optimizer: impl serde::Serialize) -> Map<String, Value> {
    fn flatten(value: Value, out: &mut Map<String, Value>) {
        if let Value::Object(map) = value {
            for (name, value) in map {
                match value {
                    Value::Object(_) => flatten(value, out),
                    value => {
                        out.insert(name, value);
                    }
                }
            }
        }
    }
    let mut out = Map::new();
    flatten(serde_json::to_value(optimizer).unwrap(), &mut out);
    out
}

#[test]
fn every_language_setting_defaults_to_the_runtime_default() {
    for kind in OptimizerKind::ALL {
        let runtime = match kind {
            OptimizerKind::Sgd => fields(Sgd::default()),
            OptimizerKind::Adam => fields(Adam::default()),
            OptimizerKind::AdamW => fields(AdamW::default()),
            OptimizerKind::Lion => fields(Lion::default()),
            OptimizerKind::Adafactor => fields(Adafactor::default()),
        };
        for &(name, default) in kind.hyper_parameters() {
            let value = runtime
                .get(name)
                .unwrap_or_else(|| panic!("{}: the runtime has no `{name}`", kind.name()));
            let same = match default {
                SettingDefault::Float(x) => value.as_f64() == Some(f64::from(x as f32)),
                SettingDefault::Bool(b) => value.as_bool() == Some(b),
                SettingDefault::Unset => value.is_null(),
            };
            assert!(
                same,
                "{}: `{name}` defaults to {default:?} in the language, {value} in the runtime",
                kind.name()
            );
        }
    }
}
