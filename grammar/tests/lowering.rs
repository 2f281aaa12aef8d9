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
/// (`nn::gated_linear_in`), as are another activation's gated product (Gemma's GELU) and a
/// built-in activation of the input (`nn::activated_linear_in`); a static
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
        code.matches("nn::gated_linear_in(&params.down,nn::Activation::Silu,")
            .count(),
        3,
        "{code}"
    );
    assert_eq!(
        code.matches("nn::gated_linear_in(&params.down,nn::Activation::GeluTanh,")
            .count(),
        1,
        "{code}"
    );
    assert_eq!(code.matches("nn::swiglu(").count(), 1, "{code}");
    assert_eq!(
        code.matches("nn::activated_linear_in(&params.down,nn::Activation::Gelu,")
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
        assert!(code[at..].contains("nn::gated_linear_in("), "{code}");
    }
    assert!(!code.contains("pass.linear(&params.gate,"), "{code}");
    assert!(code.contains("pass.linear(&params.down,"), "{code}");
    assert!(code.contains(".multiply("), "{code}");
}
