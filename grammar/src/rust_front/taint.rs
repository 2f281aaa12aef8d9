//! The rule every step obeys: control flow never depends on a tensor's value.
//!
//! A compiled step is traced once; a branch on a tensor's value would either read the tensor to
//! the host (a synchronisation, and a graph that silently stops depending on later values) or not
//! compile at all. [`check`] follows, through `let` bindings, which local values are derived from
//! tensors, and reports every `if`, `while`, `match`, `&&`/`||`, comparison, `?` on a host
//! conversion, early `return` (`let ... else`) and assertion that depends on one, at the user's
//! own tokens, with the graph form to use instead. Values derived from a tensor's static
//! structure (`shape()`, `len()`, `is_some()`, ...) and from the step's configuration stay free.

use quote::ToTokens;
use std::collections::HashMap;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{BinOp, Block, Expr, Ident, Local, Pat, Token};

/// The hint that ends every branch diagnostic.
pub const WHERE_HINT: &str = "compute both sides and select in the graph: `where_(cond, a, b)`";

/// The hint for values read to the host.
pub const RETURN_HINT: &str =
    "keep it in the graph; to see it, return it from the step (as the loss or a metric) and read it after the step";

/// Methods that read a value's static structure, never its data.
const STATIC_METHODS: &[&str] = &[
    "shape", "ndim", "dim", "dtype", "size", "nbytes", "len", "is_empty", "is_some", "is_none",
];

/// Methods that read a tensor's data to the host (or leave the graph).
const HOST_READS: &[&str] = &[
    "item",
    "try_item",
    "item_exact",
    "try_item_exact",
    "item_cast",
    "try_item_cast",
    "eq_values",
    "as_slice",
    "try_as_slice",
    "to_vec",
    "into_array",
    "as_array",
    "eval",
    "try_into",
    "to_string",
];

const ASSERTIONS: &[&str] = &[
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
];
const FORMATTERS: &[&str] = &[
    "println", "print", "eprintln", "eprint", "format", "write", "writeln", "panic",
];

/// Checks `body`, in which the names `tensors` hold tensors; returns every violation.
pub fn check(tensors: &[Ident], body: &Block) -> Vec<syn::Error> {
    let mut checker = Checker {
        scopes: vec![HashMap::new()],
        errors: Vec::new(),
    };
    for ident in tensors {
        checker.bind(ident, Some(Origin::Tensor(ident.to_string())));
    }
    checker.visit_block(body);
    checker.errors
}

/// Why a local is tensor-derived.
#[derive(Clone, Debug)]
enum Origin {
    /// It holds tensors (a step argument).
    Tensor(String),
    /// It was computed from the tensor (first field) and bound to this name (second field).
    Derived(String, String),
}

impl Origin {
    fn tensor(&self) -> &str {
        match self {
            Origin::Tensor(name) | Origin::Derived(name, _) => name,
        }
    }

    /// How a diagnostic names the value: "the tensor `x`" or "`big` (computed from the tensor `x`)".
    fn describe(&self) -> String {
        match self {
            Origin::Tensor(name) => format!("the tensor `{name}`"),
            Origin::Derived(tensor, local) => {
                format!("`{local}` (computed from the tensor `{tensor}`)")
            }
        }
    }

    fn derive(&self, local: &Ident) -> Origin {
        Origin::Derived(self.tensor().to_owned(), local.to_string())
    }
}

struct Checker {
    /// Innermost last: each name is tensor-derived (`Some`) or not (`None`, shadowing).
    scopes: Vec<HashMap<String, Option<Origin>>>,
    errors: Vec<syn::Error>,
}

impl Checker {
    fn bind(&mut self, ident: &Ident, origin: Option<Origin>) {
        self.scopes
            .last_mut()
            .expect("a scope")
            .insert(ident.to_string(), origin);
    }

    fn lookup(&self, name: &str) -> Option<&Origin> {
        self.scopes
            .iter()
            .rev()
            .find_map(|scope| scope.get(name))
            .and_then(Option::as_ref)
    }

    /// The tensor-derived value `expr` reads, if any.
    fn taint(&self, expr: &Expr) -> Option<Origin> {
        let mut finder = Taint {
            checker: self,
            found: None,
        };
        finder.visit_expr(expr);
        finder.found
    }

