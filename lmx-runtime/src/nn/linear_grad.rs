//! The linear layer with its gradient written out, so that a weight's gradient comes out in the
//! weight's own layout.
//!
//! Differentiating `x @ w.T` through MLX's matmul and transpose gives the weight's gradient as a
//! transposed view of `x.T @ dy`. Every later elementwise kernel that reads it (the global norm,
//! the clip, the optimizer's fused update) then walks it column by column. Here the gradient is
//! `dy.T @ x`, a matrix product that lands row-major like the weight, at the same FLOPs. On the
//! CPU the compiled step of the 151M-parameter `medium` GPT went from 3.5 s to 1.5 s this way, all
//! of it in the optimizer's update (docs/benchmarks.md). The price: MLX keeps a custom function's
//! outputs until its gradient runs, so each layer's output lives until the backward pass.
//!
//! The layer is one MLX custom function (`mlx_custom_vjp`) made once per thread: a forward over
//! `[x, w]` or `[x, w, b]` and the vector-Jacobian product below. Where no gradient is wanted
//! (generation), [`without_gradients`] skips the custom function and its few microseconds of host
//! time per call: the plain product is the same numbers.

use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::{ops, Array};
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

/// The custom function (an `mlx_closure`), freed with its thread.
struct CustomLinear(mlx_sys::mlx_closure);

impl Drop for CustomLinear {
    fn drop(&mut self) {
        // SAFETY: the closure was made by `mlx_custom_vjp` and is freed once, here.
        unsafe { mlx_sys::mlx_closure_free(self.0) };
    }
}

thread_local! {
    static LINEAR: RefCell<Option<CustomLinear>> = const { RefCell::new(None) };
    /// Why the last callback failed: mlx-c reports only a status, so the cause waits here.
    static FAILURE: RefCell<Option<Error>> = const { RefCell::new(None) };
    /// Inside [`without_gradients`].
    static GRADIENT_FREE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `body` with the linear layers as plain matrix products, for forward passes whose gradient
/// is never taken (generation). The values are the same; only the layout of a weight's gradient
/// would differ, were one taken after all. Scopes nest, and the previous mode is restored however
/// `body` ends.
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

/// `x @ w.T (+ b)` over the last axis of `x`, with the gradient of `w` computed as `dy.T @ x`.
pub fn linear_with_row_major_grad(x: &Array, w: &Array, b: Option<&Array>) -> Result<Array> {
    let mut inputs = vec![x.clone(), w.clone()];
    inputs.extend(b.cloned());
    let outputs = if GRADIENT_FREE.with(Cell::get) {
        forward(&inputs)
    } else {
        through_custom_function(&inputs)
    };
    outputs?
        .pop()
        .ok_or_else(|| Error::Layout("the linear layer returned nothing".into()))
}

/// The custom function (made on first use) applied to `inputs`.
fn through_custom_function(inputs: &[Array]) -> Result<Vec<Array>> {
    LINEAR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let closure = match slot.as_ref() {
            Some(closure) => closure.0,
            None => slot.insert(CustomLinear(make()?)).0,
        };
        apply(closure, inputs)
    })
}

/// The forward pass, as `mlx.nn.Linear` computes it.
fn forward(inputs: &[Array]) -> Result<Vec<Array>> {
    let y = match inputs {
        [x, w] => x.matmul(w.t())?,
        [x, w, b] => ops::addmm(b, x, w.t(), None, None)?,
        _ => return Err(arity(inputs.len())),
    };
    Ok(vec![y])
}

/// `[dx, dw (, db)]` for the cotangent `dy` of the output.
fn vjp(primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
    let (x, w) = match primals {
        [x, w] | [x, w, _] => (x, w),
        _ => return Err(arity(primals.len())),
    };
    let dy = cotangents
        .first()
        .ok_or_else(|| Error::Layout("the linear layer's gradient got no cotangent".into()))?;
    let (outputs, features) = (w.shape()[0], w.shape()[1]);
    let dy_rows = dy.reshape(&[-1, outputs])?;
    let mut grads = vec![
        dy.matmul(w)?,
        dy_rows.t().matmul(x.reshape(&[-1, features])?)?,
    ];
    if primals.len() == 3 {
        grads.push(dy_rows.sum_axis(0, false)?);
    }
    Ok(grads)
}

fn arity(count: usize) -> Error {
    Error::Layout(format!(
        "the linear layer takes [x, w] or [x, w, b], got {count} arrays"
    ))
}

