//! Typed parameter trees.
//!
//! A model's parameters are a struct tree generic over its leaf: `GptParams<Array>` holds the
//! weights, `GptParams<AdamWLeaf>` the optimizer's moments, `GptParams<Array>` again the gradients.
//! A [`Tree`] has one fixed traversal order, so it flattens to a `Vec` and is rebuilt from one
//! without hashing or names; the dotted names (`blocks.3.attn.wq.weight`) exist for checkpoints,
//! interop and masks, and are computed once by [`Tree::describe`].
//!
//! ```
//! use lmx_runtime::tree::{flatten, names, Tree};
//! use lmx_runtime::nn::LinearParams;
//!
//! let linear = LinearParams::new(1.0_f32, Some(2.0));
//! assert_eq!(flatten(&linear), vec![1.0, 2.0]);
//! assert_eq!(names(&linear), vec!["weight", "bias"]);
//! let doubled: LinearParams<f32> = linear.map(&mut |x| x * 2.0);
//! assert_eq!(doubled.bias, Some(4.0));
//! ```

use crate::error::{Error, Result};
use crate::nn::{EmbeddingParams, LinearParams, SwitchLinearParams};

/// What a leaf is, which decides how training treats it by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeafRole {
    /// A weight matrix (of a linear layer, a projection, an expert).
    Weight,
    /// A bias vector.
    Bias,
    /// A normalisation scale or shift.
    Norm,
    /// An embedding table.
    Embedding,
    /// A low-rank adapter's matrix (`lora_a`, `lora_b`): where an adapter exists, only adapters
    /// train (see [`specs`]).
    Adapter,
    /// A quantized weight's per-group scales and offsets: never trained.
    Quantization,
    /// Any other raw tensor.
    Other,
    /// State that is not a parameter (a running statistic, a routing bias): never trained or
    /// decayed; a training step may write its next value ([`crate::buffers`]).
    Buffer,
}

impl LeafRole {
    /// Whether weight decay applies to this role unless asked otherwise: weights and other raw
    /// tensors decay; biases, norms and embeddings do not.
    pub fn decays_by_default(self) -> bool {
        matches!(self, LeafRole::Weight | LeafRole::Other)
    }
}

/// One leaf of a tree as training sees it: its dotted name, role, and masks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafSpec {
    /// The stable dotted name, e.g. `h.3.attn.c_attn.weight`.
    pub name: String,
    /// What the leaf is.
    pub role: LeafRole,
    /// False when the leaf is frozen: it gets no gradient and no update.
    pub trainable: bool,
    /// Whether weight decay applies.
    pub decay: bool,
}

impl LeafSpec {
    /// Whether training can change the leaf: a trainable parameter, or a buffer (which a step
    /// writes). Only such leaves are what a run adds to a frozen base it can read again.
    pub fn changes_in_training(&self) -> bool {
        self.trainable || self.role == LeafRole::Buffer
    }
}

/// Where [`Tree::describe`] stands: the name so far and what enclosing fields imposed.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    prefix: String,
    frozen: bool,
    no_decay: bool,
}

/// Attributes a field can carry in a model declaration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldAttrs {
    /// Every leaf below is frozen.
    pub frozen: bool,
    /// No leaf below decays.
    pub no_decay: bool,
}

impl Scope {
    /// The dotted name of this scope (`model.layers.3.self_attn.q_proj`).
    pub fn name(&self) -> &str {
        &self.prefix
    }

    /// Whether an enclosing field froze everything below.
    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// The scope of a tree's root.
    pub fn root() -> Scope {
        Scope::default()
    }

    /// The scope of the field or list element `segment`, with the field's attributes.
    pub fn child(&self, segment: &str, attrs: FieldAttrs) -> Scope {
        let prefix = if self.prefix.is_empty() {
            segment.to_owned()
        } else {
            format!("{}.{segment}", self.prefix)
        };
        Scope {
            prefix,
            frozen: self.frozen || attrs.frozen,
            no_decay: self.no_decay || attrs.no_decay,
        }
    }

    /// Records the leaf `segment` of `role` in `out`.
    pub fn leaf(&self, segment: &str, role: LeafRole, attrs: FieldAttrs, out: &mut Vec<LeafSpec>) {
        let scope = self.child(segment, attrs);
        out.push(LeafSpec {
            name: scope.prefix,
            role,
            trainable: !scope.frozen,
            decay: !scope.no_decay && role.decays_by_default(),
        });
    }
}

