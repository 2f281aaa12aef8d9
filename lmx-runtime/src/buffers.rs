//! Buffers: leaves of a parameter tree that are state, not parameters (PyTorch's
//! `register_buffer`, BatchNorm's running statistics, DeepSeek-V3's routing bias).
//!
//! A buffer is a leaf of role [`LeafRole::Buffer`]: it has no gradient, no optimizer state and no
//! weight decay ([`tree::specs`] freezes it), and it is saved, loaded and exported under its name
//! as every leaf is. A training step's forward passes may give a buffer its next value
//! ([`Context::write_buffer`](crate::model::Context::write_buffer)): the value is recorded,
//! never read back in the same pass, and the compiled step writes it into the state after the
//! update ([`TrainStep`](crate::step::TrainStep)). Outside a training step (evaluation,
//! generation) a write is dropped, so the forward pass computes the same logits however often it
//! runs.
//!
//! Writes are keyed by the leaf they replace, by its address in the tree the forward pass reads:
//! that tree outlives the pass, and one leaf of it is one buffer, so the key needs no names on
//! the hot path and a block that runs once per layer writes each layer's own buffer.

use crate::error::{Error, Result};
use crate::tree::{self, LeafRole, Tree};
use mlx_rs::Array;

/// The values a training step's forward passes gave buffers, in the order written.
#[derive(Default)]
pub struct BufferWrites {
    writes: Vec<(usize, Array)>,
}

impl BufferWrites {
    /// Records `value` as the next value of `leaf`; a later write of the same leaf replaces it.
    /// The value carries no gradient: a buffer is state, not a function the loss is
    /// differentiated through.
    pub fn record<T>(&mut self, leaf: &T, value: &Array) -> Result<()> {
        let key = leaf as *const T as usize;
        let value = mlx_rs::stop_gradient(value)?;
        match self.writes.iter_mut().find(|(k, _)| *k == key) {
            Some(write) => write.1 = value,
            None => self.writes.push((key, value)),
        }
        Ok(())
    }

    /// The next value of every buffer leaf of `tree`, in traversal order: the value a forward
    /// pass over `tree` wrote, else the leaf itself (`array` gives a leaf's array). Fails when a
    /// write names no buffer of `tree` (a parameter, or a leaf of another tree), or when a value
    /// has another shape than its buffer.
    pub fn values<T, R: Tree<T>>(
        &self,
        tree: &R,
        array: impl Fn(&T) -> Array,
    ) -> Result<Vec<Array>> {
        let specs = tree::specs(tree);
        let mut specs = specs.iter();
        let mut used = vec![false; self.writes.len()];
        let mut values = Vec::new();
        let mut failure = None;
        tree.for_each(&mut |leaf| {
            let spec = specs.next().expect("one spec per leaf");
            let key = leaf as *const T as usize;
            let written = self.writes.iter().position(|(k, _)| *k == key);
            if spec.role != LeafRole::Buffer {
                if written.is_some() && failure.is_none() {
                    failure = Some(Error::Layout(format!(
                        "a forward pass wrote `{}`, which is a parameter, not a buffer",
                        spec.name
                    )));
                }
                return;
            }
            let current = array(leaf);
            let value = match written {
                Some(index) => {
                    used[index] = true;
                    let value = &self.writes[index].1;
                    if value.shape() != current.shape() && failure.is_none() {
                        failure = Some(Error::Layout(format!(
                            "buffer `{}` is {:?}, its next value {:?}",
                            spec.name,
                            current.shape(),
                            value.shape()
                        )));
                    }
                    value.clone()
                }
                None => current,
            };
            values.push(value);
        });
        if let Some(err) = failure {
            return Err(err);
        }
        if used.iter().any(|used| !used) {
            return Err(Error::Layout(
                "a forward pass wrote a buffer of another tree than the step's parameters".into(),
            ));
        }
        Ok(values)
    }
}

/// How many buffer leaves `tree` holds.
pub fn count<T, R: Tree<T> + ?Sized>(tree: &R) -> usize {
    tree::specs(tree)
        .iter()
        .filter(|spec| spec.role == LeafRole::Buffer)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Context;

    /// A norm with a running statistic.
    #[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
    #[lmx(runtime = "crate")]
    struct Norm<T = Array> {
        #[lmx(role = norm)]
        weight: T,
        #[lmx(role = buffer)]
        running: T,
    }

    fn norm() -> Norm {
        Norm {
            weight: Array::from_slice(&[1.0f32, 2.0], &[2]),
            running: Array::from_slice(&[0.5f32, 0.5], &[2]),
        }
    }

    #[test]
    fn a_buffer_never_trains_or_decays() {
        let specs = tree::specs(&norm());
        assert_eq!(specs[1].role, LeafRole::Buffer);
        assert!(!specs[1].trainable && !specs[1].decay, "{:?}", specs[1]);
        assert!(specs[0].trainable);
        assert_eq!(count(&norm()), 1);
    }

    /// A step's context keeps the last value written for each buffer, without gradient; others
    /// keep theirs; generation and evaluation drop the writes.
    #[test]
    fn a_steps_context_returns_the_written_values() -> Result<()> {
        let params = norm();
        let mut step = Context::for_step(None);
        step.write_buffer(&params.running, &Array::from_slice(&[9.0f32, 9.0], &[2]))?;
        step.write_buffer(&params.running, &Array::from_slice(&[3.0f32, 4.0], &[2]))?;
        let values = step.buffer_values(&params, Array::clone)?;
        assert_eq!(values.len(), 1);
        assert_eq!(values[0].as_slice::<f32>(), [3.0, 4.0]);
        let mut generation = Context::generation();
        generation.write_buffer(&params.running, &Array::from_slice(&[3.0f32, 4.0], &[2]))?;
        let kept = generation.buffer_values(&params, Array::clone)?;
        assert_eq!(kept[0].as_slice::<f32>(), [0.5, 0.5]);
        Ok(())
    }

    /// A write to a parameter, to another tree's leaf or of another shape is refused.
    #[test]
    fn a_write_of_a_parameter_or_another_shape_is_refused() -> Result<()> {
        let params = norm();
        let mut step = Context::for_step(None);
        step.write_buffer(&params.weight, &Array::from_slice(&[0.0f32, 0.0], &[2]))?;
        let err = step.buffer_values(&params, Array::clone).unwrap_err();
        assert_eq!(
            err.to_string(),
            Error::Layout(
                "a forward pass wrote `weight`, which is a parameter, not a buffer".into()
            )
            .to_string()
        );
        let mut step = Context::for_step(None);
        step.write_buffer(&params.running, &Array::from_slice(&[0.0f32; 3], &[3]))?;
        let err = step.buffer_values(&params, Array::clone).unwrap_err();
        assert!(
            err.to_string()
                .contains("buffer `running` is [2], its next value [3]"),
            "{err}"
        );
        let other = norm();
        let mut step = Context::for_step(None);
        step.write_buffer(&other.running, &Array::from_slice(&[0.0f32; 2], &[2]))?;
        assert!(step.buffer_values(&params, Array::clone).is_err());
        Ok(())
    }
}
