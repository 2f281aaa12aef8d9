//! `#[lmx::model]` and `#[lmx::step]`: a thin shell over [`lmx_grammar::rust_front`], where the
//! analysis and code generation live. Use them through the `lmx` crate (`lmx::model`,
//! `lmx::step`); the generated code refers to `::lmx::runtime`, or to `<path>::runtime` under
//! `#[lmx(crate = "path")]`.

use proc_macro::TokenStream;

/// Makes a struct of layers a typed parameter tree, generic over its leaf.
///
/// ```ignore
/// #[lmx::model]
/// pub struct Block {
///     attn: Attention,                 // a nested #[lmx::model]
///     mlp: Mlp,
///     #[lmx(frozen)]
///     norm: RmsNormParams,             // a runtime layer; frozen: no gradient, no optimizer state
///     #[lmx(role = norm, no_decay)]
///     scale: Array,                    // a raw leaf with its role
///     layers: Vec<Layer>,              // named `layers.0`, `layers.1`, ...
///     #[lmx(tied = "embed")]
///     head: EmbeddingParams,           // no leaf of its own: `head()` returns `&self.embed`
/// }
/// ```
///
/// The struct becomes `Block<T = Array>` and implements `Tree<T>`; inherent methods give names,
/// specs, masks, parameter counts, flat maps and safetensors files.
#[proc_macro_attribute]
pub fn model(args: TokenStream, item: TokenStream) -> TokenStream {
    lmx_grammar::rust_front::model(args.into(), item.into()).into()
}

/// Checks a loss function over tensors and, with `optimizer = O`, compiles it as a training step.
///
/// ```ignore
/// #[lmx::step(optimizer = AdamW)]
/// pub fn train(params: &Llama<Tensor>, tokens: &Tensor, targets: &Tensor, config: &LlamaConfig)
///     -> Result<Tensor> { ... }
/// ```
///
/// The body may not branch on a tensor's value (`if`, `while`, `match`, `&&`, `||`, comparisons,
/// `?` on a host conversion, `let ... else`, assertions); each is reported at its own tokens.
/// With an optimizer the macro declares `TrainState` (the compiled state) and a `Train` struct
/// that compiles the step over it.
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    lmx_grammar::rust_front::step(args.into(), item.into()).into()
}
