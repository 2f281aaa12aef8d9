//! The training step as a pure function over a declared state, compiled once.
//!
//! [`TrainStep`] builds the function `[state..., lr, batch...] -> [state'..., loss, grad_norm]`
//! from a loss over the parameter tree, an [`Optimizer`] and the clip norm, and hands it to
//! MLX's `compile`. Every array it reads arrives as an input and every array it changes leaves as
//! an output, so MLX never sees a captured or mutated array, and the state's layout is fixed before
//! the first trace: the step is traced exactly once however the learning rate changes. The same
//! function runs uncompiled in eager mode, for debugging, with the same numbers.

use crate::clip;
use crate::error::{Error, Result};
use crate::optim::{Optimizer, StepScalars};
use crate::state::{StateTemplate, TrainState};
use crate::tree::{self, Tree};
use mlx_rs::error::Exception;
use mlx_rs::transforms::{compile::compile, value_and_grad_with_argnums};
use mlx_rs::{random, Array};
use std::cell::Cell;
use std::rc::Rc;

/// A loss over a parameter tree: `(params, batch, key) -> scalar loss`.
pub trait Loss<P>: Fn(&P, &[Array], &Array) -> Result<Array> + 'static {}

impl<P, F: Fn(&P, &[Array], &Array) -> Result<Array> + 'static> Loss<P> for F {}

/// How the step is run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOptions {
    /// Clip gradients to this global norm (graph-only clipping); `None` leaves them.
    pub clip_norm: Option<f32>,
    /// Compile the step with MLX (`false`: eager, for debugging).
    pub compile: bool,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions { clip_norm: Some(1.0), compile: true }
    }
}

/// What one step reports, as lazy arrays: evaluate them with the state at the step's boundary.
#[derive(Clone, Debug)]
pub struct StepMetrics {
    /// The loss before the update.
    pub loss: Array,
    /// The global gradient norm before clipping.
    pub grad_norm: Array,
}

type StepFn = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// A compiled (or eager) training step over a [`TrainState`].
pub struct TrainStep<P: Tree<Array>, O: Optimizer> {
    run: StepFn,
    template: StateTemplate<P, O>,
    traces: Rc<Cell<usize>>,
}

impl<P, O> TrainStep<P, O>
where
    P: Tree<Array> + Clone + 'static,
    P::Of<Option<O::Leaf>>: Clone + 'static,
    O: Optimizer,
{
    /// The step for states laid out like `state`.
    pub fn new(state: &TrainState<P, O>, optimizer: O, loss: impl Loss<P>, options: StepOptions) -> Self {
        let template = state.template();
        let traces = Rc::new(Cell::new(0));
        let body = StepBody {
            template: template.clone(),
            specs: state.specs().into_iter().map(|spec| (spec.trainable, spec.decay)).collect(),
            optimizer,
            loss: Rc::new(loss),
            clip_norm: options.clip_norm,
            traces: traces.clone(),
        };
        let pure = move |inputs: &[Array]| body.run(inputs).map_err(|err| Exception::custom(err.to_string()));
        let run: StepFn = if options.compile {
            Box::new(compile(pure, false))
        } else {
            Box::new(pure)
        };
        TrainStep { run, template, traces }
    }

    /// Runs one step: `state` becomes the next state (lazily: nothing is evaluated here).
    pub fn step(&mut self, state: &mut TrainState<P, O>, lr: f32, batch: &[Array]) -> Result<StepMetrics> {
        let mut inputs = state.flatten();
        inputs.push(Array::from_f32(lr));
        inputs.extend(batch.iter().cloned());
        let outputs = (self.run)(&inputs)?;
        let n = self.template.layout().len();
        if outputs.len() != n + 2 {
            return Err(Error::Layout(format!("the step returned {} arrays, expected {}", outputs.len(), n + 2)));
        }
        *state = self.template.state(&outputs)?;
        Ok(StepMetrics { loss: outputs[n].clone(), grad_norm: outputs[n + 1].clone() })
    }

    /// How many times the step function has been traced (compiled) or run (eager).
    pub fn traces(&self) -> usize {
        self.traces.get()
    }
}

