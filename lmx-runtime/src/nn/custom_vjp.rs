//! Functions whose gradient lmx writes out itself, through MLX's `custom_vjp`.
//!
//! A [`WithGradient`] value is a forward pass over arrays and its vector-Jacobian product. The
//! first call on a thread makes it an MLX custom function (an `mlx_closure` holding a copy of the
//! value); later calls with an equal value reuse that closure, so a model calls it like any op.
//! Inside [`without_gradients`] the forward pass runs directly, without the custom function and
//! its few microseconds of host time per call: the same numbers, for passes whose gradient is
//! never taken (generation). (The activations go further there: they take MLX's operations,
//! which fuse with their neighbours; `activation`.)

use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::Array;
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A function of arrays with its vector-Jacobian product written out.
pub(crate) trait WithGradient: Clone + PartialEq + 'static {
    /// What the function is, in error messages.
    const NAME: &'static str;

    /// The outputs for `inputs`.
    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>>;

    /// One cotangent per primal input, for the `cotangents` of the outputs.
    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>>;
}

/// An MLX custom function, freed with its thread.
struct Closure(mlx_sys::mlx_closure);

impl Drop for Closure {
    fn drop(&mut self) {
        // SAFETY: made by `mlx_custom_vjp` and freed once, here.
        unsafe { mlx_sys::mlx_closure_free(self.0) };
    }
}

thread_local! {
    /// The custom functions made on this thread, each with the value it was made from.
    static MADE: RefCell<Vec<(Box<dyn Any>, Closure)>> = const { RefCell::new(Vec::new()) };
    /// Why the last callback failed: mlx-c reports only a status, so the cause waits here.
    static FAILURE: RefCell<Option<Error>> = const { RefCell::new(None) };
    /// Inside [`without_gradients`].
    static GRADIENT_FREE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `body` with every function of this module as its plain forward pass, for passes whose
/// gradient is never taken (generation). The values are the same; only the gradient would differ,
/// were one taken after all. Scopes nest, and the previous mode is restored however `body` ends.
pub fn without_gradients<T>(body: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRADIENT_FREE.with(|flag| flag.set(self.0));
        }
    }
    let _restore = Restore(GRADIENT_FREE.with(|flag| flag.replace(true)));
    body()
}

/// Whether [`without_gradients`] is in force on this thread.
pub(crate) fn gradient_free() -> bool {
    GRADIENT_FREE.with(Cell::get)
}

/// `function` applied to `inputs`: through its custom function, or directly inside
/// [`without_gradients`].
pub(crate) fn apply<F: WithGradient>(function: &F, inputs: &[Array]) -> Result<Vec<Array>> {
    if gradient_free() {
        return function.forward(inputs);
    }
    let closure = MADE.with(|made| -> Result<mlx_sys::mlx_closure> {
        let mut made = made.borrow_mut();
        let found = made
            .iter()
            .find(|(value, _)| value.downcast_ref::<F>() == Some(function));
        if let Some((_, closure)) = found {
            return Ok(closure.0);
        }
        let closure = make(function.clone())?;
        made.push((Box::new(function.clone()), Closure(closure)));
        Ok(closure)
    })?;
    call(closure, inputs, F::NAME)
}

/// Whether this thread has made the custom function of `function`.
#[cfg(test)]
pub(crate) fn is_made<F: WithGradient>(function: &F) -> bool {
    MADE.with(|made| {
        made.borrow()
            .iter()
            .any(|(value, _)| value.downcast_ref::<F>() == Some(function))
    })
}

/// Makes the custom function of `function`, which it owns from then on.
fn make<F: WithGradient>(function: F) -> Result<mlx_sys::mlx_closure> {
    // SAFETY: each closure owns one boxed copy of `function`, freed by `free_payload` when mlx-c
    // frees the closure; mlx-c copies the two closures into the custom function, so those made
    // here are freed after it.
    unsafe {
        let payload = |function: F| Box::into_raw(Box::new(function)).cast::<c_void>();
        let fun = mlx_sys::mlx_closure_new_func_payload(
            Some(forward_callback::<F>),
            payload(function.clone()),
            Some(free_payload::<F>),
        );
        let fun_vjp = mlx_sys::mlx_closure_custom_new_func_payload(
            Some(vjp_callback::<F>),
            payload(function),
            Some(free_payload::<F>),
        );
        let mut custom = mlx_sys::mlx_closure_new();
        let status = mlx_sys::mlx_custom_vjp(&mut custom, fun, fun_vjp);
        mlx_sys::mlx_closure_free(fun);
        mlx_sys::mlx_closure_custom_free(fun_vjp);
        if status != 0 {
            mlx_sys::mlx_closure_free(custom);
            return Err(Error::Layout(format!(
                "MLX could not make the custom gradient of {}",
                F::NAME
            )));
        }
        Ok(custom)
    }
}

