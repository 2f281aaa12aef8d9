//! Values made of a fixed number of arrays, so that they ride in a compiled step's flat state.

use mlx_rs::Array;

/// A value that flattens to arrays and is rebuilt from them, given a value of the same layout.
///
/// Parameters are one array; Adam's state is two; SGD without momentum keeps none. A layout may
/// depend on the value (Adafactor factors matrices but not vectors), which is why rebuilding takes
/// a template.
pub trait Arrays: Sized {
    /// Appends this value's arrays to `out`.
    fn push_arrays(&self, out: &mut Vec<Array>);

    /// A value laid out like `self`, taking its arrays from `arrays`.
    ///
    /// # Panics
    /// When `arrays` runs out: callers check the count against [`Arrays::array_count`] first.
    fn rebuild_from(&self, arrays: &mut dyn Iterator<Item = Array>) -> Self;

    /// How many arrays this value holds.
    fn array_count(&self) -> usize {
        let mut out = Vec::new();
        self.push_arrays(&mut out);
        out.len()
    }
}

impl Arrays for Array {
    fn push_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.clone());
    }

    fn rebuild_from(&self, arrays: &mut dyn Iterator<Item = Array>) -> Self {
        arrays.next().expect("the caller checked the array count")
    }

    fn array_count(&self) -> usize {
        1
    }
}

impl Arrays for () {
    fn push_arrays(&self, _: &mut Vec<Array>) {}

    fn rebuild_from(&self, _: &mut dyn Iterator<Item = Array>) -> Self {}

    fn array_count(&self) -> usize {
        0
    }
}

impl<A: Arrays> Arrays for Option<A> {
    fn push_arrays(&self, out: &mut Vec<Array>) {
        if let Some(value) = self {
            value.push_arrays(out);
        }
    }

    fn rebuild_from(&self, arrays: &mut dyn Iterator<Item = Array>) -> Self {
        self.as_ref().map(|value| value.rebuild_from(arrays))
    }
}
