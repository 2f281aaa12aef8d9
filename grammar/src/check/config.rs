//! `config { }` and `preset { }`: types, symbolic sizes, and every preset's values.

use std::collections::{HashMap, HashSet};

use super::exprs::article;
use super::{Checker, Context};
use crate::ast::{ConfigEntry, StaticType};
use crate::diag::Diagnostic;
use crate::dim::Dim;
use crate::eval::{eval, Env, Value};
use crate::ir::{ConfigItem, PresetValues};
use crate::span::Span;
use crate::types::{StaticTy, Ty};

/// The checker's type for a declared static type.
pub(crate) fn static_ty(t: &StaticType) -> StaticTy {
    match t {
        StaticType::Int => StaticTy::Int(None),
        StaticType::Float => StaticTy::Float,
        StaticType::Bool => StaticTy::Bool,
        StaticType::Str => StaticTy::Str,
        StaticType::Enum(vs) => StaticTy::Enum(vs.iter().map(|v| v.name.clone()).collect()),
    }
}

/// Whether a value has a static type.
fn value_fits(v: &Value, t: &StaticTy) -> bool {
    match (v, t) {
        (Value::Int(_), StaticTy::Int(_) | StaticTy::Float) => true,
        (Value::Float(_), StaticTy::Float) => true,
        (Value::Bool(_), StaticTy::Bool) | (Value::Str(_), StaticTy::Str) => true,
        (Value::Enum(e), StaticTy::Enum(vs)) => vs.contains(e),
        _ => false,
    }
}

