//! The objectives as a run's [`Objective`] over any [`LanguageModel`]: the trained model's
//! forward pass and the frozen models' in the same compiled step.

use super::{distillation_loss, dpo_loss, sequence_logprobs, Teacher};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::train::{frozen_tree, Objective};
use crate::tree;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::rc::Rc;

/// DPO of model `M` against `reference`, a frozen copy of the policy (its parameters before
/// training), over rows of preference pairs ([`PreferenceRows`](crate::data::PreferenceRows):
/// inputs and targets `[B, 2L]`, the chosen sequence then the rejected one). The policy runs once
/// over the `2B` sequences with the step's dropout, the reference once without; `β` as lmxlab's
/// `beta`.
pub fn dpo<M: LanguageModel>(reference: &M::Params, beta: f32) -> Objective<M> {
    let template = reference.clone();
    let loss = move |params: &M::Params,
                     config: &M::Config,
                     frozen: &[Array],
                     batch: &[Array],
                     key: Option<&Array>|
          -> Result<Vec<Array>> {
        let reference = frozen_tree(&template, frozen)?;
        let (tokens, targets) = (pairs_as_rows(&batch[0])?, pairs_as_rows(&batch[1])?);
        let policy = M::forward(params, config, &tokens, &mut Context::for_step(key))?;
        let reference = M::forward(&reference, config, &tokens, &mut Context::evaluation())?;
        let rows = tokens.dim(0) / 2;
        let halves = |logits: &Array| -> Result<(Array, Array)> {
            let lp = sequence_logprobs(logits, &targets)?;
            Ok((lp.index(..rows), lp.index(rows..)))
        };
        let (policy_chosen, policy_rejected) = halves(&policy)?;
        let (reference_chosen, reference_rejected) = halves(&reference)?;
        let preference = dpo_loss(
            &policy_chosen,
            &policy_rejected,
            &reference_chosen,
            &reference_rejected,
            beta,
        )?;
        Ok(vec![
            preference.loss,
            preference.reward_margin,
            preference.accuracy,
        ])
    };
    Objective {
        name: "dpo",
        frozen: tree::flatten(reference),
        loss: Rc::new(loss),
        metrics: &["reward_margin", "accuracy"],
        mean_over_targets: false,
    }
}

/// `[B, 2L]` pairs as `[2B, L]` rows: every chosen sequence, then every rejected one.
fn pairs_as_rows(pairs: &Array) -> Result<Array> {
    let half = pairs.dim(1) / 2;
    Ok(mlx_rs::ops::concatenate(
        &[pairs.index((.., ..half)), pairs.index((.., half..))],
        0,
    )?)
}

/// Distillation of a student `M` from a frozen teacher `T` (another size or architecture, of
/// the same vocabulary) on the run's windows: [`distillation_from`] over [`Teacher::new`].
///
/// # Errors
/// [`Error::Config`] when the teacher's vocabulary differs from the student's.
pub fn distillation<M: LanguageModel, T: LanguageModel>(
    student: &M::Config,
    teacher: T::Params,
    teacher_config: T::Config,
    temperature: f32,
    alpha: f32,
) -> Result<Objective<M>> {
    distillation_from::<M>(
        student,
        Teacher::new::<T>(teacher, teacher_config),
        temperature,
        alpha,
    )
}

/// Distillation of a student `M` from `teacher`, a frozen model of any type (the command line's
/// `--teacher`, whose architecture is known only when it is read): lmxlab's `distillation_loss`
/// with `temperature` and `alpha`, the teacher's logits computed in the same step without
/// dropout or gradients, its leaves the step's frozen inputs.
///
/// # Errors
/// [`Error::Config`] when the teacher's vocabulary differs from the student's, or the
/// temperature is not positive or `alpha` not in `[0, 1]`.
pub fn distillation_from<M: LanguageModel>(
    student: &M::Config,
    teacher: Teacher,
    temperature: f32,
    alpha: f32,
) -> Result<Objective<M>> {
    let (ours, theirs) = (M::vocab_size(student), teacher.vocab);
    if ours != theirs {
        return Err(Error::Config(format!(
            "the teacher ({}) has a vocabulary of {theirs} ids, the student ({}) one of {ours}",
            teacher.model,
            M::NAME
        )));
    }
    let positive = temperature > 0.0 && temperature.is_finite();
    if !(positive && (0.0..=1.0).contains(&alpha)) {
        return Err(Error::Config(format!(
            "distillation needs a positive temperature and alpha in [0, 1], got {temperature} \
             and {alpha}"
        )));
    }
    let frozen = teacher.leaves.clone();
    let loss = move |params: &M::Params,
                     config: &M::Config,
                     frozen: &[Array],
                     batch: &[Array],
                     key: Option<&Array>|
          -> Result<Vec<Array>> {
        let student = M::forward(params, config, &batch[0], &mut Context::for_step(key))?;
        let teacher = teacher.logits(frozen, &batch[0])?;
        Ok(vec![distillation_loss(
            &student,
            &teacher,
            &batch[1],
            temperature,
            alpha,
        )?])
    };
    Ok(Objective {
        name: "distill",
        frozen,
        loss: Rc::new(loss),
        metrics: &[],
        mean_over_targets: true,
    })
}
