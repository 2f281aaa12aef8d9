//! The entries: each built-in's parameters, shape rule, lowering, static form and doc line.

use quote::quote;

use super::statics as s;
use super::Default::{Absent, Bool, Float, Int, Required};
use super::Slot::{Axes, Axis, Count, Operand, Shape, Tensor, Tensors};
use super::{param as p, Builtin, Param, Site, Slot, StaticForm, TensorForm};
use crate::check::expert_rules as experts;
use crate::check::shape_rules as r;
use crate::eval::Value;
use crate::types::StaticTy;

const X: &[Param] = &[p("x", Tensor, Required)];
const X_AXIS: &[Param] = &[p("x", Tensor, Required), p("axis", Axis, Int(-1))];
const REDUCE: &[Param] = &[
    p("x", Tensor, Required),
    p("axis", Axis, Absent),
    p("keepdims", Slot::Bool, Bool(false)),
];
const AB: &[Param] = &[p("a", Operand, Required), p("b", Operand, Required)];

/// A one-argument float function over static numbers.
macro_rules! static_float {
    ($f:expr, $lower:expr) => {
        Some(StaticForm {
            arity: 1,
            ty: s::number_to_float,
            eval: |v| {
                let f: fn(f64) -> f64 = $f;
                s::float_arg(v).map(|x| Value::Float(f(x)))
            },
            lower: $lower,
        })
    };
}

/// An elementwise tensor function that keeps its input's shape.
macro_rules! unary {
    ($name:literal, $dtype:expr, $statik:expr, $doc:literal, |$x:ident| $lowering:expr) => {
        Builtin {
            name: $name,
            site: Site::Anywhere,
            tensor: Some(TensorForm {
                params: X,
                rule: |c| r::same_shape(c, $dtype),
                lower: |c| {
                    let $x = c.tensor_ref(0)?;
                    Ok(c.tensor($lowering))
                },
            }),
            statik: $statik,
            result: "same shape",
            doc: $doc,
        }
    };
}

