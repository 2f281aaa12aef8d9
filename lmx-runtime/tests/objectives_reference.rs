//! lmx's training objectives against lmxlab's formulas: Python MLX references on the same inputs
//! (`fixtures/objectives/make_fixtures.py`), small cases by hand in f64, and gradients by finite
//! differences through a tiny bigram model.

use lmx_runtime::objectives::{
    distillation_loss, dpo_loss, group_advantages, grpo_loss, sequence_logprobs, soft_target_loss,
    token_logprobs,
};
use lmx_runtime::Result;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::{random, Array};
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/objectives/objectives.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn shape(v: &Value) -> Vec<i32> {
    v.as_array()
        .expect("a shape")
        .iter()
        .map(|x| x.as_i64().expect("an int") as i32)
        .collect()
}

fn array(v: &Value, shape: &[i32]) -> Array {
    Array::from_slice(&floats(v), shape)
}

fn ints(v: &Value, shape: &[i32]) -> Array {
    let ids: Vec<i32> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_i64().expect("an int") as i32)
        .collect();
    Array::from_slice(&ids, shape)
}

fn scalar(a: &Array) -> f32 {
    a.eval().expect("eval");
    a.item_exact::<f32>()
}

/// Within 1e-5, relative to the value's size where it exceeds 1.
fn close(what: &str, got: f32, want: f64) {
    let tolerance = 1e-5 * want.abs().max(1.0);
    assert!(
        (f64::from(got) - want).abs() <= tolerance,
        "{what}: got {got}, the reference {want}"
    );
}

#[test]
fn dpo_matches_the_python_reference() -> Result<()> {
    let f = fixture();
    let d = &f["dpo"];
    let dims = shape(&d["shape"]);
    let targets = |name: &str| ints(&d[name], &dims[..2]);
    let (chosen, rejected) = (targets("chosen"), targets("rejected"));
    let logits = |name: &str| array(&d["logits"][name], &dims);
    let seq = |name: &str, targets: &Array| sequence_logprobs(&logits(name), targets);
    let pc = seq("policy_chosen", &chosen)?;
    let pr = seq("policy_rejected", &rejected)?;
    let rc = seq("reference_chosen", &chosen)?;
    let rr = seq("reference_rejected", &rejected)?;
    for (name, got) in [
        ("policy_chosen", &pc),
        ("policy_rejected", &pr),
        ("reference_chosen", &rc),
        ("reference_rejected", &rr),
    ] {
        got.eval()?;
        let want = floats(&d["sequence_logprobs"][name]);
        for (g, w) in got.as_slice::<f32>().iter().zip(want) {
            close(name, *g, f64::from(w));
        }
    }
    let beta = d["beta"].as_f64().expect("beta") as f32;
    let out = dpo_loss(&pc, &pr, &rc, &rr, beta)?;
    close("loss", scalar(&out.loss), d["loss"].as_f64().expect("loss"));
    close(
        "reward margin",
        scalar(&out.reward_margin),
        d["reward_margin"].as_f64().expect("margin"),
    );
    close(
        "accuracy",
        scalar(&out.accuracy),
        d["accuracy"].as_f64().expect("accuracy"),
    );
    Ok(())
}

#[test]
fn distillation_matches_the_python_reference() -> Result<()> {
    let f = fixture();
    let d = &f["distillation"];
    let dims = shape(&d["shape"]);
    let student = array(&d["student"], &dims);
    let teacher = array(&d["teacher"], &dims);
    let targets = ints(&d["targets"], &dims[..2]);
    for case in d["cases"].as_array().expect("cases") {
        let temperature = case["temperature"].as_f64().expect("T") as f32;
        let alpha = case["alpha"].as_f64().expect("alpha") as f32;
        let soft = soft_target_loss(&student, &teacher, temperature)?;
        let total = distillation_loss(&student, &teacher, &targets, temperature, alpha)?;
        let label = format!("T={temperature} alpha={alpha}");
        close(
            &format!("soft target loss, {label}"),
            scalar(&soft),
            case["soft_target_loss"].as_f64().expect("soft"),
        );
        close(
            &format!("distillation loss, {label}"),
            scalar(&total),
            case["distillation_loss"].as_f64().expect("total"),
        );
    }
    Ok(())
}

