//! Training steps: a unit struct per `step` implementing `TrainingStep`, and `TrainState`.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::forward::{unsupported, Fx, Site, R};
use super::names::{camel, ident};
use super::Gen;
use crate::ast::{Expr, ExprKind, Step, StmtKind};
use crate::eval::{eval, Value};
use crate::ir::{OptimizerKind, SettingDefault, StepIr};

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

    // The loss: the statements before `grad(..)`, and the value `grad` differentiates.
    let mut loss_expr = None;
    let mut norm_name = None;
    let mut before = Vec::new();
    for s in &ast.body.stmts {
        if let Some(e) = find_call(s, "grad") {
            loss_expr = Some(e);
            if let StmtKind::Let(names, _) = &s.kind {
                if find_call(s, "clip_grad_norm").is_some() {
                    norm_name = names.get(1).map(|n| n.name.clone());
                }
            }
            break;
        }
        before.push(s.clone());
    }
    let loss_expr =
        loss_expr.ok_or_else(|| unsupported(ast.name.span, "a step without `grad(loss)`"))?;
    let loss_name = match &loss_expr.kind {
        ExprKind::Name(n) => Some(n.clone()),
        _ => None,
    };
    for (m, span) in ast
        .body
        .stmts
        .iter()
        .filter_map(|s| match &s.kind {
            StmtKind::Metrics(ms) => Some(ms.iter().map(move |m| (m.name.clone(), m.span))),
            _ => None,
        })
        .flatten()
    {
        if Some(&m) != loss_name.as_ref() && Some(&m) != norm_name.as_ref() {
            return Err(unsupported(
                span,
                "a metric other than the loss and the gradient norm",
            ));
        }
    }
    let mut fx = Fx::new(g, Site::Step, g.globals());
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
    let loss = fx.ok(loss);
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

            fn loss(params: &Params, #config: &Config, batch: &[Array], #key: Option<&Array>) -> Result<Array> {
                #context
                let [#(#names),*] = batch else {
                    return Err(Error::Layout(format!(#message, batch.len())));
                };
                #prelude
                #stmts
                #loss
            }
        }
    })
}

/// The first argument of the first call of `name` in a statement.
fn find_call(s: &crate::ast::Stmt, name: &str) -> Option<Expr> {
    fn walk(e: &Expr, name: &str) -> Option<Expr> {
        match &e.kind {
            ExprKind::Call(callee, args) => {
                if matches!(&callee.kind, ExprKind::Name(n) if n == name) {
                    return args.first().map(|a| a.value.clone());
                }
                args.iter().find_map(|a| walk(&a.value, name))
            }
            ExprKind::Binary(_, _, a, b) => walk(a, name).or_else(|| walk(b, name)),
            ExprKind::Unary(_, a) | ExprKind::Member(a, _) | ExprKind::Index(a, _) => walk(a, name),
            _ => None,
        }
    }
    match &s.kind {
        StmtKind::Let(_, e) | StmtKind::Assign(_, e) | StmtKind::Expr(e) => walk(e, name),
        // `update grad(loss)` applies the gradients as they are; an update of any other
        // expression of them (`update 0.5 * grad(loss)`) is not dropped to its `grad` here.
        StmtKind::Update(e) => match &e.kind {
            ExprKind::Call(callee, _) if matches!(&callee.kind, ExprKind::Name(n) if n == name) => {
                walk(e, name)
            }
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    fn model(update: &str) -> String {
        format!(
            "model M {{
                config {{ vocab: int = 16 }}
                params {{ wte: embedding(vocab, 8)
                          proj: linear(8, vocab) }}
                forward(tokens: [B, T] int) -> [B, T, vocab] {{ proj(wte(tokens)) }}
                step train(tokens: [B, T] int, targets: [B, T] int) {{
                    optimizer adamw()
                    let loss = cross_entropy(forward(tokens), targets)
                    {update}
                }}
            }}"
        )
    }

    fn generated(update: &str) -> Result<String, String> {
        let source = model(update);
        let model = crate::compile_str(&source).expect("checks");
        crate::codegen::generate(&model).map_err(|d| crate::render(&d, "m.lmx", &source))
    }

    #[test]
    fn update_of_grad_itself_compiles_as_through_a_let() {
        let direct = generated("update grad(loss)").expect("generates");
        let through_let = generated("let grads = grad(loss)\nupdate grads").expect("generates");
        assert_eq!(direct, through_let);
    }
}