    /// Binds every name of `pat`, tensor-derived when `origin` is.
    fn bind_pattern(&mut self, pat: &Pat, origin: Option<&Origin>) {
        let mut names = Vec::new();
        collect_bindings(pat, &mut names);
        for ident in names {
            self.bind(&ident, origin.map(|origin| origin.derive(&ident)));
        }
    }

    /// An error over all of `tokens`.
    fn error(&mut self, tokens: &impl ToTokens, message: String) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    fn branch_error(&mut self, what: &str, tokens: &impl ToTokens, origin: &Origin) {
        self.error(
            tokens,
            format!(
                "{what} depends on {}: a compiled step never reads a tensor's value\nhelp: {WHERE_HINT}",
                origin.describe()
            ),
        );
    }

    /// Checks a condition (`if`, `while`, a guard, an assertion): a tensor-derived condition is an
    /// error; `&&` and `||` are checked operand by operand.
    fn condition(&mut self, what: &str, cond: &Expr) {
        if let Expr::Binary(binary) = cond {
            if matches!(binary.op, BinOp::And(_) | BinOp::Or(_)) {
                self.logic(binary);
                return;
            }
        }
        match self.taint(cond) {
            Some(origin) => self.branch_error(what, cond, &origin),
            None => self.visit_expr(cond),
        }
    }

    fn logic(&mut self, binary: &syn::ExprBinary) {
        let op = match binary.op {
            BinOp::And(_) => "&&",
            _ => "||",
        };
        for operand in [&*binary.left, &*binary.right] {
            if let Expr::Binary(inner) = operand {
                if matches!(inner.op, BinOp::And(_) | BinOp::Or(_)) {
                    self.logic(inner);
                    continue;
                }
            }
            match self.taint(operand) {
                Some(origin) => self.branch_error(
                    &format!("this operand of `{op}` (which short-circuits)"),
                    operand,
                    &origin,
                ),
                None => self.visit_expr(operand),
            }
        }
    }

    /// A scrutinee may be a tensor-holding place (`&params.bias`): matching its structure is
    /// static. Anything computed from a tensor is not.
    fn scrutinee(&mut self, what: &str, expr: &Expr) -> Option<Origin> {
        let origin = self.taint(expr)?;
        if is_place(expr) {
            return Some(origin);
        }
        self.branch_error(what, expr, &origin);
        None
    }

    fn scoped(&mut self, f: impl FnOnce(&mut Self)) {
        self.scopes.push(HashMap::new());
        f(self);
        self.scopes.pop();
    }

    fn macro_args(&mut self, mac: &syn::Macro) {
        let Some(name) = mac.path.get_ident().map(Ident::to_string) else {
            return;
        };
        let Ok(args) = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(mac.tokens.clone())
        else {
            return;
        };
        if ASSERTIONS.contains(&name.as_str()) {
            let what = format!("`{name}!`");
            if name.ends_with("_eq") || name.ends_with("_ne") {
                let pair = args
                    .iter()
                    .take(2)
                    .find_map(|arg| self.taint(arg).map(|o| (arg.clone(), o)));
                match pair {
                    Some((arg, origin)) => self.branch_error(&what, &arg, &origin),
                    None => args.iter().for_each(|arg| self.visit_expr(arg)),
                }
            } else if let Some(cond) = args.first() {
                self.condition(&what, cond);
            }
        } else if FORMATTERS.contains(&name.as_str()) {
            for arg in &args {
                match self.taint(arg) {
                    Some(origin) => self.error(
                        arg,
                        format!(
                            "`{name}!` formats {}: a compiled step never reads a tensor's value\nhelp: {RETURN_HINT}",
                            origin.describe()
                        ),
                    ),
                    None => self.visit_expr(arg),
                }
            }
        } else {
            args.iter().for_each(|arg| self.visit_expr(arg));
        }
    }
}

impl<'ast> Visit<'ast> for Checker {
    fn visit_block(&mut self, block: &'ast Block) {
        self.scoped(|this| visit::visit_block(this, block));
    }

