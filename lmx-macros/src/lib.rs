//! `#[lmx::model]`, `#[lmx::step]` and `#[derive(lmx::Tree)]`: a thin shell over
//! [`lmx_grammar::rust_front`], where the analysis and code generation live. Use them through the
//! `lmx` crate (`lmx::model`, `lmx::step`, `lmx::Tree`); the generated code refers to
//! `::lmx::runtime`, or to `<path>::runtime` under `#[lmx(crate = "path")]`.

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
///
/// Given its configuration type and functions, the struct is a language model (it implements
/// `LanguageModel`: `Trainer`, checkpoints, `generate` with the KV cache, the CLI):
///
/// ```ignore
/// #[lmx::model(
///     config = TinyConfig,              // Clone + Debug + Serialize + Deserialize
///     init = Tiny::build,               // fn(&TinyConfig, &mut Keys) -> Result<Tiny>
///     forward = forward,                // fn(&Tiny<Tensor>, &Tensor, &TinyConfig, &mut Context) -> Result<Tensor>
///     vocab_size = vocab,               // a field of the configuration
///     context_len = context,            // a field of the configuration (optional)
///     presets(tiny = TinyConfig::tiny()),
///     validate = TinyConfig::check,     // fn(&TinyConfig) -> Result<()> (optional)
///     name = "tiny",                    // optional: the struct's name in snake case
/// )]
/// pub struct Tiny { ... }
/// ```
#[proc_macro_attribute]
pub fn model(args: TokenStream, item: TokenStream) -> TokenStream {
    lmx_grammar::rust_front::model(args.into(), item.into()).into()
}

/// Checks a loss function over tensors and, with `optimizer = O`, makes it a training step.
///
/// ```ignore
/// #[lmx::step(optimizer = AdamW { weight_decay: 0.1, ..AdamW::default() }, clip_norm = 1.0)]
/// pub fn train(params: &Llama<Tensor>, tokens: &Tensor, targets: &Tensor, config: &LlamaConfig,
///     ctx: &mut Context) -> Result<Tensor> { ... }
/// ```
///
/// The body may not branch on a tensor's value (`if`, `while`, `match`, `&&`, `||`, comparisons,
/// `?` on a host conversion, `let ... else`, assertions); each is reported at its own tokens.
/// With an optimizer the macro declares a unit struct (`Train` for `train`) implementing
/// `TrainingStep` for the model of the tree (`Llama`), so `Trainer` compiles it over
/// `TrainState<Llama, AdamW>`; `clip_norm` and `accumulate` set its options. Without one, the
/// struct's `call` runs the function on arrays.
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    lmx_grammar::rust_front::step(args.into(), item.into()).into()
}

/// The `Tree` impl of a struct generic over its leaf (`struct Block<T = Array>`): fields of type
/// `T` are leaves, `Option<T>` optional leaves, the others sub-trees, in declaration order.
///
/// ```ignore
/// #[derive(lmx::Tree)]
/// pub struct Block<T = Array> {
///     #[lmx(role = norm, no_decay)]
///     scale: T,
///     #[lmx(frozen, rename = "ln_1")]
///     norm: LayerNormParams<T>,
/// }
/// ```
#[proc_macro_derive(Tree, attributes(lmx))]
pub fn derive_tree(item: TokenStream) -> TokenStream {
    lmx_grammar::rust_front::derive_tree(item.into()).into()
}
