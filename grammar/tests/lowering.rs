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
        proj(a + b + c + d + e)
    }
}
"#;

/// `silu(gate) * up`, in either order and with `silu`'s argument by keyword, is one gated
/// product whose first factor is bound before the second is lowered; a static factor, or any
/// other product, stays as written.
#[test]
fn a_silu_gated_product_is_one_function() {
    let model =
        lmx_grammar::check_source("gated.lmx", MODEL).unwrap_or_else(|text| panic!("{text}"));
    let code = lmx_grammar::codegen::generate_module(&model, "")
        .unwrap_or_else(|d| panic!("{}", lmx_grammar::render(&d, "gated.lmx", MODEL)))
        .to_string();
    let code: String = code.split_whitespace().collect();
    assert_eq!(code.matches("nn::swiglu(").count(), 3, "{code}");
    assert_eq!(code.matches("nn::silu(").count(), 2, "{code}");
    // Both orders: the first factor's linear layer bound, then the call over both.
    for (first, second) in [("gate", "up"), ("up", "gate")] {
        let bound = format!("=pass.linear(&params.{first},&x)?;");
        let at = code
            .find(&bound)
            .unwrap_or_else(|| panic!("{first} not bound: {code}"));
        let rest = &code[at..];
        let second = format!("pass.linear(&params.{second},&x)?");
        assert!(rest
            .find("nn::swiglu(")
            .is_some_and(|c| rest.find(&second).is_some_and(|s| s > c)));
    }
    assert!(code.contains(".multiply("), "{code}");
}
