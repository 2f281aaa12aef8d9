//! `next path = value`: a forward pass gives one of its own buffers (`name: buffer[dims]`) its
//! next value, which a training step writes into its state after the update.
//!
//! The rules: the path names a `buffer[..]` of the parameters of the forward pass that writes it
//! (not a parameter, which only the optimizer changes, nor a buffer of a block it calls, which
//! that block's own forward pass writes); the value is a float tensor of the buffer's shape; and
//! a step writes no buffer itself: its statements before `grad(..)` see no parameters, and after
//! it a value would depend on the gradients, while the compiled step computes the buffers' next
//! values in the same pass as the loss, which the gradients come from.

use super::scope::Scope;
use super::{Checker, Context};
use crate::ast::{self, Expr, ExprKind, ParamGroup, ParamKind};
use crate::diag::Diagnostic;
use crate::span::Span;
use crate::types::Ty;

/// What a `next` statement's path names.
enum Target<'m> {
    /// A buffer of this forward pass's parameters.
    Buffer,
    /// A trained leaf or layer: its kind as a reader calls it.
    Parameter(&'static str),
    /// Something inside a block the pass calls: that block's name.
    InBlock(&'m str),
    /// No parameter of this forward pass.
    Unknown,
}

/// The names of a member path (`gate.bias`), or `None` for another expression.
fn path_names(e: &Expr) -> Option<Vec<&str>> {
    match &e.kind {
        ExprKind::Name(n) => Some(vec![n.as_str()]),
        ExprKind::Member(target, field) => {
            let mut names = path_names(target)?;
            names.push(field.name.as_str());
            Some(names)
        }
        _ => None,
    }
}

impl<'m> Checker<'m> {
    /// Checks `next target = value` (the whole statement at `stmt`).
    pub(crate) fn next_buffer(
        &mut self,
        target: &Expr,
        value: &Expr,
        stmt: Span,
        scope: &mut Scope,
        ctx: Context,
    ) {
        let new = self.infer(value, scope, ctx);
        let keyword = Span::new(stmt.start, stmt.start + "next".len());
        if ctx == Context::Step {
            self.buffer_in_step(keyword, target, value);
            return;
        }
        let path = path_names(target).unwrap_or_default();
        let text = path.join(".");
        match self.buffer_target(&path, scope) {
            Target::Buffer => {}
            Target::Parameter(kind) => {
                self.error(
                    Diagnostic::new(
                        "lmx::buffer::parameter",
                        format!("`{text}` is a parameter, not a buffer"),
                        target.span,
                        format!("{kind}, which the optimizer trains"),
                    )
                    .with_label(keyword, "`next` gives a buffer its value after the step")
                    .with_help(
                        "parameters change only through the step's `update`; declare state that \
                         a step writes without gradients as `name: buffer[dims]`",
                    ),
                );
                return;
            }
            Target::InBlock(block) => {
                self.error(
                    Diagnostic::new(
                        "lmx::buffer::target",
                        format!("`{text}` belongs to block `{block}`"),
                        target.span,
                        format!("inside block `{block}`"),
                    )
                    .with_help(format!(
                        "give it its next value in the forward pass of block `{block}`, which \
                         declares it"
                    )),
                );
                return;
            }
            Target::Unknown => {
                self.error(
                    Diagnostic::new(
                        "lmx::buffer::target",
                        format!("`{text}` is not a buffer of this forward pass's parameters"),
                        target.span,
                        "not a declared buffer",
                    )
                    .with_help("declare the buffer in this `params` section: `name: buffer[dims]`"),
                );
                return;
            }
        }
        // Reading the buffer checks its guard as any read does, and gives its shape.
        let old = self.infer(target, scope, ctx);
        self.buffer_value(&text, &old, &new, target, value);
        self.facts.buffer_writes.push(text);
        self.writes_buffers = true;
    }

    /// What `path` names among the parameters of the forward pass being checked.
    fn buffer_target(&self, path: &[&str], scope: &Scope) -> Target<'m> {
        let Some(mut group) = self.current_params() else {
            return Target::Unknown;
        };
        for (i, segment) in path.iter().enumerate() {
            let Some(param) = group.entries.iter().find(|p| p.name.name == *segment) else {
                return Target::Unknown;
            };
            // A local of the same name hides the parameter.
            if i == 0 && scope.get(segment).is_none_or(|b| b.span != param.name.span) {
                return Target::Unknown;
            }
            let last = i + 1 == path.len();
            match &param.kind {
                ParamKind::Group(inner) if !last => group = inner,
                ParamKind::Tensor { buffer: true, .. } if last => return Target::Buffer,
                ParamKind::Tensor { .. } | ParamKind::Tied(_) if last => {
                    return Target::Parameter("a tensor parameter")
                }
                ParamKind::Group(_) => return Target::Parameter("a group of parameters"),
                ParamKind::Module(m) if last => {
                    return match self.model.blocks.iter().any(|b| b.name.name == m.name.name) {
                        true => Target::Parameter("a block"),
                        false => Target::Parameter("a layer"),
                    }
                }
                ParamKind::Module(m) => {
                    return match self
                        .model
                        .blocks
                        .iter()
                        .find(|b| b.name.name == m.name.name)
                    {
                        Some(b) => Target::InBlock(&b.name.name),
                        None => Target::Parameter("a layer's weight"),
                    }
                }
                ParamKind::List { module, .. } => {
                    return match self
                        .model
                        .blocks
                        .iter()
                        .find(|b| b.name.name == module.name.name)
                    {
                        Some(b) if !last => Target::InBlock(&b.name.name),
                        _ => Target::Parameter("a list of blocks"),
                    }
                }
                ParamKind::Tensor { .. } | ParamKind::Tied(_) => return Target::Unknown,
            }
        }
        Target::Unknown
    }

    /// The parameter section of the forward pass being checked.
    fn current_params(&self) -> Option<&'m ParamGroup> {
        match &self.current_block {
            Some(name) => self
                .model
                .blocks
                .iter()
                .find(|b| &b.name.name == name)
                .and_then(|b| b.params.as_ref()),
            None => self.model.params.as_ref(),
        }
    }

    /// The value must be a float tensor of the buffer's shape (a buffer keeps its layout: the
    /// compiled state's is fixed before it is traced).
    fn buffer_value(&mut self, text: &str, old: &Ty, new: &Ty, target: &Expr, value: &Expr) {
        let (Ty::Tensor(buffer), Ty::Tensor(next)) = (old, new) else {
            if matches!(old, Ty::Unknown) || matches!(new, Ty::Unknown) {
                return;
            }
            self.error(
                Diagnostic::new(
                    "lmx::type::buffer",
                    format!("the next value of buffer `{text}` must be a tensor, found {new}"),
                    value.span,
                    "not a tensor",
                )
                .with_label(target.span, format!("a tensor of shape {}", old_shape(old)))
                .with_help("compute the value with tensor operations of the buffer's shape"),
            );
            return;
        };
        if next.dtype != ast::Dtype::Float {
            self.error(
                Diagnostic::new(
                    "lmx::type::buffer",
                    format!(
                        "the next value of buffer `{text}` must be a float tensor, found {} tensor",
                        next.dtype.with_article()
                    ),
                    value.span,
                    format!("this is {} tensor", next.dtype.with_article()),
                )
                .with_help("convert it with `as_float(..)`"),
            );
            return;
        }
        if let (Some(a), Some(b)) = (&buffer.shape, &next.shape) {
            if a != b {
                self.error(
                    Diagnostic::new(
                        "lmx::shape::buffer",
                        format!(
                            "the next value of buffer `{text}` has shape {}, the buffer {}",
                            next.shape_text(),
                            buffer.shape_text()
                        ),
                        value.span,
                        format!("this has shape {}", next.shape_text()),
                    )
                    .with_label(
                        target.span,
                        format!("the buffer is {}", buffer.shape_text()),
                    )
                    .with_help("a buffer keeps its shape: reduce or reshape the value to it"),
                );
            }
        }
    }

    /// `next` inside a step.
    fn buffer_in_step(&mut self, keyword: Span, target: &Expr, value: &Expr) {
        let after_grad = self
            .step_state
            .as_ref()
            .and_then(|state| state.grad_at())
            .filter(|grad| grad.end <= value.span.start);
        let mut d = Diagnostic::new(
            "lmx::buffer::in_step",
            "a step cannot give a buffer its next value",
            target.span,
            "written in a step",
        )
        .with_label(
            keyword,
            "`next` belongs in the forward pass that declares the buffer",
        );
        if let Some(grad) = after_grad {
            d = d
                .with_label(value.span, "computed after the loss is differentiated")
                .with_label(grad, "the gradients come from here");
        }
        self.error(d.with_help(
            "the compiled step computes every buffer's next value in the same pass as the loss, \
             without gradients: write `next` in the forward pass whose `params` declare the \
             buffer, from values that pass computes",
        ));
    }
}

/// A type's shape text, for labels.
fn old_shape(t: &Ty) -> String {
    match t {
        Ty::Tensor(t) => t.shape_text(),
        other => other.to_string(),
    }
}