/// Makes the custom function from [`forward`] and [`vjp`].
fn make() -> Result<mlx_sys::mlx_closure> {
    // SAFETY: the callbacks are plain functions with no payload; mlx-c copies the closures it is
    // given into the custom function, so the two made here are freed after it.
    unsafe {
        let fun =
            mlx_sys::mlx_closure_new_func_payload(Some(forward_callback), ptr::null_mut(), None);
        let fun_vjp =
            mlx_sys::mlx_closure_custom_new_func_payload(Some(vjp_callback), ptr::null_mut(), None);
        let mut custom = mlx_sys::mlx_closure_new();
        let status = mlx_sys::mlx_custom_vjp(&mut custom, fun, fun_vjp);
        mlx_sys::mlx_closure_free(fun);
        mlx_sys::mlx_closure_custom_free(fun_vjp);
        if status != 0 {
            mlx_sys::mlx_closure_free(custom);
            return Err(Error::Layout(
                "MLX could not make the linear layer's custom gradient".into(),
            ));
        }
        Ok(custom)
    }
}

/// Calls `closure` on `inputs`.
fn apply(closure: mlx_sys::mlx_closure, inputs: &[Array]) -> Result<Vec<Array>> {
    let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
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
                Error::Mlx(Exception::custom("the linear layer failed inside MLX"))
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
unsafe fn arrays_of(vector: mlx_sys::mlx_vector_array) -> Result<Vec<Array>> {
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
/// otherwise 1 with the cause kept for [`apply`].
///
/// # Safety
/// `result` points to a live mlx-c vector of arrays.
unsafe fn write_result(
    result: *mut mlx_sys::mlx_vector_array,
    arrays: Result<Vec<Array>>,
) -> c_int {
    match arrays {
        Ok(arrays) => {
            let handles: Vec<mlx_sys::mlx_array> = arrays.iter().map(|a| a.as_ptr()).collect();
            mlx_sys::mlx_vector_array_set_data(result, handles.as_ptr(), handles.len())
        }
        Err(err) => {
            FAILURE.with(|failure| *failure.borrow_mut() = Some(err));
            1
        }
    }
}

unsafe extern "C" fn forward_callback(
    result: *mut mlx_sys::mlx_vector_array,
    inputs: mlx_sys::mlx_vector_array,
    _payload: *mut c_void,
) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| forward(&arrays_of(inputs)?)));
    write_result(result, outcome.unwrap_or_else(|_| Err(panicked())))
}

unsafe extern "C" fn vjp_callback(
    result: *mut mlx_sys::mlx_vector_array,
    primals: mlx_sys::mlx_vector_array,
    cotangents: mlx_sys::mlx_vector_array,
    _outputs: mlx_sys::mlx_vector_array,
    _payload: *mut c_void,
) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        vjp(&arrays_of(primals)?, &arrays_of(cotangents)?)
    }));
    write_result(result, outcome.unwrap_or_else(|_| Err(panicked())))
}

