//! Every optimizer against a hand-written f64 reference of its published update rule: a few
//! steps on a tiny parameter with a fixed gradient sequence and a changing learning rate, to 1e-6
//! relative. The references take the configured f32 hyperparameters widened to f64, and share no
//! code with the optimizers.

use lmx_runtime::optim::{
    Adafactor, AdafactorLeaf, Adam, AdamW, Lion, Optimizer, SecondMoment, Sgd, StepScalars,
};
use lmx_runtime::Result;
use mlx_rs::Array;

/// A tiny problem: the initial parameter, a gradient per step and a learning rate per step.
struct Problem {
    shape: Vec<i32>,
    init: Vec<f64>,
    grads: Vec<Vec<f64>>,
    lrs: Vec<f32>,
}

/// A 2-element vector over three steps.
fn vector() -> Problem {
    Problem {
        shape: vec![2],
        init: vec![1.0, -2.0],
        grads: vec![vec![0.5, -1.5], vec![0.25, 2.0], vec![-0.75, 0.125]],
        lrs: vec![0.1, 0.05, 0.02],
    }
}

/// A 3x2 matrix over three steps (not square, so that rows and columns cannot be confused).
fn matrix() -> Problem {
    Problem {
        shape: vec![3, 2],
        init: vec![1.0, -2.0, 0.5, 1.5, -1.0, 3.0],
        grads: vec![
            vec![0.5, -1.5, 0.25, 1.0, -0.5, 2.0],
            vec![0.25, 2.0, -1.0, 0.5, 0.75, -0.25],
            vec![-0.75, 0.125, 0.5, -2.0, 1.5, 0.25],
        ],
        lrs: vec![0.1, 0.05, 0.02],
    }
}

fn array(values: &[f64], shape: &[i32]) -> Array {
    let values: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    Array::from_slice(&values, shape)
}

fn values(array: &Array) -> Vec<f64> {
    array
        .as_slice::<f32>()
        .iter()
        .map(|&v| f64::from(v))
        .collect()
}

/// The parameter after each step of `optimizer` on `problem`.
fn run<O: Optimizer>(optimizer: &O, problem: &Problem, decay: bool) -> Result<Vec<Vec<f64>>> {
    let mut param = array(&problem.init, &problem.shape);
    let mut state = optimizer.init(&param)?;
    let mut out = Vec::new();
    for (t, (grad, &lr)) in problem.grads.iter().zip(&problem.lrs).enumerate() {
        let (lr, step) = (Array::from_f32(lr), Array::from_f32(t as f32 + 1.0));
        let scalars = StepScalars {
            lr: &lr,
            step: &step,
        };
        let grad = array(grad, &problem.shape);
        (param, state) = optimizer.update(&param, &grad, &state, scalars, decay)?;
        out.push(values(&param));
    }
    Ok(out)
}

fn assert_close(actual: &[Vec<f64>], expected: &[Vec<f64>], what: &str) {
    assert_eq!(actual.len(), expected.len());
    for (step, (a, e)) in actual.iter().zip(expected).enumerate() {
        for (i, (a, e)) in a.iter().zip(e).enumerate() {
            let rel = (a - e).abs() / e.abs();
            assert!(
                rel <= 1e-6,
                "{what}: step {} element {i}: got {a}, expected {e} (rel {rel:e})",
                step + 1
            );
        }
    }
}

/// Each element's value after each step, given one update rule `f(t, lr, p, g, state) -> p'`.
fn reference<S: Clone>(
    problem: &Problem,
    init: S,
    mut f: impl FnMut(f64, f64, &[f64], &[f64], &mut S) -> Vec<f64>,
) -> Vec<Vec<f64>> {
    let mut p = problem.init.clone();
    let mut state = init;
    let mut out = Vec::new();
    for (t, (g, &lr)) in problem.grads.iter().zip(&problem.lrs).enumerate() {
        p = f(t as f64 + 1.0, f64::from(lr), &p, g, &mut state);
        out.push(p.clone());
    }
    out
}

// ---- Adam / AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²; p = p(1 - lr wd) - lr m̂/(√v̂ + eps)

