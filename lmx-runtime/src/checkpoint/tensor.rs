//! MLX arrays to and from the little-endian bytes of a safetensors tensor.
//!
//! The dtypes stored are float32, float16, bfloat16, int32 and uint32: parameters, optimizer
//! state, the step count and the random key.

use half::{bf16, f16};
use mlx_rs::{Array, ArrayElement, Dtype};
use safetensors::Dtype as FileDtype;
use std::borrow::Cow;

/// One tensor's dtype, shape and row-major little-endian bytes.
pub(crate) struct TensorBytes {
    dtype: FileDtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// An element type stored in checkpoints, with its fixed-size little-endian encoding.
trait Element: ArrayElement + Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
    fn array(values: &[Self], shape: &[i32]) -> Array;
}

macro_rules! element {
    ($type:ty, $size:literal) => {
        impl Element for $type {
            const SIZE: usize = $size;

            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }

            fn get(bytes: &[u8]) -> Self {
                <$type>::from_le_bytes(bytes.try_into().expect("chunks of the element size"))
            }

            fn array(values: &[Self], shape: &[i32]) -> Array {
                Array::from_slice(values, shape)
            }
        }
    };
}

element!(f32, 4);
element!(f16, 2);
element!(bf16, 2);
element!(i32, 4);
element!(u32, 4);

/// The file dtype of an MLX dtype, when checkpoints store it.
fn file_dtype(dtype: Dtype) -> Option<FileDtype> {
    match dtype {
        Dtype::Float32 => Some(FileDtype::F32),
        Dtype::Float16 => Some(FileDtype::F16),
        Dtype::Bfloat16 => Some(FileDtype::BF16),
        Dtype::Int32 => Some(FileDtype::I32),
        Dtype::Uint32 => Some(FileDtype::U32),
        _ => None,
    }
}

/// A dtype's name as lmx prints it: MLX's lowercase name for the dtypes stored, safetensors' for
/// the others.
pub(crate) fn dtype_name(dtype: FileDtype) -> String {
    match dtype {
        FileDtype::F32 => "float32".into(),
        FileDtype::F16 => "float16".into(),
        FileDtype::BF16 => "bfloat16".into(),
        FileDtype::I32 => "int32".into(),
        FileDtype::U32 => "uint32".into(),
        other => format!("{other:?}"),
    }
}

/// The file dtype `array` is stored as, or a message naming its unsupported dtype.
pub(crate) fn stored_dtype(array: &Array) -> Result<FileDtype, String> {
    file_dtype(array.dtype()).ok_or_else(|| {
        format!(
            "{:?} arrays cannot be stored (float32, float16, bfloat16, int32, uint32 can)",
            array.dtype()
        )
    })
}

/// An array's shape as safetensors records it.
pub(crate) fn file_shape(array: &Array) -> Vec<usize> {
    array.shape().iter().map(|&dim| dim as usize).collect()
}

fn encode<T: Element>(array: &Array) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(array.size() * T::SIZE);
    if array.size() == 0 {
        return Ok(out);
    }
    let contiguous;
    let array = match array.try_as_slice::<T>() {
        Err(mlx_rs::error::AsSliceError::NotContiguous) => {
            contiguous = array.contiguous().map_err(|err| err.to_string())?;
            &contiguous
        }
        _ => array,
    };
    for &value in array.try_as_slice::<T>().map_err(|err| err.to_string())? {
        value.put(&mut out);
    }
    Ok(out)
}

fn decode<T: Element>(data: &[u8], shape: &[i32]) -> Array {
    let values: Vec<T> = data.chunks_exact(T::SIZE).map(T::get).collect();
    T::array(&values, shape)
}

impl TensorBytes {
    /// The bytes of `array`, evaluating it.
    pub(crate) fn from_array(array: &Array) -> Result<TensorBytes, String> {
        let dtype = stored_dtype(array)?;
        let data = match dtype {
            FileDtype::F32 => encode::<f32>(array),
            FileDtype::F16 => encode::<f16>(array),
            FileDtype::BF16 => encode::<bf16>(array),
            FileDtype::I32 => encode::<i32>(array),
            FileDtype::U32 => encode::<u32>(array),
            _ => unreachable!("stored_dtype returns only these"),
        }?;
        Ok(TensorBytes {
            dtype,
            shape: file_shape(array),
            data,
        })
    }
}

/// The array a safetensors tensor holds, or a message naming its unsupported dtype.
pub(crate) fn to_array(dtype: FileDtype, shape: &[usize], data: &[u8]) -> Result<Array, String> {
    let dims = shape
        .iter()
        .map(|&dim| i32::try_from(dim).map_err(|_| format!("dimension {dim} is too large")))
        .collect::<Result<Vec<i32>, String>>()?;
    match dtype {
        FileDtype::F32 => Ok(decode::<f32>(data, &dims)),
        FileDtype::F16 => Ok(decode::<f16>(data, &dims)),
        FileDtype::BF16 => Ok(decode::<bf16>(data, &dims)),
        FileDtype::I32 => Ok(decode::<i32>(data, &dims)),
        FileDtype::U32 => Ok(decode::<u32>(data, &dims)),
        other => Err(format!("{} tensors cannot be loaded", dtype_name(other))),
    }
}

impl safetensors::View for &TensorBytes {
    fn dtype(&self) -> FileDtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}
