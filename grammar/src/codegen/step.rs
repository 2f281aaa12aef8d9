//! Training steps: a unit struct per `step` implementing `TrainingStep`, and `TrainState`.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::forward::{unsupported, Fx, Site, R};
use super::names::{camel, ident};
use super::Gen;
use crate::ast::{Expr, ExprKind, Step};
use crate::eval::{eval, Value};
use crate::ir::{FrozenSourceIr, OptimizerKind, SettingDefault, StateSlot, StepIr};

/// Every step's struct and impl, and `TrainState` for the first step.
pub(crate) fn steps(g: &Gen<'_>) -> R<TokenStream> {
    let mut out = TokenStream::new();
    for (i, (ir, ast)) in g.model.steps.iter().zip(&g.model.ast.steps).enumerate() {
        let name = format_ident!("{}", camel(&ir.name));
        out.extend(step(g, ir, ast)?);
        let state = if i == 0 {
            format_ident!("TrainState")
        } else {
            format_ident!("{}TrainState", camel(&ir.name))
        };
        let doc = format!(
            " Everything step `{}` reads and writes: parameters, optimizer state, step, key.",
            ir.name
        );
        out.extend(quote! {
            #[doc = #doc]
            pub type #state = ::lmx::runtime::state::TrainState<Params, <#name as TrainingStep>::Optimizer>;
        });
    }
    Ok(out)
}

/// The value of a step setting, evaluated in the declared defaults.
fn evaluate(g: &Gen<'_>, e: &Expr) -> Option<Value> {
    let env = g
        .model
        .preset("default")
        .map(|p| p.values.clone())
        .unwrap_or_default();
    eval(e, &env).ok()
}

/// A numeric step setting: a finite number within `f32`'s range.
fn value(g: &Gen<'_>, e: &Expr) -> R<f64> {
    let x = match evaluate(g, e) {
        Some(Value::Int(i)) => i as f64,
        Some(Value::Float(x)) => x,
        _ => return Err(unsupported(e.span, "a step setting that is not a number")),
    };
    if !x.is_finite() || x.abs() > f64::from(f32::MAX) {
        return Err(unsupported(e.span, "a step setting beyond f32's range"));
    }
    Ok(x)
}

/// An optimizer flag.
fn flag_value(g: &Gen<'_>, e: &Expr) -> R<bool> {
    match evaluate(g, e) {
        Some(Value::Bool(b)) => Ok(b),
        _ => Err(unsupported(
            e.span,
            "an optimizer flag that is not true or false",
        )),
    }
}

/// `x` as an `f32` literal, written the shortest way that reads back the same (`1e-30`, `0.9`).
fn f32_lit(x: f64) -> TokenStream {
    format!("{:?}", x as f32)
        .parse()
        .expect("a float's Debug form is a Rust literal")
}