    fn visit_local(&mut self, local: &'ast Local) {
        let origin = local.init.as_ref().and_then(|init| {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                if let Some(origin) = self.taint(&init.expr) {
                    self.branch_error("this early `return` (`let ... else`)", &local.pat, &origin);
                }
                self.visit_expr(diverge);
            }
            self.taint(&init.expr)
        });
        self.bind_pattern(&local.pat, origin.as_ref());
    }

    fn visit_expr_if(&mut self, expr: &'ast syn::ExprIf) {
        self.scoped(|this| {
            if let Expr::Let(binding) = &*expr.cond {
                let origin = this.scrutinee("this `if let`", &binding.expr);
                this.bind_pattern(&binding.pat, origin.as_ref());
            } else {
                this.condition("this `if`", &expr.cond);
            }
            this.visit_block(&expr.then_branch);
        });
        if let Some((_, else_branch)) = &expr.else_branch {
            self.visit_expr(else_branch);
        }
    }

    fn visit_expr_while(&mut self, expr: &'ast syn::ExprWhile) {
        self.scoped(|this| {
            if let Expr::Let(binding) = &*expr.cond {
                let origin = this.scrutinee("this `while let`", &binding.expr);
                this.bind_pattern(&binding.pat, origin.as_ref());
            } else {
                this.condition("this `while`", &expr.cond);
            }
            this.visit_block(&expr.body);
        });
    }

    fn visit_expr_match(&mut self, expr: &'ast syn::ExprMatch) {
        let origin = self.scrutinee("this `match`", &expr.expr);
        for arm in &expr.arms {
            self.scoped(|this| {
                this.bind_pattern(&arm.pat, origin.as_ref());
                if let Some((_, guard)) = &arm.guard {
                    this.condition("this `match` guard", guard);
                }
                this.visit_expr(&arm.body);
            });
        }
    }

    fn visit_expr_for_loop(&mut self, expr: &'ast syn::ExprForLoop) {
        self.visit_expr(&expr.expr);
        let origin = self.taint(&expr.expr);
        self.scoped(|this| {
            match (&*expr.pat, &*expr.expr) {
                // `for (index, item) in items.iter().enumerate()`: the index is static.
                (Pat::Tuple(tuple), Expr::MethodCall(call))
                    if call.method == "enumerate" && tuple.elems.len() == 2 =>
                {
                    this.bind_pattern(&tuple.elems[0], None);
                    this.bind_pattern(&tuple.elems[1], origin.as_ref());
                }
                (pat, _) => this.bind_pattern(pat, origin.as_ref()),
            }
            this.visit_block(&expr.body);
        });
    }

    fn visit_expr_binary(&mut self, expr: &'ast syn::ExprBinary) {
        match expr.op {
            BinOp::And(_) | BinOp::Or(_) => self.logic(expr),
            BinOp::Lt(_)
            | BinOp::Le(_)
            | BinOp::Gt(_)
            | BinOp::Ge(_)
            | BinOp::Eq(_)
            | BinOp::Ne(_) => match self.taint(&expr.left).or_else(|| self.taint(&expr.right)) {
                Some(origin) => {
                    let op = &expr.op;
                    self.error(
                            expr,
                            format!(
                                "`{}` compares {} on the host: a compiled step never reads a tensor's value\nhelp: compare in the graph (`gt`, `lt`, `ge`, `le`, `eq` give a mask), then {WHERE_HINT}",
                                quote::quote!(#op),
                                origin.describe()
                            ),
                        );
                }
                None => visit::visit_expr_binary(self, expr),
            },
            _ => visit::visit_expr_binary(self, expr),
        }
    }

    fn visit_expr_try(&mut self, expr: &'ast syn::ExprTry) {
        if let Expr::MethodCall(call) = &*expr.expr {
            if HOST_READS.contains(&call.method.to_string().as_str()) {
                if let Some(origin) = self.taint(&call.receiver) {
                    self.branch_error(&format!("this `?` on `{}`", call.method), expr, &origin);
                    return;
                }
            }
        }
        visit::visit_expr_try(self, expr);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if HOST_READS.contains(&call.method.to_string().as_str()) {
            if let Some(origin) = self.taint(&call.receiver) {
                self.error(
                    &call.method,
                    format!(
                        "`{}` reads {} on the host: a compiled step never reads a tensor's value\nhelp: {RETURN_HINT}",
                        call.method,
                        origin.describe()
                    ),
                );
                return;
            }
        }
        self.visit_expr(&call.receiver);
        let receiver = self.taint(&call.receiver);
        for arg in &call.args {
            match arg {
                // `items.iter().map(|item| ...)`: the closure's arguments come from the receiver.
                Expr::Closure(closure) => self.closure(closure, receiver.as_ref()),
                _ => self.visit_expr(arg),
            }
        }
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        self.closure(closure, None);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.macro_args(mac);
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {
        // Items nested in a step are checked where they are used: a call that passes a tensor.
    }
}

impl Checker {
    fn closure(&mut self, closure: &syn::ExprClosure, inputs: Option<&Origin>) {
        self.scoped(|this| {
            for input in &closure.inputs {
                this.bind_pattern(input, inputs);
            }
            this.visit_expr(&closure.body);
        });
    }
}

/// Finds the first tensor-derived local an expression reads.
struct Taint<'c> {
    checker: &'c Checker,
    found: Option<Origin>,
}

