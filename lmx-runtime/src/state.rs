//! The compiled training state: everything a training step reads and writes.
//!
//! A [`TrainState`] is the parameters, the optimizer's state for every trainable parameter, the
//! step count and the random key. It flattens to one fixed list of arrays whose layout is known
//! before the step is traced ([`TrainState::declaration`] names every entry), and the compiled
//! step is a pure function from that list (plus the learning rate and the batch) to the next one.
//! Nothing is captured and nothing is mutated, so no array can be left out of the compiled set.

use crate::arrays::Arrays;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::tree::{self, LeafSpec, Tree};
use mlx_rs::{random, Array};

/// Parameters, optimizer state, step count and random key.
pub struct TrainState<P: Tree<Array>, O: Optimizer> {
    /// The model's parameters.
    pub params: P,
    /// The optimizer's state for each trainable parameter (`None` for frozen ones).
    pub opt: P::Of<Option<O::Leaf>>,
    /// The number of updates made so far (float32 scalar).
    pub step: Array,
    /// The random key the next step splits (dropout, noise).
    pub key: Array,
}

impl<P: Tree<Array>, O: Optimizer> TrainState<P, O> {
    /// A fresh state: the optimizer's state is created now, for every trainable leaf, so that the
    /// compiled step is traced once over its final layout.
    pub fn new(params: P, optimizer: &O, seed: u64) -> Result<Self> {
        let specs = tree::specs(&params);
        let mut trainable = specs.iter().map(|spec| spec.trainable);
        let mut failure = None;
        let opt = params.map(&mut |param| {
            let trainable = trainable.next().expect("one spec per leaf");
            if !trainable || failure.is_some() {
                return None;
            }
            optimizer
                .init(param)
                .map_err(|err| failure = Some(err))
                .ok()
        });
        if let Some(err) = failure {
            return Err(err);
        }
        Ok(TrainState {
            params,
            opt,
            step: Array::from_f32(0.0),
            key: random::key(seed)?,
        })
    }

    /// How the flat state is laid out.
    pub fn layout(&self) -> StateLayout {
        let opt = {
            let mut count = 0;
            self.opt.for_each(&mut |leaf| count += leaf.array_count());
            count
        };
        StateLayout {
            params: tree::leaf_count(&self.params),
            opt,
        }
    }

    /// Every array of the state, in the declared order: parameters, optimizer state, step, key.
    pub fn flatten(&self) -> Vec<Array> {
        let mut out = tree::flatten(&self.params);
        self.opt.for_each(&mut |leaf| leaf.push_arrays(&mut out));
        out.push(self.step.clone());
        out.push(self.key.clone());
        out
    }

    /// The names of the flat state's entries, in order: `params.<name>`, `opt.<name>.<i>`,
    /// `step`, `rng`.
    pub fn declaration(&self) -> Vec<String> {
        let specs = tree::specs(&self.params);
        let mut names: Vec<String> = specs
            .iter()
            .map(|spec| format!("params.{}", spec.name))
            .collect();
        let mut specs = specs.iter();
        self.opt.for_each(&mut |leaf| {
            let spec = specs.next().expect("one spec per leaf");
            for index in 0..leaf.array_count() {
                names.push(format!("opt.{}.{index}", spec.name));
            }
        });
        names.push("step".into());
        names.push("rng".into());
        names
    }

    /// The specs (names, roles, masks) of the parameters.
    pub fn specs(&self) -> Vec<LeafSpec> {
        tree::specs(&self.params)
    }
}

impl<P, O> TrainState<P, O>
where
    P: Tree<Array> + Clone,
    P::Of<Option<O::Leaf>>: Clone,
    O: Optimizer,
{
    /// A state of the same layout whose arrays are placeholders: what a compiled step keeps to
    /// rebuild typed trees from flat lists without holding on to the real arrays.
    pub fn template(&self) -> StateTemplate<P, O> {
        let placeholder = Array::from_f32(0.0);
        let params = self.params.map_same(&mut |_| placeholder.clone());
        let opt = self.opt.map_same(&mut |leaf| {
            leaf.rebuild_from(&mut std::iter::repeat_with(|| placeholder.clone()))
        });
        StateTemplate {
            params,
            opt,
            layout: self.layout(),
        }
    }
}

/// How many arrays each part of a flat state holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateLayout {
    /// Parameter arrays.
    pub params: usize,
    /// Optimizer state arrays.
    pub opt: usize,
}

impl StateLayout {
    /// All arrays of the state: parameters, optimizer state, step and key.
    pub fn len(&self) -> usize {
        self.params + self.opt + 2
    }

    /// Never true: a state always holds its step and key.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// The shape of a [`TrainState`] without its arrays, for rebuilding states from flat lists.
#[derive(Clone)]
pub struct StateTemplate<P: Tree<Array>, O: Optimizer> {
    params: P,
    opt: P::Of<Option<O::Leaf>>,
    layout: StateLayout,
}

impl<P, O> StateTemplate<P, O>
where
    P: Tree<Array>,
    O: Optimizer,
{
    /// The layout of the states this template rebuilds.
    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// The optimizer state of the first trainable parameter, of placeholders: the structure
    /// every trainable parameter's state has.
    pub fn opt_leaf(&self) -> Option<O::Leaf> {
        let mut first = None;
        self.opt.for_each(&mut |leaf| {
            if first.is_none() {
                first = leaf.clone();
            }
        });
        first
    }

    /// Parameters rebuilt from the first arrays of `arrays`.
    pub fn params(&self, arrays: &[Array]) -> Result<P> {
        self.check(arrays, self.layout.params)?;
        let mut arrays = arrays.iter().cloned();
        Ok(self
            .params
            .map_same(&mut |_| arrays.next().expect("checked above")))
    }

    /// A whole state rebuilt from the first [`StateLayout::len`] arrays of `arrays`.
    pub fn state(&self, arrays: &[Array]) -> Result<TrainState<P, O>> {
        self.check(arrays, self.layout.len())?;
        let params = self.params(arrays)?;
        let mut rest = arrays[self.layout.params..].iter().cloned();
        let opt = self.opt.map_same(&mut |leaf| leaf.rebuild_from(&mut rest));
        let step = rest.next().expect("checked above");
        let key = rest.next().expect("checked above");
        Ok(TrainState {
            params,
            opt,
            step,
            key,
        })
    }

    fn check(&self, arrays: &[Array], needed: usize) -> Result<()> {
        if arrays.len() < needed {
            return Err(Error::Layout(format!(
                "expected at least {needed} arrays, got {}",
                arrays.len()
            )));
        }
        Ok(())
    }
}
