//! The rules every complete configuration obeys, beyond its types: derived values evaluate
//! (exact divisions, no division by zero, no overflow), float settings and derived floats are
//! finite, every size is
//! at least 1, every dropout probability is in `[0, 1)`, every attention's query heads are a
//! multiple of its key/value heads, and the report's quantities fit 64 bits.
//!
//! The checker applies them to every preset (`lmx check`); [`validate`] applies them to settings
//! chosen at run time (`lmx train --set`, a generated model's `Config::validate`), so that a value
//! is refused the same way wherever it comes from.

use crate::eval::{eval, Env, Value};
use crate::ir::CheckedModel;
use crate::report::report_values;
use crate::types::StaticTy;

/// Checks `settings` (a value for every setting of `model`'s `config`, derived values left out)
/// against the rules; the error is one message naming the setting or value at fault.
pub fn validate(model: &CheckedModel, settings: &Env) -> Result<(), String> {
    let values = evaluate(model, settings)?;
    check_values(model, "these settings", &values)
}

/// Checks the complete `values` of a configuration (settings and derived values) against the
/// rules that need more than evaluating it: finite floats, and the report's sizes, dropout
/// probabilities and totals. `config` names the configuration in an overflow ("preset `huge`").
pub(crate) fn check_values(model: &CheckedModel, config: &str, values: &Env) -> Result<(), String> {
    for item in &model.config {
        if let Some(Value::Float(x)) = values.get(&item.name) {
            if x.is_finite() {
                continue;
            }
            return Err(if item.derived {
                format!(
                    "`{} = {}` is {x}; a derived float must be a finite number",
                    item.name,
                    crate::text::expr_text(&item.value)
                )
            } else {
                format!(
                    "`{}` is {x}; a float setting must be a finite number",
                    item.name
                )
            });
        }
    }
    report_values(model, config, values, 1, None)
        .map(|_| ())
        .map_err(|err| err.to_string())
}

/// `settings` with the enum variants and derived values added, each derived value evaluated in
/// declaration order as the checker evaluates a preset's.
fn evaluate(model: &CheckedModel, settings: &Env) -> Result<Env, String> {
    let mut values = Env::new();
    for item in &model.config {
        if let StaticTy::Enum(variants) = &item.ty {
            for variant in variants {
                values.insert(variant.clone(), Value::Enum(variant.clone()));
            }
        }
    }
    for item in &model.config {
        let value = if item.derived {
            let value = eval(&item.value, &values).map_err(|d| {
                let detail = d
                    .labels
                    .first()
                    .map_or(String::new(), |l| format!(": {}", l.text));
                format!(
                    "`{} = {}` {}{detail}",
                    item.name,
                    crate::text::expr_text(&item.value),
                    reason(d.code)
                )
            })?;
            match (value, &item.ty) {
                (Value::Int(i), StaticTy::Float) => Value::Float(i as f64),
                (value, _) => value,
            }
        } else {
            match (settings.get(&item.name), &item.ty) {
                (Some(Value::Int(i)), StaticTy::Float) => Value::Float(*i as f64),
                (Some(value), _) => value.clone(),
                (None, _) => return Err(format!("no value for setting `{}`", item.name)),
            }
        };
        values.insert(item.name.clone(), value);
    }
    Ok(values)
}

/// What a failed evaluation did, by its diagnostic's code.
fn reason(code: &str) -> &'static str {
    match code {
        "lmx::config::inexact_division" => "does not divide exactly",
        "lmx::config::division_by_zero" => "divides by zero",
        "lmx::config::overflow" => "overflows a 64-bit integer",
        _ => "cannot be evaluated",
    }
}
