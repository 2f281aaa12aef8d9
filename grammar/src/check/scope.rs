//! Lexical scopes: what each visible name refers to.

use std::collections::HashMap;

use crate::span::Span;
use crate::types::Ty;

/// What a name is bound to.
#[derive(Debug, Clone)]
pub struct Binding {
    /// Its type.
    pub ty: Ty,
    /// Where it was declared.
    pub span: Span,
    /// The static condition under which it exists (guarded parameters), as text.
    pub guard: Option<String>,
}

/// Nested scopes; inner ones shadow outer ones.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    frames: Vec<HashMap<String, Binding>>,
}

impl Scope {
    /// Opens an inner scope.
    pub fn push(&mut self) {
        self.frames.push(HashMap::new());
    }

    /// Closes the innermost scope.
    pub fn pop(&mut self) {
        self.frames.pop();
    }

    /// Binds a name in the innermost scope.
    pub fn bind(&mut self, name: &str, ty: Ty, span: Span) {
        self.bind_guarded(name, ty, span, None);
    }

    /// Binds a name that exists only under a static condition.
    pub fn bind_guarded(&mut self, name: &str, ty: Ty, span: Span, guard: Option<String>) {
        if self.frames.is_empty() {
            self.push();
        }
        if let Some(frame) = self.frames.last_mut() {
            frame.insert(name.to_string(), Binding { ty, span, guard });
        }
    }

    /// Rebinds an existing name in the scope that holds it.
    pub fn rebind(&mut self, name: &str, ty: Ty) {
        for frame in self.frames.iter_mut().rev() {
            if let Some(b) = frame.get_mut(name) {
                b.ty = ty;
                return;
            }
        }
    }

    /// Looks a name up, innermost first.
    pub fn get(&self, name: &str) -> Option<&Binding> {
        self.frames.iter().rev().find_map(|f| f.get(name))
    }

    /// Every visible name (for suggestions), the innermost scope's first, each scope's in
    /// alphabetical order.
    pub fn names(&self) -> Vec<&str> {
        self.frames
            .iter()
            .rev()
            .flat_map(|f| {
                let mut names: Vec<&str> = f.keys().map(String::as_str).collect();
                names.sort_unstable();
                names
            })
            .collect()
    }
}