/// Calls `closure` on `inputs`.
fn call(closure: mlx_sys::mlx_closure, inputs: &[Array], name: &str) -> Result<Vec<Array>> {
    let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(Array::as_ptr).collect();
    // SAFETY: the vector copies the handles it is given (each array gains a reference), and both
    // vectors are freed here; `arrays_of` takes its own references out of the result.
    unsafe {
        let input = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let mut output = mlx_sys::mlx_vector_array_new();
        let status = mlx_sys::mlx_closure_apply(&mut output, closure, input);
        mlx_sys::mlx_vector_array_free(input);
        let result = if status == 0 {
            arrays_of(output)
        } else {
            let cause = FAILURE.with(|failure| failure.borrow_mut().take());
            Err(cause.unwrap_or_else(|| {
                Error::Mlx(Exception::custom(format!("{name} failed inside MLX")))
            }))
        };
        mlx_sys::mlx_vector_array_free(output);
        result
    }
}

/// The arrays in an mlx-c vector, each with its own reference.
///
/// # Safety
/// `vector` is a live mlx-c vector of arrays.
pub(super) unsafe fn arrays_of(vector: mlx_sys::mlx_vector_array) -> Result<Vec<Array>> {
    let size = mlx_sys::mlx_vector_array_size(vector);
    let mut arrays = Vec::with_capacity(size);
    for index in 0..size {
        let mut handle = mlx_sys::mlx_array_new();
        if mlx_sys::mlx_vector_array_get(&mut handle, vector, index) != 0 {
            mlx_sys::mlx_array_free(handle);
            return Err(Error::Layout("MLX returned an unreadable array".into()));
        }
        arrays.push(Array::from_ptr(handle));
    }
    Ok(arrays)
}

/// Writes `arrays` into the result vector of a callback; 0 on success, as mlx-c expects, and
/// otherwise 1 with the cause kept for [`call`].
///
/// # Safety
/// `result` points to a live mlx-c vector of arrays.
unsafe fn write_result(
    result: *mut mlx_sys::mlx_vector_array,
    arrays: Result<Vec<Array>>,
) -> c_int {
    match arrays {
        Ok(arrays) => {
            let handles: Vec<mlx_sys::mlx_array> = arrays.iter().map(Array::as_ptr).collect();
            mlx_sys::mlx_vector_array_set_data(result, handles.as_ptr(), handles.len())
        }
        Err(err) => {
            FAILURE.with(|failure| *failure.borrow_mut() = Some(err));
            1
        }
    }
}

unsafe extern "C" fn forward_callback<F: WithGradient>(
    result: *mut mlx_sys::mlx_vector_array,
    inputs: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    let function = &*payload.cast::<F>();
    let outcome = catch_unwind(AssertUnwindSafe(|| function.forward(&arrays_of(inputs)?)));
    write_result(result, outcome.unwrap_or_else(|_| Err(panicked::<F>())))
}

unsafe extern "C" fn vjp_callback<F: WithGradient>(
    result: *mut mlx_sys::mlx_vector_array,
    primals: mlx_sys::mlx_vector_array,
    cotangents: mlx_sys::mlx_vector_array,
    _outputs: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    let function = &*payload.cast::<F>();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        function.vjp(&arrays_of(primals)?, &arrays_of(cotangents)?)
    }));
    write_result(result, outcome.unwrap_or_else(|_| Err(panicked::<F>())))
}

unsafe extern "C" fn free_payload<F>(payload: *mut c_void) {
    drop(Box::from_raw(payload.cast::<F>()));
}

fn panicked<F: WithGradient>() -> Error {
    Error::Layout(format!("{} panicked inside MLX", F::NAME))
}
