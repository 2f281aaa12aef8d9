//! Knowledge distillation (Hinton et al., 2015), lmxlab's `soft_target_loss` and
//! `distillation_loss`: a trained student against a frozen teacher's temperature-softened
//! distribution, mixed with the hard-target cross-entropy.

use crate::error::Result;
use crate::nn::cross_entropy;
use mlx_rs::{Array, Dtype};

/// `KL(teacher || student)` per position over temperature-scaled logits `[..., vocab]`, times
/// `T²`; the teacher's side carries no gradient.
fn scaled_kl(student_logits: &Array, teacher_logits: &Array, temperature: f32) -> Result<Array> {
    let scale = Array::from_f32(1.0 / temperature);
    let log_softmax = |logits: &Array| -> Result<Array> {
        let scaled = logits.as_dtype(Dtype::Float32)?.multiply(&scale)?;
        let norm = scaled.logsumexp_axis(-1, true)?;
        Ok(scaled.subtract(norm)?)
    };
    let teacher = log_softmax(&mlx_rs::stop_gradient(teacher_logits)?)?;
    let student = log_softmax(student_logits)?;
    let kl = teacher
        .exp()?
        .multiply(teacher.subtract(&student)?)?
        .sum_axis(-1, false)?;
    Ok(kl.multiply(Array::from_f32(temperature * temperature))?)
}

/// `T² · KL(teacher || student)` over temperature-softened distributions, averaged over every
/// position of `[B, T, vocab]` logits: lmxlab's `soft_target_loss`.
pub fn soft_target_loss(
    student_logits: &Array,
    teacher_logits: &Array,
    temperature: f32,
) -> Result<Array> {
    Ok(scaled_kl(student_logits, teacher_logits, temperature)?.mean(false)?)
}

/// `alpha · T² · KL(teacher || student) + (1 - alpha) · CE(student, targets)`: lmxlab's
/// `distillation_loss` over logits computed by the caller (the student's with gradients, the
/// teacher's in the same step without). Both terms average over the positions whose target is
/// kept (not negative), so prompt masking and padding leave the soft term as they leave the hard
/// one; with no target ignored this is the seed's mean over every position.
pub fn distillation_loss(
    student_logits: &Array,
    teacher_logits: &Array,
    targets: &Array,
    temperature: f32,
    alpha: f32,
) -> Result<Array> {
    let kept = targets.ge(Array::from_int(0))?.as_dtype(Dtype::Float32)?;
    let count = mlx_rs::ops::maximum(kept.sum(false)?, Array::from_f32(1.0))?;
    let soft = scaled_kl(student_logits, teacher_logits, temperature)?
        .multiply(&kept)?
        .sum(false)?
        .divide(&count)?;
    let hard = cross_entropy(student_logits, targets)?;
    Ok(soft
        .multiply(Array::from_f32(alpha))?
        .add(hard.multiply(Array::from_f32(1.0 - alpha))?)?)
}