fn panicked() -> Error {
    Error::Layout("the linear layer panicked inside MLX".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::random;
    use mlx_rs::transforms::{compile::compile, value_and_grad_with_argnums as value_and_grad};

    /// `sum(linear(x, w, b) * r)`: its gradient in `x`, `w` and `b` is `r`'s pull-back.
    fn objective(
        linear: fn(&[Array]) -> Result<Array>,
        r: Array,
    ) -> impl FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception> {
        move |args: &[Array]| {
            let y = linear(args).map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&r)?.sum(false)?])
        }
    }

    fn custom(args: &[Array]) -> Result<Array> {
        linear_with_row_major_grad(&args[0], &args[1], args.get(2))
    }

    /// The formula differentiated by MLX itself: the independent reference.
    fn plain(args: &[Array]) -> Result<Array> {
        let y = args[0].matmul(args[1].t())?;
        Ok(match args.get(2) {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    fn inputs(bias: bool) -> (Vec<Array>, Array) {
        let key = |seed: u64| random::key(seed).unwrap();
        let x = random::normal::<f32>(&[2, 3, 4], None, None, &key(0)).unwrap();
        let w = random::normal::<f32>(&[5, 4], None, None, &key(1)).unwrap();
        let r = random::normal::<f32>(&[2, 3, 5], None, None, &key(3)).unwrap();
        let mut args = vec![x, w];
        if bias {
            args.push(random::normal::<f32>(&[5], None, None, &key(2)).unwrap());
        }
        (args, r)
    }

    fn max_difference(a: &Array, b: &Array) -> f32 {
        a.subtract(b)
            .unwrap()
            .abs()
            .unwrap()
            .max(false)
            .unwrap()
            .item_exact::<f32>()
    }

    #[test]
    fn values_and_gradients_match_mlx_differentiating_the_formula() {
        for bias in [false, true] {
            let (args, r) = inputs(bias);
            let argnums: Vec<i32> = (0..args.len() as i32).collect();
            let (ours, our_grads) =
                value_and_grad(objective(custom, r.clone()), &argnums)(&args).unwrap();
            let (theirs, their_grads) =
                value_and_grad(objective(plain, r.clone()), &argnums)(&args).unwrap();
            assert!(max_difference(&ours[0], &theirs[0]) < 1e-5);
            assert_eq!(our_grads.len(), args.len());
            for (index, (ours, theirs)) in our_grads.iter().zip(&their_grads).enumerate() {
                assert_eq!(ours.shape(), args[index].shape());
                let difference = max_difference(ours, theirs);
                assert!(
                    difference < 1e-5,
                    "input {index} (bias {bias}): {difference}"
                );
            }
        }
    }

    #[test]
    fn the_weight_gradient_is_dy_transposed_times_x_by_hand() {
        // x = [[1, 2]], w = [[1, 0], [0, 1], [1, 1]], r = [[1, 2, 3]]: dw = r.T @ x.
        let x = Array::from_slice(&[1.0f32, 2.0], &[1, 2]);
        let w = Array::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
        let r = Array::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]);
        let (_, grads) = value_and_grad(objective(custom, r), &[0, 1])(&[x, w]).unwrap();
        assert_eq!(grads[1].as_slice::<f32>(), [1.0, 2.0, 2.0, 4.0, 3.0, 6.0]);
        // dx = r @ w = [1 + 3, 2 + 3].
        assert_eq!(grads[0].as_slice::<f32>(), [4.0, 5.0]);
    }

    #[test]
    fn the_gradient_is_the_same_inside_a_compiled_function() {
        let (args, r) = inputs(true);
        let argnums = [0, 1, 2];
        let mut eager = value_and_grad(objective(custom, r.clone()), &argnums);
        let (_, expected) = eager(&args).unwrap();
        let grads_of = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let (_, grads) = value_and_grad(objective(custom, r.clone()), &argnums)(args)?;
            Ok(grads)
        };
        let mut compiled = compile(grads_of, false);
        let grads = compiled(&args).unwrap();
        for (ours, theirs) in grads.iter().zip(&expected) {
            let difference = max_difference(ours, theirs);
            assert!(difference < 1e-5, "{difference}");
        }
    }

    #[test]
    fn the_weight_gradient_comes_out_row_major_like_the_weight() {
        let (args, r) = inputs(true);
        let (_, grads) = value_and_grad(objective(custom, r), &[1])(&args).unwrap();
        mlx_rs::transforms::eval([&grads[0]]).unwrap();
        assert_eq!(grads[0].shape(), [5, 4]);
        assert_eq!(grads[0].strides(), [4, 1]);
    }

    #[test]
    fn without_gradients_the_custom_function_is_not_made_and_the_mode_is_restored() {
        // A fresh thread: its custom function is made on its first use outside the scope.
        std::thread::spawn(|| {
            let (args, _) = inputs(true);
            let made = || LINEAR.with(|cell| cell.borrow().is_some());
            let inside = without_gradients(|| {
                let nested = without_gradients(|| custom(&args).unwrap());
                // Still inside the outer scope after the nested one has ended.
                let after_nested = custom(&args).unwrap();
                assert!(max_difference(&nested, &after_nested) < 1e-6);
                after_nested
            });
            assert!(!made(), "inside the scopes the layer is the plain product");
            let outside = custom(&args).unwrap();
            assert!(made(), "outside it, the custom function");
            assert!(max_difference(&inside, &outside) < 1e-6, "the same numbers");

            let unwound = std::panic::catch_unwind(|| without_gradients(|| panic!("inside")));
            assert!(unwound.is_err());
            assert!(
                !GRADIENT_FREE.with(Cell::get),
                "the mode is restored after a scope that panicked"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn mismatched_shapes_are_an_error_that_names_them() {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]);
        let w = Array::from_slice(&[1.0f32, 0.0], &[1, 2]);
        let message = linear_with_row_major_grad(&x, &w, None)
            .unwrap_err()
            .to_string();
        assert!(message.contains("[matmul]"), "{message}");
        assert!(
            message.contains("(1,3)") && message.contains("(2,1)"),
            "{message}"
        );
    }
}