fn adam_reference(problem: &Problem, adam: &Adam, weight_decay: f64) -> Vec<Vec<f64>> {
    let (b1, b2, eps) = (
        f64::from(adam.beta1),
        f64::from(adam.beta2),
        f64::from(adam.eps),
    );
    let n = problem.init.len();
    reference(
        problem,
        (vec![0.0; n], vec![0.0; n]),
        |t, lr, p, g, (m, v)| {
            (0..n)
                .map(|i| {
                    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                    v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                    let (m_hat, v_hat) = if adam.bias_correction {
                        (m[i] / (1.0 - b1.powf(t)), v[i] / (1.0 - b2.powf(t)))
                    } else {
                        (m[i], v[i])
                    };
                    p[i] * (1.0 - lr * weight_decay) - lr * m_hat / (v_hat.sqrt() + eps)
                })
                .collect()
        },
    )
}

#[test]
fn adam_without_bias_correction() -> Result<()> {
    let adam = Adam::default();
    assert!(!adam.bias_correction);
    let problem = vector();
    assert_close(
        &run(&adam, &problem, true)?,
        &adam_reference(&problem, &adam, 0.0),
        "adam",
    );
    Ok(())
}

#[test]
fn adam_with_bias_correction() -> Result<()> {
    let adam = Adam {
        bias_correction: true,
        ..Adam::default()
    };
    let problem = matrix();
    assert_close(
        &run(&adam, &problem, true)?,
        &adam_reference(&problem, &adam, 0.0),
        "adam, corrected",
    );
    Ok(())
}

#[test]
fn adamw_decays_only_where_the_mask_says() -> Result<()> {
    let adamw = AdamW {
        adam: Adam {
            bias_correction: true,
            ..Adam::default()
        },
        weight_decay: 0.25,
    };
    let problem = vector();
    let decayed = run(&adamw, &problem, true)?;
    assert_close(
        &decayed,
        &adam_reference(&problem, &adamw.adam, 0.25),
        "adamw, decay on",
    );
    let plain = run(&adamw, &problem, false)?;
    assert_close(
        &plain,
        &adam_reference(&problem, &adamw.adam, 0.0),
        "adamw, decay off",
    );
    assert_ne!(decayed, plain);
    Ok(())
}

// ---- SGD: g' = g + wd p; v = μ v + (1 - τ) g'; p -= lr (g' + μ v) (Nesterov) or lr v

fn sgd_reference(problem: &Problem, sgd: &Sgd, decay: bool) -> Vec<Vec<f64>> {
    let (mu, tau) = (f64::from(sgd.momentum), f64::from(sgd.dampening));
    let wd = if decay {
        f64::from(sgd.weight_decay)
    } else {
        0.0
    };
    let n = problem.init.len();
    reference(problem, vec![0.0; n], |_, lr, p, g, v| {
        (0..n)
            .map(|i| {
                let g = g[i] + wd * p[i];
                if mu == 0.0 {
                    return p[i] - lr * g;
                }
                v[i] = mu * v[i] + (1.0 - tau) * g;
                let direction = if sgd.nesterov { g + mu * v[i] } else { v[i] };
                p[i] - lr * direction
            })
            .collect()
    })
}

#[test]
fn sgd_plain_keeps_no_state() -> Result<()> {
    let sgd = Sgd {
        weight_decay: 0.125,
        ..Sgd::default()
    };
    let param = array(&[1.0, 2.0], &[2]);
    assert!(sgd.init(&param)?.velocity.is_none());
    let problem = vector();
    for decay in [true, false] {
        assert_close(
            &run(&sgd, &problem, decay)?,
            &sgd_reference(&problem, &sgd, decay),
            "sgd",
        );
    }
    Ok(())
}

#[test]
fn sgd_momentum_with_and_without_dampening() -> Result<()> {
    let problem = matrix();
    for dampening in [0.0, 0.25] {
        let sgd = Sgd {
            momentum: 0.875,
            dampening,
            weight_decay: 0.125,
            nesterov: false,
        };
        for decay in [true, false] {
            let what = format!("sgd momentum, dampening {dampening}, decay {decay}");
            assert_close(
                &run(&sgd, &problem, decay)?,
                &sgd_reference(&problem, &sgd, decay),
                &what,
            );
        }
    }
    Ok(())
}

#[test]
fn sgd_nesterov() -> Result<()> {
    let sgd = Sgd {
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.0625,
        ..Sgd::default()
    };
    let problem = vector();
    for decay in [true, false] {
        assert_close(
            &run(&sgd, &problem, decay)?,
            &sgd_reference(&problem, &sgd, decay),
            "nesterov",
        );
    }
    Ok(())
}