fn step(g: &Gen<'_>, ir: &StepIr, ast: &Step) -> R<TokenStream> {
    let name = format_ident!("{}", camel(&ir.name));
    let model = format_ident!("{}", g.model.name);
    let given = |n: &str| {
        ir.optimizer
            .args
            .iter()
            .find(|(a, _)| a == n)
            .map(|(_, e)| e)
    };
    let default = |n: &str| {
        ir.optimizer
            .kind
            .hyper_parameters()
            .iter()
            .find(|(a, _)| *a == n)
            .map_or(SettingDefault::Unset, |(_, d)| *d)
    };
    let hyper = |n: &str| -> R<TokenStream> {
        match (given(n), default(n)) {
            (Some(e), _) => Ok(f32_lit(value(g, e)?)),
            (None, SettingDefault::Float(d)) => Ok(f32_lit(d)),
            (None, _) => Ok(f32_lit(0.0)),
        }
    };
    let flag = |n: &str| -> R<TokenStream> {
        let on = match (given(n), default(n)) {
            (Some(e), _) => flag_value(g, e)?,
            (None, SettingDefault::Bool(d)) => d,
            (None, _) => false,
        };
        Ok(quote!(#on))
    };
    let optional = |n: &str| -> R<TokenStream> {
        Ok(match given(n) {
            Some(e) => {
                let x = f32_lit(value(g, e)?);
                quote!(Some(#x))
            }
            None => quote!(None),
        })
    };
    let (opt_ty, opt_value) = match ir.optimizer.kind {
        OptimizerKind::Sgd => {
            let (m, wd) = (hyper("momentum")?, hyper("weight_decay")?);
            (
                quote!(optim::Sgd),
                quote!(optim::Sgd { momentum: #m, weight_decay: #wd, ..optim::Sgd::default() }),
            )
        }
        OptimizerKind::Adam => {
            let (b1, b2, eps) = (hyper("beta1")?, hyper("beta2")?, hyper("eps")?);
            (
                quote!(optim::Adam),
                quote!(optim::Adam { beta1: #b1, beta2: #b2, eps: #eps, bias_correction: false }),
            )
        }
        OptimizerKind::AdamW => {
            let (b1, b2, eps, wd) = (
                hyper("beta1")?,
                hyper("beta2")?,
                hyper("eps")?,
                hyper("weight_decay")?,
            );
            (
                quote!(optim::AdamW),
                quote!(optim::AdamW {
                    adam: optim::Adam { beta1: #b1, beta2: #b2, eps: #eps, bias_correction: false },
                    weight_decay: #wd,
                }),
            )
        }
        OptimizerKind::Lion => {
            let (b1, b2, wd) = (hyper("beta1")?, hyper("beta2")?, hyper("weight_decay")?);
            (
                quote!(optim::Lion),
                quote!(optim::Lion { beta1: #b1, beta2: #b2, weight_decay: #wd }),
            )
        }
        OptimizerKind::Adafactor => {
            let (eps_square, eps_scale) = (hyper("eps_square")?, hyper("eps_scale")?);
            let (clip, decay, wd) = (
                hyper("clip_threshold")?,
                hyper("decay_rate")?,
                hyper("weight_decay")?,
            );
            let beta1 = optional("beta1")?;
            let (scale, relative, warmup) = (
                flag("scale_parameter")?,
                flag("relative_step")?,
                flag("warmup_init")?,
            );
            (
                quote!(optim::Adafactor),
                quote!(optim::Adafactor {
                    eps_square: #eps_square,
                    eps_scale: #eps_scale,
                    clip_threshold: #clip,
                    decay_rate: #decay,
                    beta1: #beta1,
                    weight_decay: #wd,
                    scale_parameter: #scale,
                    relative_step: #relative,
                    warmup_init: #warmup,
                }),
            )
        }
    };
    let accumulation = value(g, &ir.accumulate)?;
    if accumulation < 1.0 || accumulation.fract() != 0.0 {
        return Err(unsupported(ir.accumulate.span, "this accumulation count"));
    }
    let accumulation = Literal::usize_unsuffixed(accumulation as usize);
    let clip = match &ir.clip {
        Some(e) => {
            let c = f32_lit(value(g, e)?);
            quote!(Some(#c))
        }
        None => quote!(None),
    };

    // The loss: the statements before the one holding `grad(..)`, and the value it
    // differentiates; the checker found both and sorted the metrics into loss and norm.
    let Some((grad_call, loss_expr)) = ir.loss.clone() else {
        return Err(unsupported(ast.name.span, "a step without `grad(loss)`"));
    };
    let before: Vec<_> = ast
        .body
        .stmts
        .iter()
        .take_while(|s| !(s.span.start <= grad_call.start && grad_call.end <= s.span.end))
        .cloned()
        .collect();
    let mut fx = Fx::new(g, Site::Step, g.globals());
    fx.frozen = ir
        .frozen
        .iter()
        .map(|f| (f.name.clone(), fx.temp(&f.name)))
        .collect();
    let inputs: Vec<(String, Vec<Expr>)> = ast
        .inputs
        .iter()
        .map(|i| (i.name.name.clone(), i.ty.shape.clone()))
        .collect();
    let names: Vec<_> = inputs.iter().map(|(n, _)| ident(n)).collect();
    let body = crate::ast::Body {
        stmts: before,
        span: ast.body.span,
    };
    let (prelude, _) = fx.inputs_of(&inputs, &body)?;
    fx.stmts(&body)?;
    let loss = fx.expr(&loss_expr)?;
    let loss = fx.owned_tensor(loss, loss_expr.span)?;
    // The step's own metrics, returned after the loss (the checker found each computed before
    // `grad(..)`, so each is a name in scope here).
    let mut reported = Vec::new();
    for name in &ir.reported {
        let name = Expr {
            kind: ExprKind::Name(name.clone()),
            span: grad_call,
        };
        let value = fx.expr(&name)?;
        reported.push(fx.owned_tensor(value, grad_call)?);
    }
    // A step whose forward passes write buffers returns every buffer's next value after the
    // metrics (the writes are keyed by the leaves of `params`, which its passes read).
    let writes = ir.state.contains(&StateSlot::Buffers);
    let loss = if writes {
        let values = match &fx.step_ctx {
            Some(name) => {
                let name = ident(name);
                quote!(#name.buffer_values(params, |leaf: &Array| leaf.clone())?)
            }
            None => {
                quote!(Context::evaluation().buffer_values(params, |leaf: &Array| leaf.clone())?)
            }
        };
        quote! {
            let mut values = vec![#loss, #(#reported),*];
            values.extend(#values);
            Ok(values)
        }
    } else if ir.reported.is_empty() {
        fx.ok(loss)
    } else {
        quote!(Ok(vec![#loss, #(#reported),*]))
    };
    let stmts = super::forward::render(fx.bodies.pop().unwrap_or_default());
    // One context for every `forward(..)` of the step, so that each dropout draws a new mask.
    let (key, context) = match &fx.step_ctx {
        Some(name) => {
            let name = ident(name);
            (
                format_ident!("key"),
                quote!(let mut #name = Context::for_step(key);),
            )
        }
        None => (format_ident!("_key"), TokenStream::new()),
    };
    let config = if fx.uses_config {
        quote!(config)
    } else {
        quote!(_config)
    };
    let count = names.len();
    let step_name = &ir.name;
    let message = format!("step `{step_name}` takes {count} inputs, got {{}}");
    let doc = format!(" The training step `{step_name}` of `{}`.", g.model.name);
    let body = quote! {
        #context
        let [#(#names),*] = batch else {
            return Err(Error::Layout(format!(#message, batch.len())));
        };
        #prelude
        #stmts
        #loss
    };
    let declared = ir.frozen.iter().map(|f| {
        let name = &f.name;
        let source = match f.source {
            FrozenSourceIr::Policy => quote!(::lmx::runtime::model::FrozenSource::Policy),
        };
        quote!(::lmx::runtime::model::Frozen { name: #name, source: #source })
    });
    let locals: Vec<_> = fx.frozen.iter().map(|(_, local)| ident(local)).collect();
    let n_frozen = locals.len();
    let frozen_message = format!("step `{step_name}` declares {n_frozen} frozen models, got {{}}");
    let frozen_arg = if locals.is_empty() {
        quote!(_frozen)
    } else {
        quote!(frozen)
    };
    let take_frozen = (!locals.is_empty()).then(|| {
        quote! {
            let [#(#locals),*] = frozen else {
                return Err(Error::Layout(format!(#frozen_message, frozen.len())));
            };
        }
    });
    // The one function holding the body; the others call it.
    let values_fn = !ir.reported.is_empty() || writes;
    let (body_fn, returns) = match (ir.frozen.is_empty(), !values_fn) {
        (true, true) => (quote!(loss), quote!(Array)),
        (false, true) => (quote!(frozen_loss), quote!(Array)),
        (_, false) => (quote!(loss_and_metrics), quote!(Vec<Array>)),
    };
    let body_signature = if ir.frozen.is_empty() && !values_fn {
        quote!((params: &Params, #config: &Config, batch: &[Array], #key: Option<&Array>))
    } else {
        quote!((params: &Params, #config: &Config, #frozen_arg: &[Params], batch: &[Array], #key: Option<&Array>))
    };
    let mut loss_fns = quote! {
        fn #body_fn #body_signature -> Result<#returns> {
            #take_frozen
            #body
        }
    };
    if values_fn {
        let names = &ir.reported;
        if !names.is_empty() {
            loss_fns.extend(quote! {
                const METRICS: &'static [&'static str] = &[#(#names),*];
            });
        }
        if writes {
            loss_fns.extend(quote! {
                const WRITES_BUFFERS: bool = true;
            });
        }
        // The loss alone is the first value (validation reads it so; MLX computes nothing of
        // the metrics nobody evaluates).
        loss_fns.extend(if ir.frozen.is_empty() {
            quote! {
                fn loss(params: &Params, config: &Config, batch: &[Array], key: Option<&Array>) -> Result<Array> {
                    Ok(Self::loss_and_metrics(params, config, &[], batch, key)?.swap_remove(0))
                }
            }
        } else {
            quote! {
                fn frozen_loss(params: &Params, config: &Config, frozen: &[Params], batch: &[Array], key: Option<&Array>) -> Result<Array> {
                    Ok(Self::loss_and_metrics(params, config, frozen, batch, key)?.swap_remove(0))
                }
            }
        });
    }
    if let Some(first) = ir.frozen.first() {
        let first = &first.name;
        loss_fns.extend(quote! {
            const FROZEN: &'static [::lmx::runtime::model::Frozen] = &[#(#declared),*];

            fn loss(_params: &Params, _config: &Config, _batch: &[Array], _key: Option<&Array>) -> Result<Array> {
                Err(Error::FrozenModelsMissing { step: #step_name, name: #first })
            }
        });
    }
    Ok(quote! {
        #[doc = #doc]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct #name;

        impl TrainingStep for #name {
            type Model = #model;
            type Optimizer = #opt_ty;

            const NAME: &'static str = #step_name;

            fn optimizer() -> #opt_ty {
                #opt_value
            }

            fn options() -> StepOptions {
                StepOptions { clip_norm: #clip, compile: true, accumulation: #accumulation, ..StepOptions::default() }
            }

            #loss_fns
        }
    })
}
