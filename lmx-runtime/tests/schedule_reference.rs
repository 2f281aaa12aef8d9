//! Learning-rate schedules at chosen steps against values worked out by hand: the start, middle
//! and end of the warm-up, a quarter, half and three quarters into the decay, the end of the run
//! and past it; a warm-up longer than the run; configuration through serde.

use lmx_runtime::schedule::Schedule;

fn assert_rates(schedule: &Schedule, expected: &[(u64, f64)]) {
    for &(step, want) in expected {
        let got = f64::from(schedule.lr(step));
        let ok = if want == 0.0 {
            got == 0.0
        } else {
            ((got - want) / want).abs() <= 1e-6
        };
        assert!(
            ok,
            "{schedule:?} at step {step}: got {got}, expected {want}"
        );
    }
}

#[test]
fn constant_after_warm_up() {
    let schedule = Schedule::Constant {
        lr: 0.5,
        warmup_steps: 4,
    };
    assert_rates(
        &schedule,
        &[
            (0, 0.0),
            (1, 0.125),
            (2, 0.25),
            (3, 0.375),
            (4, 0.5),
            (1_000_000, 0.5),
        ],
    );
    let schedule = Schedule::Constant {
        lr: 0.5,
        warmup_steps: 0,
    };
    assert_rates(&schedule, &[(0, 0.5), (7, 0.5)]);
}

#[test]
fn linear_decay_after_warm_up() {
    // Warm-up over 10 steps to 1.0, then 100 steps down to 0.2.
    let schedule = Schedule::Linear {
        lr: 1.0,
        warmup_steps: 10,
        total_steps: 110,
        final_lr: 0.2,
    };
    assert_rates(
        &schedule,
        &[
            (0, 0.0),
            (5, 0.5),
            (9, 0.9),
            (10, 1.0),
            (35, 0.2 + 0.8 * 0.75),
            (60, 0.6),
            (85, 0.2 + 0.8 * 0.25),
            (109, 0.2 + 0.8 * 0.01),
            (110, 0.2),
            (500, 0.2),
        ],
    );
}

#[test]
fn linear_decay_without_warm_up() {
    let schedule = Schedule::Linear {
        lr: 1.0,
        warmup_steps: 0,
        total_steps: 4,
        final_lr: 0.0,
    };
    assert_rates(
        &schedule,
        &[(0, 1.0), (1, 0.75), (2, 0.5), (3, 0.25), (4, 0.0), (9, 0.0)],
    );
}

#[test]
fn cosine_decay_after_warm_up() {
    // cos(pi/4) = 0.70710678118654752
    let quarter = 0.5 * (1.0 + 0.707_106_781_186_547_5);
    let three_quarters = 0.5 * (1.0 - 0.707_106_781_186_547_5);
    let schedule = Schedule::Cosine {
        lr: 1.0,
        warmup_steps: 10,
        total_steps: 110,
        final_lr: 0.2,
    };
    assert_rates(
        &schedule,
        &[
            (0, 0.0),
            (5, 0.5),
            (10, 1.0),
            (35, 0.2 + 0.8 * quarter),
            (60, 0.6),
            (85, 0.2 + 0.8 * three_quarters),
            (110, 0.2),
            (111, 0.2),
            (u64::MAX, 0.2),
        ],
    );
}

#[test]
fn warm_up_longer_than_the_run_is_clamped_to_the_run() {
    for schedule in [
        Schedule::Linear {
            lr: 1.0,
            warmup_steps: 100,
            total_steps: 50,
            final_lr: 0.1,
        },
        Schedule::Cosine {
            lr: 1.0,
            warmup_steps: 100,
            total_steps: 50,
            final_lr: 0.1,
        },
    ] {
        // The warm-up spans the whole run (50 steps), the decay phase is empty.
        assert_rates(
            &schedule,
            &[
                (0, 0.0),
                (25, 0.5),
                (49, 0.98),
                (50, 0.1),
                (75, 0.1),
                (100, 0.1),
                (101, 0.1),
            ],
        );
    }
    let exact = Schedule::Cosine {
        lr: 1.0,
        warmup_steps: 50,
        total_steps: 50,
        final_lr: 0.1,
    };
    assert_rates(&exact, &[(25, 0.5), (49, 0.98), (50, 0.1)]);
}

#[test]
fn degenerate_runs_never_divide_by_zero() {
    for (warmup_steps, total_steps) in [(0, 0), (10, 0), (0, 1), (1, 1), (3, 2), (u64::MAX, 7)] {
        for schedule in [
            Schedule::Linear {
                lr: 1.0,
                warmup_steps,
                total_steps,
                final_lr: 0.25,
            },
            Schedule::Cosine {
                lr: 1.0,
                warmup_steps,
                total_steps,
                final_lr: 0.25,
            },
            Schedule::Constant {
                lr: 1.0,
                warmup_steps,
            },
        ] {
            for step in (0..20).chain([u64::MAX - 1, u64::MAX]) {
                let lr = schedule.lr(step);
                assert!(
                    lr.is_finite() && (0.0..=1.0).contains(&lr),
                    "{schedule:?} at {step}: {lr}"
                );
            }
        }
    }
    let empty = Schedule::Cosine {
        lr: 1.0,
        warmup_steps: 0,
        total_steps: 0,
        final_lr: 0.25,
    };
    assert_eq!(empty.lr(0), 0.25);
}

#[test]
fn schedules_are_configured_through_serde() {
    let schedule: Schedule = serde_json::from_str(
        r#"{"kind": "cosine", "lr": 0.5, "total_steps": 1000, "min_lr": 0.125}"#,
    )
    .unwrap();
    assert_eq!(
        schedule,
        Schedule::Cosine {
            lr: 0.5,
            warmup_steps: 0,
            total_steps: 1000,
            final_lr: 0.125
        }
    );
    let schedule: Schedule =
        serde_json::from_str(r#"{"kind": "constant", "lr": 0.5, "warmup_steps": 10}"#).unwrap();
    assert_eq!(schedule.peak_lr(), 0.5);
    let linear = Schedule::Linear {
        lr: 0.5,
        warmup_steps: 5,
        total_steps: 50,
        final_lr: 0.0,
    };
    let json = serde_json::to_value(&linear).unwrap();
    assert_eq!(json["kind"], "linear");
    assert_eq!(serde_json::from_value::<Schedule>(json).unwrap(), linear);
    assert!(serde_json::from_str::<Schedule>(r#"{"kind": "step", "lr": 0.5}"#).is_err());
}

#[test]
fn validation_rejects_negative_or_non_finite_rates() {
    assert!(Schedule::Constant {
        lr: 1e-3,
        warmup_steps: 0
    }
    .validate()
    .is_ok());
    assert!(Schedule::Constant {
        lr: -1e-3,
        warmup_steps: 0
    }
    .validate()
    .is_err());
    let nan = Schedule::Cosine {
        lr: 1e-3,
        warmup_steps: 0,
        total_steps: 10,
        final_lr: f32::NAN,
    };
    assert!(nan.validate().is_err());
}