#[test]
fn sgd_nesterov_needs_momentum_without_dampening() {
    let param = Array::from_slice(&[1.0_f32], &[1]);
    let no_momentum = Sgd {
        nesterov: true,
        ..Sgd::default()
    };
    assert!(no_momentum.init(&param).is_err());
    let dampened = Sgd {
        nesterov: true,
        momentum: 0.9,
        dampening: 0.1,
        ..Sgd::default()
    };
    assert!(dampened.init(&param).is_err());
}

// ---- Lion: c = b1 m + (1-b1) g; m = b2 m + (1-b2) g; p = p (1 - lr wd) - lr sign(c)

fn lion_reference(problem: &Problem, lion: &Lion, decay: bool) -> Vec<Vec<f64>> {
    let (b1, b2) = (f64::from(lion.beta1), f64::from(lion.beta2));
    let wd = if decay {
        f64::from(lion.weight_decay)
    } else {
        0.0
    };
    let n = problem.init.len();
    reference(problem, vec![0.0; n], |_, lr, p, g, m| {
        (0..n)
            .map(|i| {
                let c = b1 * m[i] + (1.0 - b1) * g[i];
                m[i] = b2 * m[i] + (1.0 - b2) * g[i];
                p[i] * (1.0 - lr * wd) - lr * c.signum()
            })
            .collect()
    })
}

#[test]
fn lion_default_and_with_weight_decay() -> Result<()> {
    let problem = matrix();
    let lion = Lion::default();
    assert_close(
        &run(&lion, &problem, true)?,
        &lion_reference(&problem, &lion, true),
        "lion",
    );
    let lion = Lion {
        weight_decay: 0.5,
        ..Lion::default()
    };
    for decay in [true, false] {
        assert_close(
            &run(&lion, &problem, decay)?,
            &lion_reference(&problem, &lion, decay),
            "lion, wd",
        );
    }
    Ok(())
}

// ---- Adafactor, MLX's definition (see `Adafactor`'s documentation)

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt()
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

#[derive(Clone)]
struct AdafactorState {
    row: Vec<f64>,
    col: Vec<f64>,
    v: Vec<f64>,
    m: Vec<f64>,
}

fn adafactor_reference(problem: &Problem, opt: &Adafactor, decay: bool) -> Vec<Vec<f64>> {
    let n = problem.init.len();
    let (rows, cols) = match problem.shape[..] {
        [r, c] => (r as usize, c as usize),
        _ => (0, 0),
    };
    let state = AdafactorState {
        row: vec![0.0; rows],
        col: vec![0.0; cols],
        v: vec![0.0; n],
        m: vec![0.0; n],
    };
    let eps1 = f64::from(opt.eps_square);
    reference(problem, state, |t, lr, p, g, s| {
        let rho = if opt.relative_step {
            let start = if opt.warmup_init { 1e-6 * t } else { 1e-2 };
            start.min(1.0 / t.sqrt())
        } else {
            lr
        };
        let alpha = if opt.scale_parameter {
            f64::from(opt.eps_scale).max(rms(p)) * rho
        } else {
            rho
        };
        let beta2 = 1.0 - t.powf(f64::from(opt.decay_rate));
        let sq: Vec<f64> = g.iter().map(|g| g * g + eps1).collect();
        let mut u: Vec<f64> = if rows > 0 {
            for i in 0..rows {
                s.row[i] = beta2 * s.row[i] + (1.0 - beta2) * mean(&sq[i * cols..(i + 1) * cols]);
            }
            for j in 0..cols {
                let column: Vec<f64> = (0..rows).map(|i| sq[i * cols + j]).collect();
                s.col[j] = beta2 * s.col[j] + (1.0 - beta2) * mean(&column);
            }
            let row_mean = mean(&s.row);
            (0..n)
                .map(|k| {
                    let (i, j) = (k / cols, k % cols);
                    g[k] / (s.row[i] / row_mean).sqrt() / s.col[j].sqrt()
                })
                .collect()
        } else {
            (0..n)
                .map(|k| {
                    s.v[k] = beta2 * s.v[k] + (1.0 - beta2) * sq[k];
                    g[k] / s.v[k].sqrt()
                })
                .collect()
        };
        let clip = (rms(&u) / f64::from(opt.clip_threshold)).max(1.0);
        for x in &mut u {
            *x = alpha * *x / clip;
        }
        if let Some(beta1) = opt.beta1 {
            let beta1 = f64::from(beta1);
            for (m, u) in s.m.iter_mut().zip(u.iter_mut()) {
                *m = beta1 * *m + (1.0 - beta1) * *u;
                *u = *m;
            }
        }
        let wd = if decay {
            f64::from(opt.weight_decay)
        } else {
            0.0
        };
        (0..n).map(|k| p[k] - wd * alpha * p[k] - u[k]).collect()
    })
}

