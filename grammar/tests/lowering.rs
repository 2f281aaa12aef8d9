//! What the code generator lowers particular forms to.

const MODEL: &str = r#"
model Gated {
    config {
        vocab: int = 256
        d_model: int = 64
        d_ff: int = 128
    }
    params {
        wte: embedding(vocab, d_model)
        gate: linear(d_model, d_ff, bias = false)
        up: linear(d_model, d_ff, bias = false)
        down: linear(d_ff, d_model, bias = false)
        proj: linear(d_model, vocab)
    }
    forward(tokens: [B, T] int) -> [B, T, vocab] {
        let x = wte(tokens)
        let a = down(silu(gate(x)) * up(x))
        let b = down(up(x) * silu(gate(x)))
        let c = silu(x) * 2.0 + 2.0 * silu(x)
        let d = sigmoid(x) * x
        let e = down(silu(x = gate(x)) * up(x))
        let f = down(2.0 * (silu(gate(x)) * up(x)))
        let g = down(gelu(gate(x) + up(x)))
        let h = down(gelu_approx(gate(x)) * up(x))
        proj(a + b + c + d + e + f + g + h)
    }
}
"#;

/// `silu(gate) * up`, in either order and with `silu`'s argument by keyword, is one gated
/// product whose factors are bound first (here both linear layers on `x`, applied together in
/// the source's order); as a linear layer's whole input it is one call with the layer
/// (`nn::linear_plus_in` of a gated input), as are another activation's gated product (Gemma's
/// GELU) and a built-in activation of the input (`nn::linear_plus_in` of an activated one),
/// none of them the model's last call (no residual); a static
/// factor, or any other product, stays as written.
#[test]
fn a_silu_gated_product_is_one_function() {
    let model =
        lmx_grammar::check_source("gated.lmx", MODEL).unwrap_or_else(|text| panic!("{text}"));
    let code = lmx_grammar::codegen::generate_module(&model, "")
        .unwrap_or_else(|d| panic!("{}", lmx_grammar::render(&d, "gated.lmx", MODEL)))
        .to_string();
    let code: String = code.split_whitespace().collect();
    assert_eq!(
        code.matches("nn::linear_plus_in(&params.down,nn::LayerInput::Gated(nn::Activation::Silu,")
            .count(),
        3,
        "{code}"
    );
    assert_eq!(
        code.matches(
            "nn::linear_plus_in(&params.down,nn::LayerInput::Gated(nn::Activation::GeluTanh,"
        )
        .count(),
        1,
        "{code}"
    );
    assert_eq!(code.matches("nn::swiglu(").count(), 1, "{code}");
    assert_eq!(
        code.matches(
            "nn::linear_plus_in(&params.down,nn::LayerInput::Activated(nn::Activation::Gelu,"
        )
        .count(),
        1,
        "{code}"
    );
    assert_eq!(code.matches("nn::silu(").count(), 2, "{code}");
    // Both orders: the two linear layers on `x` applied together in the source's order (so
    // that what they draw from the step's key they draw in that order), then the call over both.
    for (first, second) in [("gate", "up"), ("up", "gate")] {
        let bound = format!("=pass.linears([&params.{first},&params.{second}],&x)?;");
        let at = code
            .find(&bound)
            .unwrap_or_else(|| panic!("{first} and {second} not bound: {code}"));
        assert!(code[at..].contains("nn::LayerInput::Gated("), "{code}");
    }
    assert!(!code.contains("pass.linear(&params.gate,"), "{code}");
    assert!(code.contains("pass.linear(&params.down,"), "{code}");
    assert!(code.contains(".multiply("), "{code}");
    assert_eq!(code.matches(",None,pass.ctx)?").count(), 5, "{code}");
}

const RESIDUAL: &str = r#"
model Residual {
    config {
        vocab: int = 256
        d_model: int = 64
        d_ff: int = 128
    }
    block Attn {
        params {
            q: linear(d_model, d_model, bias = false)
            o: linear(d_model, d_model, bias = false)
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            o(q(x))
        }
    }
    block Mlp {
        params {
            gate: linear(d_model, d_ff, bias = false)
            up: linear(d_model, d_ff, bias = false)
            down: linear(d_ff, d_model, bias = false)
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            down(silu(gate(x)) * up(x))
        }
    }
    block Activated {
        params {
            p: linear(d_model, d_model)
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            silu(p(x))
        }
    }
    block Layer {
        params {
            norm: rms_norm(d_model, eps = 1e-5)
            attn: Attn
            mlp: Mlp
            activated: Activated
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            let x = x + attn(norm(x))
            let y = mlp(norm(x)) + x
            let z = activated(y) + y
            let w = dropout(attn(z), 0.25) + z
            w + attn(y) * 2.0
        }
    }
    params {
        wte: embedding(vocab, d_model)
        layer: Layer
        head: linear(d_model, vocab)
    }
    forward(tokens: [B, T] int) -> [B, T, vocab] {
        head(layer(wte(tokens)))
    }
}
"#;

/// A block whose last call is a linear layer takes a residual, which that layer adds to its
/// output (`nn::linear_plus_in`, one launch in decoding), whatever its input's form; a sum of a
/// tensor variable and a call of such a block, in either order, is that call with the variable
/// as its residual, as is a sum of the variable and the block's output through dropout (the
/// dropout applied to the layer's output before the sum); any other call of it passes none. A
/// block whose last call is not a linear layer's takes none, and a sum over it stays as
/// written.
#[test]
fn a_residual_sum_over_a_block_is_its_last_layers_sum() {
    let model =
        lmx_grammar::check_source("residual.lmx", RESIDUAL).unwrap_or_else(|text| panic!("{text}"));
    let code = lmx_grammar::codegen::generate_module(&model, "")
        .unwrap_or_else(|d| panic!("{}", lmx_grammar::render(&d, "residual.lmx", RESIDUAL)))
        .to_string();
    let code: String = code.split_whitespace().collect();
    assert_eq!(
        code.matches("residual:Option<nn::Residual<'_>>").count(),
        2,
        "{code}"
    );
    assert!(
        code.contains("nn::linear_plus_in(&self.o,nn::LayerInput::Plain(&"),
        "{code}"
    );
    assert!(
        code.contains("nn::linear_plus_in(&self.down,nn::LayerInput::Gated(nn::Activation::Silu,"),
        "{code}"
    );
    assert_eq!(code.matches(",residual,pass.ctx)").count(), 2, "{code}");
    assert!(code.contains("pass.linear(&self.p,"), "{code}");
    // `x + attn(..)` and `mlp(..) + x`: the variable as the call's residual.
    assert_eq!(
        code.matches(",Some(nn::Residual::new(x,0.0)))?").count(),
        1,
        "{code}"
    );
    assert_eq!(
        code.matches(",Some(nn::Residual::new(&x,0.0)))?").count(),
        1,
        "{code}"
    );
    assert_eq!(
        code.matches("self.attn.forward(pass,&z,Some(nn::Residual::new(&z,0.25)))?")
            .count(),
        1,
        "{code}"
    );
    assert!(!code.contains("dropout("), "{code}");
    // `attn(y) * 2.0` passes none; `activated(y) + y` stays a sum.
    assert_eq!(
        code.matches("self.attn.forward(pass,&y,None)?").count(),
        1,
        "{code}"
    );
    assert!(code.contains(".add(&y)"), "{code}");
}