#[test]
fn grpo_matches_the_python_reference() -> Result<()> {
    let f = fixture();
    let d = &f["grpo"];
    let dims = shape(&d["shape"]);
    let get = |name: &str| array(&d[name], &dims);
    let rewards = array(&d["rewards"], &[dims[0]]);
    let group = d["group"].as_u64().expect("group") as usize;
    let advantages = group_advantages(&rewards, group)?;
    advantages.eval()?;
    for (g, w) in advantages
        .as_slice::<f32>()
        .iter()
        .zip(floats(&d["advantages"]))
    {
        close("advantage", *g, f64::from(w));
    }
    let out = grpo_loss(
        &get("policy"),
        &get("old"),
        &get("reference"),
        &get("mask"),
        &advantages,
        d["beta"].as_f64().expect("beta") as f32,
        d["epsilon"].as_f64().expect("epsilon") as f32,
    )?;
    close("loss", scalar(&out.loss), d["loss"].as_f64().expect("loss"));
    close("kl", scalar(&out.kl), d["kl"].as_f64().expect("kl"));
    close(
        "clip fraction",
        scalar(&out.clip_fraction),
        d["clip_fraction"].as_f64().expect("clip"),
    );
    assert!(group_advantages(&rewards, 3).is_err());
    Ok(())
}

/// Logits `[0, ln 2, ln 3]`: probabilities 1/6, 2/6, 3/6.
fn thirds() -> Array {
    let (two, three) = (2f64.ln() as f32, 3f64.ln() as f32);
    Array::from_slice(&[0.0, two, three, 0.0, two, three], &[1, 2, 3])
}

#[test]
fn small_cases_by_hand() -> Result<()> {
    // Sequence log-probability: the prompt position is masked, the response's target is class 2.
    let targets = Array::from_slice(&[-100, 2], &[1, 2]);
    let tokens = token_logprobs(&thirds(), &targets)?;
    tokens.eval()?;
    assert_eq!(tokens.as_slice::<f32>()[0], 0.0);
    close(
        "log p",
        scalar(&sequence_logprobs(&thirds(), &targets)?),
        0.5f64.ln(),
    );

    // DPO: margin β((π_c - ρ_c) - (π_r - ρ_r)) = 0.5 ((-1 + 1.5) - (-2 + 1.5)) = 0.5.
    let one = |x: f32| Array::from_slice(&[x], &[1]);
    let out = dpo_loss(&one(-1.0), &one(-2.0), &one(-1.5), &one(-1.5), 0.5)?;
    close("dpo", scalar(&out.loss), (1.0 + (-0.5f64).exp()).ln());
    close("dpo margin", scalar(&out.reward_margin), 0.5);
    close("dpo accuracy", scalar(&out.accuracy), 1.0);

    // Distillation at T = 1, alpha = 1: KL(uniform || [1/4, 3/4]) = ½ ln 2 + ½ ln(2/3).
    let student = Array::from_slice(&[0.0, 3f64.ln() as f32], &[1, 1, 2]);
    let teacher = Array::from_slice(&[0.0f32, 0.0], &[1, 1, 2]);
    let kl = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
    close(
        "soft",
        scalar(&soft_target_loss(&student, &teacher, 1.0)?),
        kl,
    );
    // At T = 2 the student's logits halve: [1/(1+√3), √3/(1+√3)], and the result is times 4.
    let s3 = 3f64.sqrt();
    let kl2 = 0.5 * (0.5 * (1.0 + s3)).ln() + 0.5 * (0.5 * (1.0 + s3) / s3).ln();
    close(
        "soft T=2",
        scalar(&soft_target_loss(&student, &teacher, 2.0)?),
        4.0 * kl2,
    );
    // alpha = 0.25 mixes in ¾ of the hard loss, -ln(3/4) for target 1.
    let hard = Array::from_slice(&[1], &[1, 1]);
    close(
        "distillation",
        scalar(&distillation_loss(&student, &teacher, &hard, 1.0, 0.25)?),
        0.25 * kl - 0.75 * 0.75f64.ln(),
    );

    // GRPO: group [1, 0] gives advantages ±1/(0.5 + 1e-8)·0.5; the first completion's one token
    // has ratio 1.5 (clipped to 1.2) and a reference ln 2 below the policy.
    let adv = group_advantages(&Array::from_slice(&[1.0f32, 0.0], &[2]), 2)?;
    adv.eval()?;
    close("advantage", adv.as_slice::<f32>()[0], 0.5 / (0.5 + 1e-8));
    let policy = Array::from_slice(&[-1.0f32, -1.0], &[2, 1]);
    let old = Array::from_slice(&[-1.0 - 1.5f64.ln() as f32, -1.0], &[2, 1]);
    let reference = Array::from_slice(&[-1.0 - 2f64.ln() as f32, -1.0], &[2, 1]);
    let mask = Array::from_slice(&[1.0f32, 0.0], &[2, 1]);
    let out = grpo_loss(&policy, &old, &reference, &mask, &adv, 0.1, 0.2)?;
    let kl = 0.5 + 2f64.ln() - 1.0;
    // The second completion has no kept token: it contributes 0 to the mean over completions.
    close("grpo", scalar(&out.loss), -(1.2 - 0.1 * kl) / 2.0);
    close("grpo kl", scalar(&out.kl), kl);
    close("grpo clip fraction", scalar(&out.clip_fraction), 1.0);
    Ok(())
}