/// A tree of leaves of type `T` in a fixed traversal order.
///
/// Implemented by the parameter structs that `.lmx` files and `#[lmx::model]` generate, by the
/// runtime's layer structs, and by `Vec` and `Option` of trees.
pub trait Tree<T> {
    /// The same tree shape with leaves of type `U`.
    type Of<U>: Tree<U>;

    /// Calls `f` on every leaf, in traversal order.
    fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a T));

    /// Calls `f` on every leaf mutably, in traversal order.
    fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut T));

    /// A tree of the same shape whose leaves are `f` of these, in traversal order.
    fn map<U>(&self, f: &mut dyn FnMut(&T) -> U) -> Self::Of<U>;

    /// A tree of this very type whose leaves are `f` of these, in traversal order.
    fn map_same(&self, f: &mut dyn FnMut(&T) -> T) -> Self;

    /// Appends a [`LeafSpec`] for every leaf, in traversal order, named within `scope`.
    fn describe(&self, scope: &Scope, out: &mut Vec<LeafSpec>);

    /// Calls `f` on every layer (linear layer, embedding) with its scope, in traversal order.
    fn for_each_layer<'a>(&'a self, scope: &Scope, f: &mut dyn FnMut(&Scope, Layer<'a, T>));

    /// Calls `f` on every layer mutably, in traversal order: how adapters are attached and
    /// layers quantized, wherever a model keeps them.
    fn for_each_layer_mut(&mut self, scope: &Scope, f: &mut dyn FnMut(&Scope, LayerMut<'_, T>));
}

/// A layer that [`Tree::for_each_layer`] visits.
pub enum Layer<'a, T> {
    /// A linear layer.
    Linear(&'a LinearParams<T>),
    /// An embedding table.
    Embedding(&'a EmbeddingParams<T>),
    /// A stacked projection of sparse experts.
    SwitchLinear(&'a SwitchLinearParams<T>),
}

/// A layer that [`Tree::for_each_layer_mut`] visits.
pub enum LayerMut<'a, T> {
    /// A linear layer.
    Linear(&'a mut LinearParams<T>),
    /// An embedding table.
    Embedding(&'a mut EmbeddingParams<T>),
    /// A stacked projection of sparse experts.
    SwitchLinear(&'a mut SwitchLinearParams<T>),
}

impl<T> Layer<'_, T> {
    /// How the layer's weight is quantized, when it is.
    pub fn quantization(&self) -> Option<crate::nn::Quantization> {
        match self {
            Layer::Linear(l) => l.quantization,
            Layer::Embedding(e) => e.quantization,
            Layer::SwitchLinear(s) => s.quantization,
        }
    }
}

/// The leaves of `tree`, cloned, in traversal order.
pub fn flatten<T: Clone, R: Tree<T> + ?Sized>(tree: &R) -> Vec<T> {
    let mut leaves = Vec::new();
    tree.for_each(&mut |leaf| leaves.push(leaf.clone()));
    leaves
}

/// The number of leaves of `tree`.
pub fn leaf_count<T, R: Tree<T> + ?Sized>(tree: &R) -> usize {
    let mut count = 0;
    tree.for_each(&mut |_| count += 1);
    count
}

/// The number of scalars in the leaves of `tree` whose spec passes `keep`.
pub fn parameter_count<R: Tree<mlx_rs::Array> + ?Sized>(
    tree: &R,
    keep: impl Fn(&LeafSpec) -> bool,
) -> usize {
    let mut specs = specs(tree).into_iter();
    let mut count = 0;
    tree.for_each(&mut |leaf| {
        if keep(&specs.next().expect("one spec per leaf")) {
            count += leaf.size();
        }
    });
    count
}

/// The specs of every leaf of `tree`, in traversal order.
///
/// Besides the masks of field attributes, three rules decide what trains, here and nowhere else:
/// where the tree holds an adapter, only adapters train (the base model is frozen, as LoRA
/// requires); quantization scales and offsets, and buffers, never train; and a quantized layer's own leaves
/// (its packed weight, its bias) never train, as MLX's `QuantizedLinear` freezes itself: the
/// packed weight has no gradient.
pub fn specs<T, R: Tree<T> + ?Sized>(tree: &R) -> Vec<LeafSpec> {
    let mut out = Vec::new();
    tree.describe(&Scope::root(), &mut out);
    let mut quantized = Vec::new();
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        if layer.quantization().is_some() {
            quantized.push(scope.name().to_owned());
        }
    });
    let in_quantized = |name: &str| {
        quantized.iter().any(|layer| {
            let field = match layer.as_str() {
                "" => Some(name),
                layer => name
                    .strip_prefix(layer)
                    .and_then(|rest| rest.strip_prefix('.')),
            };
            field.is_some_and(|field| !field.contains('.'))
        })
    };
    let adapted = out.iter().any(|spec| spec.role == LeafRole::Adapter);
    for spec in &mut out {
        let frozen = match spec.role {
            LeafRole::Adapter => false,
            LeafRole::Quantization | LeafRole::Buffer => true,
            _ => adapted || in_quantized(&spec.name),
        };
        if frozen {
            spec.trainable = false;
        }
    }
    out
}

/// The dotted names of every leaf of `tree`, in traversal order.
pub fn names<T, R: Tree<T> + ?Sized>(tree: &R) -> Vec<String> {
    specs(tree).into_iter().map(|spec| spec.name).collect()
}

/// Rebuilds a tree shaped like `template` from `leaves` in traversal order.
///
/// Fails when `leaves` holds more or fewer leaves than `template`.
pub fn rebuild<T, R: Tree<T>, U>(
    template: &R,
    leaves: impl IntoIterator<Item = U>,
) -> Result<R::Of<U>> {
    let leaves: Vec<U> = leaves.into_iter().collect();
    let expected = leaf_count(template);
    if leaves.len() != expected {
        return Err(Error::Layout(format!(
            "a tree of {expected} leaves cannot be rebuilt from {} leaves",
            leaves.len()
        )));
    }
    let mut leaves = leaves.into_iter();
    Ok(template.map(&mut |_| leaves.next().expect("counted above")))
}

impl<T, R: Tree<T>> Tree<T> for Vec<R> {
    type Of<U> = Vec<R::Of<U>>;

    fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a T)) {
        for item in self {
            item.for_each(f);
        }
    }

    fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut T)) {
        for item in self {
            item.for_each_mut(f);
        }
    }

    fn map<U>(&self, f: &mut dyn FnMut(&T) -> U) -> Vec<R::Of<U>> {
        self.iter().map(|item| item.map(f)).collect()
    }

    fn map_same(&self, f: &mut dyn FnMut(&T) -> T) -> Self {
        self.iter().map(|item| item.map_same(f)).collect()
    }

    fn describe(&self, scope: &Scope, out: &mut Vec<LeafSpec>) {
        for (index, item) in self.iter().enumerate() {
            item.describe(&scope.child(&index.to_string(), FieldAttrs::default()), out);
        }
    }

    fn for_each_layer<'a>(&'a self, scope: &Scope, f: &mut dyn FnMut(&Scope, Layer<'a, T>)) {
        for (index, item) in self.iter().enumerate() {
            item.for_each_layer(&scope.child(&index.to_string(), FieldAttrs::default()), f);
        }
    }

    fn for_each_layer_mut(&mut self, scope: &Scope, f: &mut dyn FnMut(&Scope, LayerMut<'_, T>)) {
        for (index, item) in self.iter_mut().enumerate() {
            item.for_each_layer_mut(&scope.child(&index.to_string(), FieldAttrs::default()), f);
        }
    }
}