impl Checker<'_> {
    /// Checks the configuration and makes its names visible everywhere.
    pub(crate) fn check_config(&mut self) -> Vec<ConfigItem> {
        let mut items = Vec::new();
        self.globals.push();
        for entry in &self.model.config {
            let name = entry.name();
            let reported = self.diagnostics.len();
            if let Some(prev) = self.globals.get(&name.name) {
                let prev = prev.span;
                self.error(
                    Diagnostic::new(
                        "lmx::name::duplicate",
                        format!("`{}` is declared twice", name.name),
                        name.span,
                        "declared again here",
                    )
                    .with_label(prev, "first declared here"),
                );
                continue;
            }
            let (ty, value, derived) = match entry {
                ConfigEntry::Setting { ty, default, .. } => {
                    let declared = static_ty(ty);
                    if let StaticTy::Enum(variants) = &declared {
                        self.bind_variants(ty, variants);
                    }
                    let mut scope = self.globals.clone();
                    let found = self.infer(default, &mut scope, Context::Forward);
                    self.expect_static(&found, &declared, default.span, "a config default");
                    let ty = match declared {
                        StaticTy::Int(_) => StaticTy::Int(Some(Dim::symbol(&name.name))),
                        other => other,
                    };
                    (ty, default.clone(), false)
                }
                ConfigEntry::Derived { value, .. } => {
                    let mut scope = self.globals.clone();
                    let ty = match self.infer(value, &mut scope, Context::Forward) {
                        Ty::Static(StaticTy::Int(Some(d))) => {
                            StaticTy::Int(Some(d.named(&name.name)))
                        }
                        Ty::Static(StaticTy::Int(None)) => {
                            StaticTy::Int(Some(Dim::symbol(&name.name)))
                        }
                        Ty::Static(s) => s,
                        Ty::Unknown => StaticTy::Int(None),
                        other => {
                            self.expect_static(
                                &other,
                                &StaticTy::Int(None),
                                value.span,
                                "a derived value",
                            );
                            StaticTy::Int(None)
                        }
                    };
                    (ty, value.clone(), true)
                }
            };
            if self.diagnostics.len() > reported {
                self.config_errors.insert(name.name.clone());
            }
            self.globals
                .bind(&name.name, Ty::Static(ty.clone()), name.span);
            items.push(ConfigItem {
                name: name.name.clone(),
                ty,
                derived,
                value,
            });
        }
        items
    }

    fn bind_variants(&mut self, ty: &StaticType, variants: &[String]) {
        let StaticType::Enum(idents) = ty else { return };
        for v in idents {
            if self.globals.get(&v.name).is_none() {
                self.globals.bind(
                    &v.name,
                    Ty::Static(StaticTy::Enum(variants.to_vec())),
                    v.span,
                );
            }
        }
    }

    /// Evaluates the defaults and every preset; reports inexact divisions and bad overrides.
    pub(crate) fn evaluate_presets(&mut self, items: &[ConfigItem]) -> Vec<PresetValues> {
        let mut seen: HashSet<&str> = HashSet::new();
        let mut out = vec![self.evaluate_preset("default", &[], self.model.header, items)];
        let model = self.model;
        for preset in &model.presets {
            if !seen.insert(&preset.name.name) || preset.name.name == "default" {
                self.error(Diagnostic::new(
                    "lmx::config::duplicate_preset",
                    format!("preset `{}` is declared twice", preset.name.name),
                    preset.name.span,
                    "this name is already taken",
                ));
                continue;
            }
            let mut set: HashMap<&str, Span> = HashMap::new();
            let reported = self.diagnostics.len();
            for (key, value) in &preset.overrides {
                if let Some(first) = set.insert(&key.name, key.span) {
                    self.error(
                        Diagnostic::new(
                            "lmx::name::duplicate",
                            format!("preset `{}` sets `{}` twice", preset.name.name, key.name),
                            key.span,
                            "set again here",
                        )
                        .with_label(first, "first set here"),
                    );
                    continue;
                }
                self.override_is_static(value);
                match items.iter().find(|i| i.name == key.name) {
                    None => {
                        let mut d = Diagnostic::new(
                            "lmx::config::unknown_setting",
                            format!(
                                "preset `{}` sets `{}`, which is not a setting",
                                preset.name.name, key.name
                            ),
                            key.span,
                            "no such setting in `config`",
                        );
                        if let Some(s) = super::suggest::closest(
                            &key.name,
                            items.iter().map(|i| i.name.as_str()),
                        ) {
                            d = d.with_help(format!("did you mean `{s}`?"));
                        }
                        self.error(d);
                    }
                    Some(item) if item.derived => self.error(
                        Diagnostic::new(
                            "lmx::config::derived_override",
                            format!("`{}` is derived and cannot be set by a preset", key.name),
                            key.span,
                            "set here",
                        )
                        .with_label(item.value.span, "computed from this expression")
                        .with_help("set the settings it is computed from instead"),
                    ),
                    Some(_) => {}
                }
            }
            // A preset whose settings were reported is not evaluated: its values are not the
            // ones meant, and what they break would only repeat the mistake.
            if self.diagnostics.len() > reported {
                out.push(PresetValues {
                    name: preset.name.name.clone(),
                    values: Env::new(),
                });
                continue;
            }
            out.push(self.evaluate_preset(
                &preset.name.name,
                &preset.overrides,
                preset.name.span,
                items,
            ));
        }
        out
    }

    /// Checks a preset's value as a config default is checked: its names exist, it is not a
    /// tensor.
    fn override_is_static(&mut self, value: &crate::ast::Expr) {
        let mut scope = self.globals.clone();
        let found = self.infer(value, &mut scope, Context::Forward);
        if let Ty::Tensor(t) = &found {
            self.error(
                Diagnostic::new(
                    "lmx::kind::expected_static",
                    "a preset value must be static, found a tensor",
                    value.span,
                    format!("this is a tensor of shape {}", t.shape_text()),
                )
                .with_help("a preset sets sizes and settings, fixed when the model is built"),
            );
        }
    }

    /// Evaluates the settings and derived values of one preset. Each failure is reported once, where its cause is: an override at its value, a
    /// default or derived value in the defaults (or in the first preset where only it fails);
    /// what depends on a failed value is left out rather than reported again.
    fn evaluate_preset(
        &mut self,
        name: &str,
        overrides: &[(crate::ast::Ident, crate::ast::Expr)],
        at: Span,
        items: &[ConfigItem],
    ) -> PresetValues {
        let mut env = Env::new();
        for entry in &self.model.config {
            if let ConfigEntry::Setting {
                ty: StaticType::Enum(vs),
                ..
            } = entry
            {
                for v in vs {
                    env.insert(v.name.clone(), Value::Enum(v.name.clone()));
                }
            }
        }
        let context = if name == "default" {
            "with the default values".to_string()
        } else {
            format!("with preset `{name}`")
        };
        for item in items {
            let given = overrides
                .iter()
                .find(|(k, _)| k.name == item.name && !item.derived)
                .map(|(_, e)| e);
            let expr = given.unwrap_or(&item.value);
            match eval(expr, &env) {
                Ok(v) if value_fits(&v, &item.ty) => {
                    let v = match (v, &item.ty) {
                        (Value::Int(i), StaticTy::Float) => Value::Float(i as f64),
                        (v, _) => v,
                    };
                    env.insert(item.name.clone(), v);
                }
                Ok(v) => {
                    if given.is_some() || !self.config_errors.contains(&item.name) {
                        self.error(Diagnostic::new(
                            "lmx::config::type",
                            format!(
                                "`{}` is {}, but this is {v}",
                                item.name,
                                article(item.ty.name())
                            ),
                            expr.span,
                            format!("expected {}", article(item.ty.name())),
                        ));
                    }
                    break;
                }
                Err(d)
                    if matches!(
                        d.code,
                        "lmx::config::inexact_division"
                            | "lmx::config::division_by_zero"
                            | "lmx::config::overflow"
                    ) =>
                {
                    self.error(d.with_label(at, context.clone()));
                    break;
                }
                Err(d) => {
                    let own_cause = given.is_some()
                        || (!self.config_errors.contains(&item.name)
                            && (name == "default" || !self.default_failures.contains(&item.name)));
                    if own_cause {
                        self.error(d.with_label(at, context.clone()));
                    }
                    if name == "default" {
                        self.default_failures.insert(item.name.clone());
                    }
                    break;
                }
            }
        }
        PresetValues {
            name: name.to_string(),
            values: env,
        }
    }
}
