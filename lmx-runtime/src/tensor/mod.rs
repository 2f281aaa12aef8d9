//! Tensors as a step sees them: graph values with no way back to the host.
//!
//! A [`Tensor`] wraps an MLX array and offers only operations that build the graph: arithmetic,
//! comparisons that give masks (never `bool`), reductions, indexing, splitting and joining,
//! shapes, and the layers of [`nn`]; dropout and attention go through the forward pass's
//! [`Context`]. It has no `item`, no `PartialOrd` or `PartialEq`, no `Display`, and no public way
//! back to an [`Array`]: the only conversion out is crate-private, used by the functions of
//! [`host`] that run a model's forward pass or a step's loss on arrays and hand back the result.
//! So code that would read a tensor on the host, in a step or in a helper it calls, does not
//! type-check; `#[lmx::step]` reports a branch on a tensor's value first, at its own tokens.
//! Shapes and dtypes are static under compilation, so they stay readable.

mod context;
pub mod host;
pub mod nn;
mod ops;

pub use context::{AttentionOptions, Context};
pub use ops::{concatenate, where_};

use crate::tree::Tree;
use crate::Array;

/// A graph value inside a step or a forward pass.
#[derive(Clone)]
pub struct Tensor(Array);

impl From<Array> for Tensor {
    /// A host array as a constant of the graph (host values may flow in, never out).
    fn from(array: Array) -> Tensor {
        Tensor(array)
    }
}

/// The bound that no type meets: what a host read of a [`Tensor`] requires.
///
/// It exists so that `tensor.into_array()` fails to compile with this message rather than with
/// "private method"; lmx-runtime implements it for nothing, and no other crate can implement it
/// for `Tensor`.
#[diagnostic::on_unimplemented(
    message = "a `Tensor` cannot be read on the host: its value exists only inside the compiled graph",
    label = "this reads a tensor's value on the host",
    note = "a step or forward pass is traced once; a value read here would panic inside MLX's compile, or freeze the graph on one batch",
    note = "keep it in the graph (select with `where_(cond, a, b)`); to see it, return it from the step as the loss and read the `Array` the step returns"
)]
pub trait ReadOnTheHost {}

impl Tensor {
    /// Never callable: a tensor has no value on the host (see [`ReadOnTheHost`]).
    pub fn into_array(self) -> Array
    where
        for<'a> Tensor: ReadOnTheHost,
    {
        self.0
    }
}

/// `tree` with `Tensor` leaves (cheap: arrays are reference counted).
pub fn graph<R: Tree<Array>>(tree: &R) -> R::Of<Tensor> {
    tree.map(&mut |leaf| Tensor(leaf.clone()))
}

/// `tree` with `Array` leaves again, for the runtime's layer functions.
fn arrays<R: Tree<Tensor>>(tree: &R) -> R::Of<Array> {
    tree.map(&mut |leaf| leaf.0.clone())
}