impl<'ast> Visit<'ast> for Taint<'_> {
    fn visit_expr(&mut self, expr: &'ast Expr) {
        if self.found.is_none() {
            visit::visit_expr(self, expr);
        }
    }

    fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
        if let Some(ident) = path.path.get_ident() {
            if let Some(origin) = self.checker.lookup(&ident.to_string()) {
                self.found = Some(origin.clone());
            }
        }
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if !STATIC_METHODS.contains(&call.method.to_string().as_str()) {
            visit::visit_expr_method_call(self, call);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Ok(args) = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(mac.tokens.clone())
        {
            args.iter().for_each(|arg| self.visit_expr(arg));
        }
    }
}

/// A place expression: a local, a field of one, a reference to one.
fn is_place(expr: &Expr) -> bool {
    match expr {
        Expr::Path(_) => true,
        Expr::Field(field) => is_place(&field.base),
        Expr::Reference(reference) => is_place(&reference.expr),
        Expr::Paren(paren) => is_place(&paren.expr),
        _ => false,
    }
}

fn collect_bindings(pat: &Pat, out: &mut Vec<Ident>) {
    struct Bindings<'a>(&'a mut Vec<Ident>);
    impl<'ast> Visit<'ast> for Bindings<'_> {
        fn visit_pat_ident(&mut self, pat: &'ast syn::PatIdent) {
            self.0.push(pat.ident.clone());
            visit::visit_pat_ident(self, pat);
        }
    }
    Bindings(out).visit_pat(pat);
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::format_ident;

    fn errors(body: &str) -> Vec<String> {
        let block: Block = syn::parse_str(&format!("{{ {body} }}")).unwrap();
        let tensors = [format_ident!("params"), format_ident!("x")];
        check(&tensors, &block)
            .into_iter()
            .map(|err| err.to_string())
            .collect()
    }

    #[test]
    fn static_control_flow_is_free() {
        let body = "
            let mut h = x.clone();
            for (i, layer) in params.layers.iter().enumerate() {
                if i == 0 && config.flag { h = linear(&layer.proj, &h)?; }
            }
            if let Some(bias) = &params.bias { h = h.add(bias)?; }
            match config.kind { Kind::A => {}, _ => {} }
            let t = x.shape()[1];
            if t > 4 && params.layers.len() > 2 {}
            while config.n > 3 {}
            Ok(h)";
        assert_eq!(errors(body), Vec::<String>::new());
    }

    #[test]
    fn branches_on_tensors_are_reported() {
        let found = errors(
            "let loss = mean(&x)?; if loss > 1.0 {} while loss.gt(&x)? {} match loss.item::<f32>() { _ => {} }",
        );
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("this `if` depends on `loss` (computed from the tensor `x`)"));
        assert!(found[1].starts_with("this `while` depends on `loss`"));
        assert!(found[2].starts_with("this `match` depends on `loss`"));
    }

    #[test]
    fn taint_follows_bindings_calls_and_closures() {
        let found = errors(
            "let big = too_big(&x); if big {} let check = || norm(&x); if check() {} \
             let y = if config.flag { x.clone() } else { x.clone() }; if y.ndim() == 2 {}",
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("`big` (computed from the tensor `x`)"));
        assert!(found[1].contains("`check` (computed from the tensor `x`)"));
    }

    #[test]
    fn shadowing_clears_taint() {
        assert_eq!(
            errors("let a = x.clone(); let a = 3; if a > 2 {}"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn logic_operands_and_host_reads() {
        let found = errors(
            "if config.flag && is_nan(&x) {} let v: bool = x.try_into()?; let true = ok(&x) else { return }; \
             assert!(x.sum() > 0); println!(\"{}\", x);",
        );
        assert_eq!(found.len(), 5, "{found:?}");
        assert!(found[0].starts_with("this operand of `&&`"));
        assert!(found[1].starts_with("this `?` on `try_into`"));
        assert!(found[2].starts_with("this early `return`"));
        assert!(found[3].starts_with("`assert!` depends on"));
        assert!(found[4].starts_with("`println!` formats"));
    }
}