impl<T, R: Tree<T>> Tree<T> for Option<R> {
    type Of<U> = Option<R::Of<U>>;

    fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a T)) {
        if let Some(item) = self {
            item.for_each(f);
        }
    }

    fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut T)) {
        if let Some(item) = self {
            item.for_each_mut(f);
        }
    }

    fn map<U>(&self, f: &mut dyn FnMut(&T) -> U) -> Option<R::Of<U>> {
        self.as_ref().map(|item| item.map(f))
    }

    fn map_same(&self, f: &mut dyn FnMut(&T) -> T) -> Self {
        self.as_ref().map(|item| item.map_same(f))
    }

    fn describe(&self, scope: &Scope, out: &mut Vec<LeafSpec>) {
        if let Some(item) = self {
            item.describe(scope, out);
        }
    }

    fn for_each_layer<'a>(&'a self, scope: &Scope, f: &mut dyn FnMut(&Scope, Layer<'a, T>)) {
        if let Some(item) = self {
            item.for_each_layer(scope, f);
        }
    }

    fn for_each_layer_mut(&mut self, scope: &Scope, f: &mut dyn FnMut(&Scope, LayerMut<'_, T>)) {
        if let Some(item) = self {
            item.for_each_layer_mut(scope, f);
        }
    }
}
