use std::collections::BTreeMap;

use crate::known::{self, Known, Stage};
use crate::programs::PROGRAMS;
use crate::{Outcome, Program};

/// Programs whose smallest preset is larger are compiled but not run (a forward pass of such a
/// model would cost CI seconds); none of today's programs is.
const RUN_LIMIT_PARAMS: u64 = 5_000_000;

fn known_failures() -> Vec<Known> {
    known::parse(include_str!("../known-failures.txt")).expect("known-failures.txt is well formed")
}

/// The program, its mutations and where to read it, for a failure message.
fn describe(p: &Program) -> String {
    let mutations = if p.mutations.is_empty() {
        "unchanged".to_string()
    } else {
        p.mutations.join("; ")
    };
    format!(
        "{} ({}: {mutations}; source in {}/programs/{}.lmx)",
        p.name,
        p.origin,
        env!("OUT_DIR"),
        p.name
    )
}

fn is_mutant(p: &Program) -> bool {
    !p.mutations.is_empty()
}

/// Counts of mutants per outcome and of the checker's rejections per diagnostic code.
fn summary() -> String {
    let mut outcomes: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for p in PROGRAMS.iter().filter(|p| is_mutant(p)) {
        let row = outcomes.entry(p.origin).or_default();
        match p.outcome {
            Outcome::Compiled { .. } => row[0] += 1,
            Outcome::Rejected(why) => {
                row[1] += 1;
                *reasons
                    .entry(why.split(' ').next().unwrap_or(why))
                    .or_default() += 1;
            }
            Outcome::NotGenerated(_) => row[2] += 1,
            Outcome::Skipped(_) => row[3] += 1,
        }
    }
    let mut text = String::from("mutants: compiled, rejected by the checker, refused by the code generator, skipped (rustc)\n");
    for (origin, [c, r, g, s]) in &outcomes {
        text.push_str(&format!("  {origin}: {c}, {r}, {g}, {s}\n"));
    }
    text.push_str("rejections by diagnostic:\n");
    for (code, n) in &reasons {
        text.push_str(&format!("  {code}: {n}\n"));
    }
    let cases = PROGRAMS.iter().filter(|p| !is_mutant(p)).count();
    text.push_str(&format!("accept cases: {cases}\n"));
    text
}

/// Whether a mutant's logits match its original's: the same shape, and values equal within
/// float32 rounding of the few operations a mutation may reorder.
fn same_logits(mutant: &crate::Logits, original: &crate::Logits) -> Result<(), String> {
    if mutant.shape != original.shape {
        return Err(format!(
            "logits of shape {:?}, the original's are {:?}",
            mutant.shape, original.shape
        ));
    }
    let scale = original.values.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = mutant
        .values
        .iter()
        .zip(&original.values)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    if worst <= 1e-5 * scale {
        Ok(())
    } else {
        Err(format!(
            "logits differ from the original's by up to {worst} (largest magnitude {scale})"
        ))
    }
}

#[test]
fn every_accepted_program_is_generated_compiled_and_runs_a_forward_pass() {
    let known = known_failures();
    let listed = |name: &str, stage: Stage| known.iter().any(|k| k.id == name && k.stage == stage);
    let mut failures = Vec::new();
    for p in PROGRAMS {
        match p.outcome {
            Outcome::Rejected(why) if !is_mutant(p) => failures.push(format!(
                "{}: the checker rejects an accept case: {why}",
                describe(p)
            )),
            Outcome::Rejected(_) | Outcome::Skipped(_) => {}
            Outcome::NotGenerated(error) if !listed(p.name, Stage::Codegen) => {
                failures.push(format!(
                    "{}: the checker accepts it, the code generator refuses it:\n{error}",
                    describe(p)
                ))
            }
            Outcome::NotGenerated(_) => {}
            Outcome::Compiled {
                preset,
                params,
                forward,
                reference,
            } => {
                if listed(p.name, Stage::Codegen) {
                    failures.push(format!(
                        "{}: generated now; remove its codegen line from known-failures.txt",
                        p.name
                    ));
                }
                if params > RUN_LIMIT_PARAMS {
                    eprintln!("{}: not run ({params} parameters at `{preset}`)", p.name);
                    continue;
                }
                let checked = forward(preset).and_then(|logits| match reference {
                    Some(reference) => same_logits(&logits, &reference(preset)?),
                    None if logits.shape.len() == 3 && logits.shape[0] == 1 => Ok(()),
                    None => Err(format!("logits of shape {:?}", logits.shape)),
                });
                match (checked, listed(p.name, Stage::Run)) {
                    (Ok(()), false) => {}
                    (Ok(_), true) => failures.push(format!(
                        "{}: runs now; remove its run line from known-failures.txt",
                        p.name
                    )),
                    (Err(e), false) => failures.push(format!(
                        "{}: preset `{preset}` fails to initialise or run, or differs: {e}",
                        describe(p)
                    )),
                    (Err(_), true) => {}
                }
            }
        }
    }
    // Not a failure: accept cases arrive from the corpus's own branch, their entries with them.
    for k in known
        .iter()
        .filter(|k| !PROGRAMS.iter().any(|p| p.name == k.id))
    {
        eprintln!(
            "known-failures.txt lists `{}`, which is not drawn here",
            k.id
        );
    }
    eprintln!("{}", summary());
    assert!(
        failures.is_empty(),
        "{} programs fail:\n{}\n\n{}",
        failures.len(),
        failures.join("\n\n"),
        summary()
    );
}

#[test]
fn every_bundled_model_and_mutation_kind_reaches_the_compiler() {
    let compiled: Vec<&Program> = PROGRAMS
        .iter()
        .filter(|p| is_mutant(p) && matches!(p.outcome, Outcome::Compiled { .. }))
        .collect();
    let models = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models"))
        .expect("the models folder")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".lmx"));
    let mut missing = Vec::new();
    for model in models {
        let origin = format!("models/{model}");
        if !compiled.iter().any(|p| p.origin == origin) {
            missing.push(origin);
        }
    }
    for kind in crate::mutate::KINDS {
        let prefix = format!("{} at ", kind.name());
        let with_kind = |p: &&&Program| p.mutations.iter().any(|m| m.starts_with(&prefix));
        if !compiled.iter().any(|p| with_kind(&p)) {
            missing.push(kind.name().to_string());
        }
        // A kind that keeps the logits is also compared with its original somewhere.
        let compared = compiled.iter().filter(with_kind).any(|p| {
            matches!(
                p.outcome,
                Outcome::Compiled {
                    reference: Some(_),
                    ..
                }
            )
        });
        if kind.preserves_logits() && !compared {
            missing.push(format!("{} (compared with its original)", kind.name()));
        }
    }
    assert!(
        missing.is_empty(),
        "no compiled mutant of or with: {missing:?}\n{}",
        summary()
    );
}