/// The pure step function and what it needs, captured by value.
struct StepBody<P: Tree<Array>, O: Optimizer> {
    template: StateTemplate<P, O>,
    /// (trainable, decay) per parameter leaf, in traversal order.
    specs: Vec<(bool, bool)>,
    optimizer: O,
    loss: Rc<dyn Fn(&P, &[Array], &Array) -> Result<Array>>,
    clip_norm: Option<f32>,
    traces: Rc<Cell<usize>>,
}

impl<P, O> StepBody<P, O>
where
    P: Tree<Array> + Clone + 'static,
    O: Optimizer,
{
    fn run(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.traces.set(self.traces.get() + 1);
        let layout = self.template.layout();
        let n_state = layout.len();
        if inputs.len() < n_state + 1 {
            return Err(Error::Layout(format!("the step needs at least {} inputs", n_state + 1)));
        }
        let state = self.template.state(inputs)?;
        let lr = &inputs[n_state];
        let batch = &inputs[n_state + 1..];
        let (key, subkey) = random::split(&state.key, 2)?;

        let (loss, grads) = self.loss_and_grads(&inputs[..layout.params], batch, &subkey)?;
        let (grads, grad_norm) = match self.clip_norm {
            Some(max_norm) => clip::clip_by_global_norm(&grads, max_norm)?,
            None => {
                let norm = clip::global_norm(&grads)?;
                (grads, norm)
            }
        };

        let step = state.step.add(Array::from_f32(1.0))?;
        let scalars = StepScalars { lr, step: &step };
        let params = tree::flatten(&state.params);
        let mut grads = grads.into_iter();
        let mut next_params = Vec::with_capacity(params.len());
        let mut next_opt = Vec::new();
        let mut opt_leaves = Vec::new();
        state.opt.for_each(&mut |leaf| opt_leaves.push(leaf.clone()));
        for ((param, &(trainable, decay)), leaf) in params.iter().zip(&self.specs).zip(opt_leaves) {
            match (trainable, leaf) {
                (true, Some(leaf)) => {
                    let grad = grads.next().expect("one gradient per trainable leaf");
                    let (param, leaf) = self.optimizer.update(param, &grad, &leaf, scalars, decay)?;
                    next_params.push(param);
                    crate::arrays::Arrays::push_arrays(&leaf, &mut next_opt);
                }
                _ => next_params.push(param.clone()),
            }
        }
        let mut outputs = next_params;
        outputs.extend(next_opt);
        outputs.extend([step, key, loss, grad_norm]);
        Ok(outputs)
    }

    /// The loss and the gradients of the trainable parameters, in traversal order.
    fn loss_and_grads(&self, params: &[Array], batch: &[Array], key: &Array) -> Result<(Array, Vec<Array>)> {
        let argnums: Vec<i32> = self
            .specs
            .iter()
            .enumerate()
            .filter(|(_, (trainable, _))| *trainable)
            .map(|(index, _)| index as i32)
            .collect();
        let n_params = params.len();
        let n_batch = batch.len();
        let template = &self.template;
        let loss = &self.loss;
        let objective = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let run = || -> Result<Array> {
                let params = template.params(&args[..n_params])?;
                loss(&params, &args[n_params..n_params + n_batch], &args[n_params + n_batch])
            };
            run().map(|loss| vec![loss]).map_err(|err| Exception::custom(err.to_string()))
        };
        let mut args: Vec<Array> = params.to_vec();
        args.extend(batch.iter().cloned());
        args.push(key.clone());
        let (values, grads) = value_and_grad_with_argnums(objective, &argnums[..])(&args)?;
        let loss = values.into_iter().next().ok_or_else(|| Error::Layout("the loss returned nothing".into()))?;
        Ok((loss, grads))
    }
}