#[test]
fn adafactor_state_is_factored_for_matrices_only() -> Result<()> {
    let opt = Adafactor {
        beta1: Some(0.9),
        ..Adafactor::default()
    };
    let AdafactorLeaf { second, first } = opt.init(&array(&[0.0; 6], &[3, 2]))?;
    match second {
        SecondMoment::Factored { row, col } => {
            assert_eq!((row.shape(), col.shape()), (&[3][..], &[2][..]));
        }
        SecondMoment::Full(_) => panic!("a matrix gets a factored second moment"),
    }
    assert_eq!(first.expect("beta1 is set").shape(), &[3, 2]);
    let AdafactorLeaf { second, first } = Adafactor::default().init(&array(&[0.0; 2], &[2]))?;
    assert!(matches!(second, SecondMoment::Full(v) if v.shape() == [2]));
    assert!(first.is_none());
    Ok(())
}

#[test]
fn adafactor_defaults_relative_step() -> Result<()> {
    let opt = Adafactor::default();
    for problem in [matrix(), vector()] {
        let what = format!("adafactor default {:?}", problem.shape);
        assert_close(
            &run(&opt, &problem, true)?,
            &adafactor_reference(&problem, &opt, true),
            &what,
        );
    }
    Ok(())
}

#[test]
fn adafactor_warmup_init() -> Result<()> {
    let opt = Adafactor {
        warmup_init: true,
        ..Adafactor::default()
    };
    let problem = matrix();
    assert_close(
        &run(&opt, &problem, true)?,
        &adafactor_reference(&problem, &opt, true),
        "warmup_init",
    );
    Ok(())
}

#[test]
fn adafactor_external_lr_first_moment_and_decay() -> Result<()> {
    let opt = Adafactor {
        relative_step: false,
        scale_parameter: false,
        beta1: Some(0.875),
        weight_decay: 0.25,
        clip_threshold: 2.0,
        ..Adafactor::default()
    };
    for problem in [matrix(), vector()] {
        for decay in [true, false] {
            let what = format!("adafactor external lr {:?} decay {decay}", problem.shape);
            assert_close(
                &run(&opt, &problem, decay)?,
                &adafactor_reference(&problem, &opt, decay),
                &what,
            );
        }
    }
    Ok(())
}

#[test]
fn adafactor_scaled_external_lr() -> Result<()> {
    let opt = Adafactor {
        relative_step: false,
        weight_decay: 0.125,
        ..Adafactor::default()
    };
    let problem = matrix();
    assert_close(
        &run(&opt, &problem, true)?,
        &adafactor_reference(&problem, &opt, true),
        "scaled lr",
    );
    Ok(())
}

#[test]
fn optimizers_are_configured_through_serde() {
    let sgd: Sgd = serde_json::from_str(r#"{"momentum": 0.9, "nesterov": true}"#).unwrap();
    assert_eq!(
        sgd,
        Sgd {
            momentum: 0.9,
            nesterov: true,
            ..Sgd::default()
        }
    );
    let lion: Lion = serde_json::from_str(r#"{"weight_decay": 0.1}"#).unwrap();
    assert_eq!(
        lion,
        Lion {
            weight_decay: 0.1,
            ..Lion::default()
        }
    );
    let adafactor: Adafactor =
        serde_json::from_str(r#"{"relative_step": false, "beta1": 0.9}"#).unwrap();
    assert_eq!(
        adafactor,
        Adafactor {
            relative_step: false,
            beta1: Some(0.9),
            ..Adafactor::default()
        }
    );
    let back: Adafactor =
        serde_json::from_value(serde_json::to_value(&adafactor).unwrap()).unwrap();
    assert_eq!(back, adafactor);
}