/// A bigram model: logits `[B, T, V]` are rows of the one parameter `[V, V]`.
fn bigram(weights: &Array, tokens: &Array) -> Result<Array> {
    Ok(weights.take_axis(tokens, 0)?)
}

/// The gradient of `loss` at `w` by MLX, against central differences of step 1e-2 at every
/// coordinate (float32; the tolerance covers the differences' rounding and curvature error).
fn check_gradient(what: &str, w: &Array, loss: impl Fn(&Array) -> Result<Array> + Copy) {
    let objective =
        move |args: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
            loss(&args[0])
                .map(|l| vec![l])
                .map_err(lmx_runtime::Error::into_exception)
        };
    let (_, grads) =
        value_and_grad_with_argnums(objective, &[0])(std::slice::from_ref(w)).expect("grad");
    let grad = grads[0].clone();
    grad.eval().expect("eval");
    let analytic = grad.as_slice::<f32>().to_vec();
    w.eval().expect("eval");
    let base = w.as_slice::<f32>().to_vec();
    let h = 1e-2f32;
    let mut worst = 0f32;
    for i in 0..base.len() {
        let at = |delta: f32| {
            let mut shifted = base.clone();
            shifted[i] += delta;
            scalar(&loss(&Array::from_slice(&shifted, w.shape())).expect("loss"))
        };
        let numeric = (at(h) - at(-h)) / (2.0 * h);
        worst = worst.max((numeric - analytic[i]).abs());
    }
    let scale = analytic.iter().fold(0f32, |m, g| m.max(g.abs()));
    assert!(
        scale > 1e-3,
        "{what}: the gradient vanishes, the check proves nothing"
    );
    assert!(
        worst < 2e-3,
        "{what}: finite differences differ by {worst} (|g| up to {scale})"
    );
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let v = 5;
    let key = random::key(3)?;
    let (k1, k2) = random::split(&key, 2)?;
    let policy = random::normal::<f32>(&[v, v], None, None, &k1)?;
    let frozen = random::normal::<f32>(&[v, v], None, None, &k2)?;
    let tokens = Array::from_slice(&[0, 1, 2, 3, 4, 2, 1, 0], &[2, 4]);
    let chosen = Array::from_slice(&[-100, 2, 3, 4, -100, 1, 0, 3], &[2, 4]);
    let rejected = Array::from_slice(&[-100, 0, 0, 1, -100, 4, 4, 2], &[2, 4]);
    let (tk, ck, rk, fz) = (&tokens, &chosen, &rejected, &frozen);

    check_gradient("dpo", &policy, move |w| {
        let logits = bigram(w, tk)?;
        let reference = bigram(fz, tk)?;
        let lp = |l: &Array, t: &Array| sequence_logprobs(l, t);
        // A scaled-up β so that the loss is not flat at the reference.
        Ok(dpo_loss(
            &lp(&logits, ck)?,
            &lp(&logits, rk)?,
            &lp(&reference, ck)?,
            &lp(&reference, rk)?,
            1.0,
        )?
        .loss)
    });
    check_gradient("distillation", &policy, move |w| {
        distillation_loss(&bigram(w, tk)?, &bigram(fz, tk)?, ck, 2.0, 0.7)
    });
    let mask = ck
        .ge(Array::from_int(0))?
        .as_dtype(mlx_rs::Dtype::Float32)?;
    let advantages = group_advantages(&Array::from_slice(&[1.0f32, 0.0], &[2]), 2)?;
    let old = token_logprobs(
        &bigram(&frozen.multiply(Array::from_f32(0.9))?, &tokens)?,
        &chosen,
    )?;
    let (mk, ak, ok) = (&mask, &advantages, &old);
    check_gradient("grpo", &policy, move |w| {
        let policy = token_logprobs(&bigram(w, tk)?, ck)?;
        let reference = token_logprobs(&bigram(fz, tk)?, ck)?;
        // A wide clip range keeps the surrogate smooth around these ratios.
        Ok(grpo_loss(&policy, ok, &reference, mk, ak, 0.1, 10.0)?.loss)
    });
    Ok(())
}