/// A reduction over one axis or all of them.
macro_rules! reduce {
    ($name:literal, $statik:expr, $doc:literal) => {
        Builtin {
            name: $name,
            site: Site::Anywhere,
            tensor: Some(TensorForm {
                params: REDUCE,
                rule: r::reduce,
                lower: |c| {
                let x = c.tensor_value(0)?;
                let keep = c.bool(2)?;
                if c.given(1) {
                    let axis = c.i32(1)?;
                    let f = quote::format_ident!("{}_axis", $name);
                    Ok(c.tensor(quote!(#x.#f(#axis, #keep)?)))
                } else {
                    let f = quote::format_ident!("{}", $name);
                    Ok(c.tensor(quote!(#x.#f(#keep)?)))
                }
            },
            }),
            statik: $statik,
            result: "reduced over `axis` (all axes when left out); kept as size 1 with `keepdims`",
            doc: $doc,
        }
    };
}

/// Elementwise over broadcast operands.
macro_rules! binary {
    ($name:literal, $dtype:expr, $doc:literal) => {
        Builtin {
            name: $name,
            site: Site::Anywhere,
            tensor: Some(TensorForm {
                params: AB,
                rule: |c| r::broadcast_operands(c, &[0, 1], $dtype),
                lower: |c| {
                let [a, b] = c.operands([0, 1])?;
                let f = quote::format_ident!("{}", $name);
                Ok(c.tensor(quote!(ops::#f(#a, #b)?)))
            },
            }),
            statik: None,
            result: "broadcast shape",
            doc: $doc,
        }
    };
}

/// The rotated width of a RoPE call as `Option<i32>`: `None` (the whole head) when left out.
fn rope_dims(
    c: &mut crate::codegen::LowerCx<'_, '_, '_>,
    i: usize,
) -> crate::codegen::R<proc_macro2::TokenStream> {
    Ok(if c.given(i) {
        let dims = c.i32(i)?;
        quote!(Some(#dims))
    } else {
        quote!(None)
    })
}

/// The built-in activations a linear layer may apply to its input as it reads it in decoding
/// (`layer(gelu(x))`: `nn::linear_plus_in` of `nn::LayerInput::Activated`), each with its
/// `nn::Activation` variant; they lower as the `unary!` entries of [`TABLE`] do.
pub static ACTIVATIONS: &[(&str, &str)] = &[
    ("gelu", "Gelu"),
    ("gelu_approx", "GeluTanh"),
    ("silu", "Silu"),
];

/// Every built-in function, in the order the documentation lists them.
pub static TABLE: &[Builtin] = &[
    unary!("gelu", r::Out::Float, None, "GELU (the exact, erf form)", |x| quote!(nn::gelu(#x)?)),
    unary!("gelu_approx", r::Out::Float, None, "GELU (the tanh approximation)", |x| quote!(nn::gelu_tanh(#x)?)),
    unary!("silu", r::Out::Float, None, "`x * sigmoid(x)`", |x| quote!(nn::silu(#x)?)),
    unary!("relu", r::Out::Same, None, "`max(x, 0)`", |x| quote!(nn::relu(#x)?)),
    unary!("sigmoid", r::Out::Float, None, "logistic function", |x| quote!(ops::sigmoid(#x)?)),
    unary!(
        "tanh",
        r::Out::Float,
        static_float!(f64::tanh, |a| s::method(a, "tanh")),
        "hyperbolic tangent",
        |x| quote!(ops::tanh(#x)?)
    ),
    unary!(
        "exp",
        r::Out::Float,
        static_float!(f64::exp, |a| s::method(a, "exp")),
        "`e^x`",
        |x| quote!(ops::exp(#x)?)
    ),
    unary!(
        "log",
        r::Out::Float,
        static_float!(f64::ln, |a| s::method(a, "ln")),
        "natural logarithm",
        |x| quote!(ops::log(#x)?)
    ),
    unary!(
        "sqrt",
        r::Out::Float,
        static_float!(f64::sqrt, |a| s::method(a, "sqrt")),
        "square root",
        |x| quote!(ops::sqrt(#x)?)
    ),
    unary!(
        "rsqrt",
        r::Out::Float,
        static_float!(|x| 1.0 / x.sqrt(), |a| {
            let root = s::method(a, "sqrt");
            quote!((1.0 / #root))
        }),
        "`1 / sqrt(x)`",
        |x| quote!(ops::rsqrt(#x)?)
    ),
    unary!(
        "abs",
        r::Out::Same,
        static_float!(f64::abs, |a| s::method(a, "abs")),
        "absolute value",
        |x| quote!(ops::abs(#x)?)
    ),
    unary!(
        "sign",
        r::Out::Same,
        None,
        "-1, 0 or 1 by the sign of each element",
        |x| quote!(ops::sign(#x)?)
    ),
    unary!(
        "square",
        r::Out::Same,
        static_float!(|x| x * x, |a| {
            let x = s::as_f64(&a[0]);
            quote!(f64::powi(#x, 2))
        }),
        "`x * x`",
        |x| quote!(ops::square(#x)?)
    ),
    unary!(
        "sin",
        r::Out::Float,
        static_float!(f64::sin, |a| s::method(a, "sin")),
        "sine",
        |x| quote!(ops::sin(#x)?)
    ),
    unary!(
        "cos",
        r::Out::Float,
        static_float!(f64::cos, |a| s::method(a, "cos")),
        "cosine",
        |x| quote!(ops::cos(#x)?)
    ),
    unary!("softplus", r::Out::Float, None, "`log(1 + e^x)`", |x| quote!(nn::softplus(#x)?)),
    unary!(
        "stop_gradient",
        r::Out::Same,
        None,
        "the value, with no gradient flowing back",
        |x| quote!(nn::stop_gradient(#x)?)
    ),
    unary!("as_float", r::Out::Float, None, "converted to float32", |x| quote!(nn::as_float(#x)?)),
    Builtin {
        name: "softcap",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("cap", Slot::Float, Required)],
            rule: r::softcap,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let cap = c.f32(1)?;
            Ok(c.tensor(quote!(nn::softcap(#x, #cap)?)))
        },
        }),
        statik: None,
        result: "same shape",
        doc: "`cap * tanh(x / cap)`: Gemma 2's soft-capping of attention and final logits (`cap > 0`)",
    },
    Builtin {
        name: "softmax",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: X_AXIS,
            rule: r::distribution,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let axis = c.i32(1)?;
            Ok(c.tensor(quote!(nn::softmax(#x, #axis)?)))
        },
        }),
        statik: None,
        result: "same shape",
        doc: "softmax along `axis`, in float32 precision",
    },
    Builtin {
        name: "log_softmax",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: X_AXIS,
            rule: r::distribution,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let axis = c.i32(1)?;
            Ok(c.tensor(quote!(nn::log_softmax(#x, #axis)?)))
        },
        }),
        statik: None,
        result: "same shape",
        doc: "log-softmax along `axis`",
    },
    Builtin {
        name: "dropout",
        site: Site::Forward,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("p", Slot::Float, Required)],
            rule: r::dropout,
            lower: |c| {
            // Computed first: `x` may itself borrow the forward pass's state (a block's output).
            let x = c.hoisted(0, "dropout_in")?;
            let p = c.f32(1)?;
            let pass = c.drop_pass();
            Ok(c.tensor(quote!(#pass.dropout(#x, #p)?)))
        },
        }),
        statik: None,
        result: "same shape",
        doc: "zeroes each element with probability `p` in a training step (masks from the step's key), scaling the rest by `1 / (1 - p)`; the identity elsewhere",
    },
    reduce!("sum", None, "sum"),
    reduce!("mean", None, "mean"),
    reduce!("max", Some(s::MAX), "maximum; `max(a, b)` of two static numbers is the larger"),
    reduce!("min", Some(s::MIN), "minimum; `min(a, b)` of two static numbers is the smaller"),
    reduce!("logsumexp", None, "`log(sum(exp(x)))`, computed stably"),
    binary!("maximum", r::Out::Same, "elementwise maximum"),
    binary!("minimum", r::Out::Same, "elementwise minimum"),
    binary!("logical_and", r::Out::Bool, "elementwise `and` of bool tensors"),
    binary!("logical_or", r::Out::Bool, "elementwise `or` of bool tensors"),
    Builtin {
        name: "logical_not",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: X,
            rule: |c| r::same_shape(c, r::Out::Bool),
            lower: |c| {
            let x = c.tensor_ref(0)?;
            Ok(c.tensor(quote!(ops::logical_not(#x)?)))
        },
        }),
        statik: None,
        result: "same shape, bool",
        doc: "elementwise `not` of a bool tensor",
    },
    Builtin {
        name: "where",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("cond", Tensor, Required),
            p("a", Operand, Required),
            p("b", Operand, Required),
        ],
            rule: r::select,
            lower: |c| {
            let cond = c.tensor_ref(0)?;
            let [a, b] = c.operands([1, 2])?;
            Ok(c.tensor(quote!(ops::select(#cond, #a, #b)?)))
        },
        }),
        statik: None,
        result: "broadcast shape of all three",
        doc: "`a` where the bool tensor `cond` holds, else `b`",
    },
    Builtin {
        name: "reshape",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("shape", Shape, Required)],
            rule: r::reshape,
            lower: |c| {
            let x = c.tensor_value(0)?;
            let shape = c.shape(1)?;
            Ok(c.tensor(quote!(#x.reshape(#shape)?)))
        },
        }),
        statik: None,
        result: "`shape`; element counts must match symbolically (`lmx::shape::reshape`)",
        doc: "the same elements in another shape",
    },
    Builtin {
        name: "transpose",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("axes", Axes, Absent)],
            rule: r::transpose,
            lower: |c| {
            let x = c.tensor_value(0)?;
            if c.given(1) {
                let axes = c.shape(1)?;
                Ok(c.tensor(quote!(#x.transpose_axes(#axes)?)))
            } else {
                Ok(c.tensor(quote!(#x.transpose()?)))
            }
        },
        }),
        statik: None,
        result: "axes permuted (reversed when `axes` is left out)",
        doc: "axes reordered",
    },
    Builtin {
        name: "swapaxes",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("a", Axis, Required),
            p("b", Axis, Required),
        ],
            rule: r::swapaxes,
            lower: |c| {
            let x = c.tensor_value(0)?;
            let (a, b) = (c.i32(1)?, c.i32(2)?);
            Ok(c.tensor(quote!(#x.swap_axes(#a, #b)?)))
        },
        }),
        statik: None,
        result: "axes `a` and `b` exchanged",
        doc: "two axes exchanged",
    },
    Builtin {
        name: "expand_dims",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("axis", Axis, Required)],
            rule: r::expand_dims,
            lower: |c| {
            let x = c.tensor_value(0)?;
            let axis = c.i32(1)?;
            Ok(c.tensor(quote!(#x.expand_dims(#axis)?)))
        },
        }),
        statik: None,
        result: "a new axis of size 1 at `axis`",
        doc: "a size-1 axis inserted",
    },
    Builtin {
        name: "squeeze",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("axis", Axis, Required)],
            rule: r::squeeze,
            lower: |c| {
            let x = c.tensor_value(0)?;
            let axis = c.i32(1)?;
            Ok(c.tensor(quote!(#x.squeeze_axes(&[#axis])?)))
        },
        }),
        statik: None,
        result: "axis `axis`, of size 1, removed (`lmx::shape::squeeze` otherwise)",
        doc: "a size-1 axis removed",
    },
    Builtin {
        name: "split",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("n", Count, Required),
            p("axis", Axis, Int(-1)),
        ],
            rule: r::split,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let n = c.count(1);
            let axis = c.i32(2)?;
            let count = proc_macro2::Literal::usize_unsuffixed(n);
            Ok(c.array_tuple(quote!(nn::split::<#count>(#x, #axis)?), n))
        },
        }),
        statik: None,
        result: "`n` equal tensors (a literal `n`; the axis must divide)",
        doc: "cut into equal parts, bound with `let a, b, c = split(..)`",
    },
    Builtin {
        name: "concat",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("xs", Tensors, Required), p("axis", Axis, Int(0))],
            rule: r::concat,
            lower: |c| {
            let xs = c.tensors(0)?;
            let axis = c.i32(1)?;
            Ok(c.tensor(quote!(ops::concatenate(&[#(#xs),*], #axis)?)))
        },
        }),
        statik: None,
        result: "joined along `axis` (sizes add up)",
        doc: "tensors joined along an axis",
    },
    Builtin {
        name: "matmul",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("a", Tensor, Required), p("b", Tensor, Required)],
            rule: r::matmul,
            lower: |c| {
            let a = c.tensor_value(0)?;
            let b = c.tensor_ref(1)?;
            Ok(c.tensor(quote!(#a.matmul(#b)?)))
        },
        }),
        statik: None,
        result: "matrix product, batch axes broadcast (`lmx::shape::matmul`)",
        doc: "the same as `a @ b`",
    },
    Builtin {
        name: "arange",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("n", Slot::Int, Required)],
            rule: r::arange,
            lower: |c| {
            let start = c.positions_start(0);
            let n = c.i32(0)?;
            Ok(c.tensor(quote!(nn::arange(#start, #n)?)))
        },
        }),
        statik: None,
        result: "`[n] int`",
        doc: "positions `0..n` (over a sequence length `T` during cached generation, the positions after the cache)",
    },
    Builtin {
        name: "zeros",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("shape", Shape, Required)],
            rule: r::filled,
            lower: |c| {
            let shape = c.shape(0)?;
            Ok(c.tensor(quote!(Array::zeros::<f32>(#shape)?)))
        },
        }),
        statik: None,
        result: "float tensor of `shape`",
        doc: "zeros",
    },
    Builtin {
        name: "ones",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("shape", Shape, Required)],
            rule: r::filled,
            lower: |c| {
            let shape = c.shape(0)?;
            Ok(c.tensor(quote!(Array::ones::<f32>(#shape)?)))
        },
        }),
        statik: None,
        result: "float tensor of `shape`",
        doc: "ones",
    },
    Builtin {
        name: "attention",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("q", Tensor, Required),
            p("k", Tensor, Required),
            p("v", Tensor, Required),
            p("causal", Slot::Bool, Bool(false)),
            p("window", Slot::Int, Absent),
            p("scale", Slot::Float, Absent),
            p("bias", Tensor, Absent),
            p("softcap", Slot::Float, Absent),
        ],
            rule: r::attention,
            lower: |c| {
            let (q, k, v) = (c.tensor_ref(0)?, c.tensor_ref(1)?, c.tensor_ref(2)?);
            let causal = c.bool(3)?;
            let window = if c.given(4) {
                let w = c.i32(4)?;
                quote!(Some(#w))
            } else {
                quote!(None)
            };
            let scale = if c.given(5) {
                let s = c.f32(5)?;
                quote!(Some(#s))
            } else {
                quote!(None)
            };
            let bias = if c.given(6) {
                let b = c.hoisted(6, "bias")?;
                quote!(Some(#b))
            } else {
                quote!(None)
            };
            let softcap = if c.given(7) {
                let cap = c.f32(7)?;
                quote!(Some(#cap))
            } else {
                quote!(None)
            };
            let pass = c.attend_pass();
            Ok(c.tensor(quote!(
                #pass.attend(#q, #k, #v, nn::AttentionOptions { causal: #causal, scale: #scale, window: #window, bias: #bias, softcap: #softcap })?
            )))
        },
        }),
        statik: None,
        result: "`[B, heads, T, head_dim]` of `q`'s shape and `v`'s width",
        doc: "scaled dot-product attention over `[B, heads, T, head_dim]` inputs (fused; grouped-query when `k` has fewer heads; reads and extends the KV cache in generation); `softcap` caps the scaled scores as `softcap` does before the mask (Gemma 2)",
    },
    Builtin {
        name: "ssd",
        site: Site::Recurrent,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("dt", Tensor, Required),
            p("a", Tensor, Required),
            p("b", Tensor, Required),
            p("c", Tensor, Required),
            p("chunk", Slot::Int, Int(256)),
        ],
            rule: r::ssd,
            lower: |c| {
            let [x, dt, a, b, cc] = [0, 1, 2, 3, 4].map(|i| c.hoisted(i, "ssd_in"));
            let (x, dt, a, b, cc) = (x?, dt?, a?, b?, cc?);
            let chunk = c.i32(5)?;
            let pass = c.scan_pass();
            Ok(c.tensor(quote!({
                let (ctx, slot) = #pass.recurrent();
                nn::ssd(ctx, slot, #x, #dt, #a, #b, #cc, #chunk)?
            })))
        },
        }),
        statik: None,
        result: "`x`'s shape `[B, T, heads, head_dim]`",
        doc: "Mamba-2's selective state space recurrence `S_t = exp(dt_t a) S_{t-1} + dt_t x_t b_t^T`, `y_t = S_t c_t` per head (`dt [B, T, heads]` positive, `a [heads]` negative, `b` and `c [B, T, groups, state]` shared by groups of heads): chunked over a sequence (`chunk` positions, quadratic within), one step per token in generation with the state `[B, heads, head_dim, state]` in the cache",
    },
    Builtin {
        name: "gated_delta",
        site: Site::Recurrent,
        tensor: Some(TensorForm {
            params: &[
            p("q", Tensor, Required),
            p("k", Tensor, Required),
            p("v", Tensor, Required),
            p("g", Tensor, Required),
            p("beta", Tensor, Required),
            p("chunk", Slot::Int, Int(64)),
        ],
            rule: r::gated_delta,
            lower: |c| {
            let [q, k, v, g, beta] = [0, 1, 2, 3, 4].map(|i| c.hoisted(i, "delta_in"));
            let (q, k, v, g, beta) = (q?, k?, v?, g?, beta?);
            let chunk = c.i32(5)?;
            let pass = c.scan_pass();
            Ok(c.tensor(quote!({
                let (ctx, slot) = #pass.recurrent();
                nn::gated_delta(ctx, slot, #q, #k, #v, #g, #beta, #chunk)?
            })))
        },
        }),
        statik: None,
        result: "`[B, T, heads, v_dim]` of `q`'s heads and `v`'s width",
        doc: "Gated DeltaNet's delta rule `S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T`, `o_t = S_t^T q_t` per head (`q`, `k [B, T, heads, k_dim]`, `v [B, T, heads, v_dim]`, log decays `g` and strengths `beta [B, T, heads]`): chunked over a sequence (`chunk` positions, the UT transform within), one step per token in generation with the state `[B, heads, k_dim, v_dim]` in the cache",
    },
    Builtin {
        name: "causal_conv1d",
        site: Site::Recurrent,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("weight", Tensor, Required),
            p("bias", Tensor, Absent),
        ],
            rule: r::causal_conv1d,
            lower: |c| {
            let x = c.hoisted(0, "conv_in")?;
            let w = c.hoisted(1, "conv_weight")?;
            let bias = if c.given(2) {
                let b = c.hoisted(2, "conv_bias")?;
                quote!(Some(#b))
            } else {
                quote!(None)
            };
            let pass = c.scan_pass();
            Ok(c.tensor(quote!({
                let (ctx, slot) = #pass.recurrent();
                nn::conv_causal(ctx, slot, #x, #w, #bias)?
            })))
        },
        }),
        statik: None,
        result: "`x`'s shape `[B, T, channels]`",
        doc: "depthwise causal convolution over positions (`weight [channels, 1, kernel]`, transformers' `Conv1d` layout): output `t` sees inputs `t - kernel + 1 ..= t`; in generation the last `kernel - 1` inputs are kept in the cache",
    },
    Builtin {
        name: "rope",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("base", Slot::Float, Float(10000.0)),
            p("dims", Slot::Int, Absent),
            p("factor", Slot::Float, Float(1.0)),
        ],
            rule: |c| r::rope(c, 2, &[3]),
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let base = c.f32(1)?;
            let offset = c.offset();
            if c.given(3) {
                let dims = rope_dims(c, 2)?;
                let factor = c.f32(3)?;
                Ok(c.tensor(quote!(nn::rope_linear(#x, #dims, #base, #factor, #offset)?)))
            } else if c.given(2) {
                let dims = c.i32(2)?;
                Ok(c.tensor(quote!(nn::rope(#x, #dims, #base, #offset)?)))
            } else {
                Ok(c.tensor(quote!(nn::rotary(#x, #base, #offset)?)))
            }
        },
        }),
        statik: None,
        result: "same shape, rank 4",
        doc: "rotary position embedding of the first `dims` features (all when left out; partial rotary otherwise), positions after the cache, divided by `factor` (linear scaling)",
    },
    Builtin {
        name: "rope_llama3",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("base", Slot::Float, Required),
            p("factor", Slot::Float, Required),
            p("low_freq_factor", Slot::Float, Required),
            p("high_freq_factor", Slot::Float, Required),
            p("original_ctx", Slot::Int, Required),
            p("dims", Slot::Int, Absent),
        ],
            rule: r::rope_llama3,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let base = c.f32(1)?;
            let [factor, low, high, original] = [c.f32(2)?, c.f32(3)?, c.f32(4)?, c.f32(5)?];
            let dims = rope_dims(c, 6)?;
            let offset = c.offset();
            Ok(c.tensor(quote!(nn::rope_llama3(#x, #dims, #base, nn::Llama3Scaling {
                factor: f64::from(#factor),
                low_freq_factor: f64::from(#low),
                high_freq_factor: f64::from(#high),
                original_ctx: f64::from(#original),
            }, #offset)?)))
        },
        }),
        statik: None,
        result: "same shape, rank 4",
        doc: "rotary position embedding with Llama 3's frequency scaling (`rope_type: \"llama3\"`)",
    },
    Builtin {
        name: "rope_yarn",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("base", Slot::Float, Required),
            p("factor", Slot::Float, Required),
            p("original_ctx", Slot::Int, Required),
            p("beta_fast", Slot::Float, Float(32.0)),
            p("beta_slow", Slot::Float, Float(1.0)),
            p("mscale", Slot::Float, Float(1.0)),
            p("mscale_all_dim", Slot::Float, Float(0.0)),
            p("dims", Slot::Int, Absent),
        ],
            rule: r::rope_yarn,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let base = c.f32(1)?;
            let [factor, original, fast, slow, mscale, all] =
                [c.f32(2)?, c.f32(3)?, c.f32(4)?, c.f32(5)?, c.f32(6)?, c.f32(7)?];
            let dims = rope_dims(c, 8)?;
            let offset = c.offset();
            Ok(c.tensor(quote!(nn::rope_yarn(#x, #dims, #base, nn::YarnScaling {
                factor: f64::from(#factor),
                original_ctx: f64::from(#original),
                beta_fast: f64::from(#fast),
                beta_slow: f64::from(#slow),
                mscale: f64::from(#mscale),
                mscale_all_dim: f64::from(#all),
            }, #offset)?)))
        },
        }),
        statik: None,
        result: "same shape, rank 4",
        doc: "rotary position embedding with YaRN's frequency scaling and attention factor (`rope_type: \"yarn\"`)",
    },
    Builtin {
        name: "alibi",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("heads", Slot::Int, Required), p("len", Slot::Int, Required)],
            rule: r::alibi,
            lower: |c| {
            let heads = c.i32(0)?;
            // Over a sequence length, the queries follow the cached tokens and the bias covers
            // the cached keys too.
            let start = c.positions_start(1);
            let len = c.i32(1)?;
            Ok(c.tensor(quote!(nn::alibi(#heads, #start, #len)?)))
        },
        }),
        statik: None,
        result: "`[heads, len, len]` float",
        doc: "ALiBi's additive attention bias (MPT's slopes)",
    },
    Builtin {
        name: "sinusoidal",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("len", Slot::Int, Required), p("dim", Slot::Int, Required)],
            rule: r::sinusoidal,
            lower: |c| {
            let start = c.positions_start(0);
            let len = c.i32(0)?;
            let dim = c.i32(1)?;
            Ok(c.tensor(quote!(nn::sinusoidal(#start, #len, #dim)?)))
        },
        }),
        statik: None,
        result: "`[len, dim]` float",
        doc: "sinusoidal position table",
    },
    Builtin {
        name: "one_hot",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("indices", Tensor, Required), p("n", Slot::Int, Required)],
            rule: r::one_hot,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let n = c.i32(1)?;
            Ok(c.tensor(quote!(nn::one_hot(#x, #n)?)))
        },
        }),
        statik: None,
        result: "`indices`' shape plus `[n]`, float",
        doc: "one-hot rows of int indices",
    },
    Builtin {
        name: "argsort",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: X_AXIS,
            rule: r::along_axis_int,
            lower: |c| {
                let x = c.tensor_ref(0)?;
                let axis = c.i32(1)?;
                Ok(c.tensor(quote!(ops::argsort_axis(#x, #axis)?)))
            },
        }),
        statik: None,
        result: "same shape, int",
        doc: "indices that sort `axis`",
    },
    Builtin {
        name: "argpartition",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
                p("x", Tensor, Required),
                p("kth", Slot::Int, Required),
                p("axis", Axis, Int(-1)),
            ],
            rule: r::argpartition,
            lower: |c| {
                let x = c.tensor_ref(0)?;
                let kth = c.i32(1)?;
                let axis = c.i32(2)?;
                Ok(c.tensor(quote!(ops::argpartition_axis(#x, #kth, #axis)?)))
            },
        }),
        statik: None,
        result: "same shape, int",
        doc: "indices that partition `axis` around its `kth` element",
    },
    Builtin {
        name: "top_k",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("x", Tensor, Required), p("k", Slot::Int, Required)],
            rule: r::top_k,
            lower: |c| {
            let x = c.tensor_ref(0)?;
            let k = c.i32(1)?;
            Ok(c.pair(quote!(nn::top_k(#x, #k)?)))
        },
        }),
        statik: None,
        result: "(values, int indices), the last axis `k` wide",
        doc: "the `k` largest values of the last axis and their indices",
    },
    Builtin {
        name: "take_along_axis",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
            p("x", Tensor, Required),
            p("indices", Tensor, Required),
            p("axis", Axis, Int(-1)),
        ],
            rule: r::take_along_axis,
            lower: |c| {
            let x = c.tensor_value(0)?;
            let i = c.tensor_ref(1)?;
            let axis = c.i32(2)?;
            Ok(c.tensor(quote!(#x.take_along_axis(#i, #axis)?)))
        },
        }),
        statik: None,
        result: "`indices`' shape",
        doc: "elements gathered along an axis",
    },
    Builtin {
        name: "switch_glu",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
                p("x", Tensor, Required),
                p("indices", Tensor, Required),
                p("gate", Tensor, Required),
                p("up", Tensor, Required),
                p("down", Tensor, Required),
            ],
            rule: experts::switch_glu,
            lower: |c| {
                let [x, i, g, u, d] = [
                    c.tensor_ref(0)?,
                    c.tensor_ref(1)?,
                    c.tensor_ref(2)?,
                    c.tensor_ref(3)?,
                    c.tensor_ref(4)?,
                ];
                Ok(c.tensor(quote!(nn::switch_glu(#x, #i, #g, #u, #d)?)))
            },
        }),
        statik: None,
        result: "`indices`' shape plus `[d_out]`: one row per chosen expert",
        doc: "gathered sparse experts (mlx-lm's `SwitchGLU`): `down(silu(gate(x)) * up(x))` of each token `x [.., d]` through only the experts `indices [.., k]` chose, the experts' weights stacked `[experts, out, in]` (`gate`, `up` `[experts, hidden, d]`, `down` `[experts, d_out, hidden]`); MLX's `gather_mm`, rows sorted by expert from 64 on",
    },
    Builtin {
        name: "route_groups",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
                p("scores", Tensor, Required),
                p("bias", Tensor, Required),
                p("k", Slot::Int, Required),
                p("groups", Slot::Int, Int(1)),
                p("topk_groups", Slot::Int, Int(1)),
            ],
            rule: experts::route_groups,
            lower: |c| {
                let [scores, bias] = [c.tensor_ref(0)?, c.tensor_ref(1)?];
                let [k, groups, topk] = [c.i32(2)?, c.i32(3)?, c.i32(4)?];
                Ok(c.tensor(quote!(nn::route_groups(#scores, #bias, #k, #groups, #topk)?)))
            },
        }),
        statik: None,
        result: "int `[.., k]`: the chosen experts",
        doc: "DeepSeek-V3's choice of experts: the `k` best of `scores + bias` (`scores [.., experts]`, the selection bias `bias [experts]`, auxiliary-loss-free balancing's `e_score_correction_bias`) among the `topk_groups` of `groups` equal groups of experts whose two best biased scores sum highest; no gradient flows through the choice (weigh the chosen experts by `take_along_axis(scores, indices)`)",
    },
    Builtin {
        name: "balance",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[
                p("y", Tensor, Required),
                p("probs", Tensor, Required),
                p("indices", Tensor, Required),
                p("coef", Slot::Float, Required),
            ],
            rule: experts::balance,
            lower: |c| {
                let [y, probs, i] = [c.tensor_ref(0)?, c.tensor_ref(1)?, c.tensor_ref(2)?];
                let coef = c.f32(3)?;
                Ok(c.tensor(quote!(nn::balance(#y, #probs, #i, #coef)?)))
            },
        }),
        statik: None,
        result: "`y`",
        doc: "`y` unchanged, while training adds `coef` times the Switch Transformer's load-balancing loss of the router's probabilities `probs [.., experts]` and choices `indices [.., k]` (transformers' `load_balancing_loss_func`) to the gradient; the reported loss stays the model's",
    },
    Builtin {
        name: "cross_entropy",
        site: Site::Anywhere,
        tensor: Some(TensorForm {
            params: &[p("logits", Tensor, Required), p("targets", Tensor, Required)],
            rule: r::cross_entropy,
            lower: |c| {
            let l = c.tensor_ref(0)?;
            let y = c.tensor_ref(1)?;
            Ok(c.tensor(quote!(nn::cross_entropy(#l, #y)?)))
        },
        }),
        statik: None,
        result: "scalar; logits are the targets' shape plus a class axis",
        doc: "mean cross-entropy of int class ids, in float32",
    },
    Builtin {
        name: "len",
        site: Site::Anywhere,
        tensor: None,
        statik: Some(StaticForm {
            arity: 1,
            ty: |t| match t {
                [StaticTy::Str] => Ok(StaticTy::Int(None)),
                _ => Err("takes a string"),
            },
            eval: |v| match v {
                [Value::Str(s)] => Ok(Value::Int(s.chars().count() as i64)),
                _ => Err("takes a string"),
            },
            lower: |a| {
                let s = &a[0].ts;
                quote!((#s.chars().count() as i64))
            },
        }),
        result: "static int",
        doc: "the number of characters of a static string",
    },
    Builtin {
        name: "int",
        site: Site::Anywhere,
        tensor: None,
        statik: Some(StaticForm {
            arity: 1,
            ty: |t| match t {
                [StaticTy::Int(d)] => Ok(StaticTy::Int(d.clone())),
                [StaticTy::Float] => Ok(StaticTy::Int(None)),
                _ => Err("takes a number"),
            },
            eval: |v| match v {
                [Value::Int(i)] => Ok(Value::Int(*i)),
                [Value::Float(x)] if x.is_finite() && x.abs() < 9.2e18 => {
                    Ok(Value::Int(x.trunc() as i64))
                }
                [Value::Float(_)] => Err("the number does not fit a 64-bit integer"),
                _ => Err("takes a number"),
            },
            lower: |a| {
                let s = &a[0].ts;
                quote!((#s as i64))
            },
        }),
        result: "static int (truncated)",
        doc: "a static number as an int",
    },
    Builtin {
        name: "float",
        site: Site::Anywhere,
        tensor: None,
        statik: Some(StaticForm {
            arity: 1,
            ty: s::number_to_float,
            eval: |v| s::float_arg(v).map(Value::Float),
            lower: |a| s::as_f64_operand(&a[0]),
        }),
        result: "static float",
        doc: "a static number as a float",
    },
    Builtin {
        name: "bool",
        site: Site::Anywhere,
        tensor: None,
        statik: Some(StaticForm {
            arity: 1,
            ty: |t| match t {
                [StaticTy::Bool | StaticTy::Int(_) | StaticTy::Float] => Ok(StaticTy::Bool),
                _ => Err("takes a number or a bool"),
            },
            eval: |v| match v {
                [Value::Bool(b)] => Ok(Value::Bool(*b)),
                [Value::Int(i)] => Ok(Value::Bool(*i != 0)),
                [Value::Float(x)] => Ok(Value::Bool(*x != 0.0)),
                _ => Err("takes a number or a bool"),
            },
            lower: |a| {
                let s = &a[0].ts;
                match a[0].ty {
                    StaticTy::Bool => quote!(#s),
                    StaticTy::Float => quote!((#s != 0.0)),
                    _ => quote!((#s != 0)),
                }
            },
        }),
        result: "static bool",
        doc: "a static number as a bool (nonzero is true)",
    },
];
