//! How decoding's kernels read a weight: its rows of values as they lie, or packed by MLX's
//! affine quantization (a quantized model's layers), in 16-byte chunks either way.
//!
//! A quantized token is worth decoding only if it issues no more kernels than a dense one and
//! reads its smaller weights at the memory's speed: through MLX's `quantized_matmul`, an
//! operation per layer with the norms, activations and sums around it operations of their own,
//! 4-bit decoding was slower than bfloat16's (docs/benchmarks.md). So the matrix-vector kernels
//! take either form of weight ([`Weight`]) through one device interface ([`Format::header`]): a
//! matrix's row at an offset, a chunk of it loaded into registers (with its group's scale and
//! offset when packed), and the chunk's dot product with as many input values, accumulated in
//! float32.
//!
//! A packed chunk is four 32-bit words, `32 / bits` values each, the first value in the lowest
//! bits (MLX's `quantize`); each value is `scale * q + bias` of its group of `group_size` values
//! of the row, and a chunk lies in one group (`group_size` a multiple of the chunk's values), so
//! its dot product is `scale * sum(q x) + bias * sum(x)`, as MLX's quantized kernels compute it.

use super::kernel::TemplateArg;
use super::sums::pack_width;
use mlx_rs::{Array, Dtype};

/// The bit widths the kernels read: a value never straddles a 32-bit word, and a 16-byte chunk
/// (32 or 16 values) never two groups (2 bits would put 64 values in a chunk).
const BITS: [i32; 2] = [4, 8];

/// The group sizes MLX quantizes with.
const GROUP_SIZES: [i32; 3] = [32, 64, 128];

/// A weight `[features, width]` as a kernel reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Weight<'a> {
    /// The values themselves, of the input's dtype.
    Dense(&'a Array),
    /// MLX's affine quantization: `packed` (`uint32`, `[features, width * bits / 32]`), with a
    /// scale and an offset (`biases`) per group of `group_size` values of a row, both of the
    /// input's dtype, `[features, width / group_size]`.
    Affine {
        packed: &'a Array,
        scales: &'a Array,
        biases: &'a Array,
        bits: i32,
        group_size: i32,
    },
}

/// A weight's arrays held by handles of their own, for a product remembered until a later
/// kernel reads its weights ([`Weight::held`]).
#[derive(Clone, Debug)]
pub(crate) struct HeldWeight {
    arrays: Vec<Array>,
    /// A packed weight's bits and group size.
    packing: Option<(i32, i32)>,
}

impl HeldWeight {
    /// The weight it holds.
    pub(crate) fn weight(&self) -> Weight<'_> {
        match (&self.arrays[..], self.packing) {
            ([packed, scales, biases], Some((bits, group_size))) => Weight::Affine {
                packed,
                scales,
                biases,
                bits,
                group_size,
            },
            (arrays, _) => Weight::Dense(&arrays[0]),
        }
    }
}

/// The form of a launch's weights, which picks its kernel (all of one launch's weights have
/// one form; a packed one's bits and group size are template arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Dense,
    Affine,
}

impl Format {
    /// Both forms, in the order of the kernels' tables.
    pub(crate) const ALL: [Format; 2] = [Format::Dense, Format::Affine];

    /// The kernel's input names for weight `name`: the values, or the packed words, scales and
    /// offsets.
    pub(crate) fn inputs(self, name: &str) -> Vec<String> {
        match self {
            Format::Dense => vec![name.to_owned()],
            Format::Affine => vec![name.to_owned(), format!("{name}_s"), format!("{name}_z")],
        }
    }

    /// The device type reading a weight of this form ([`Format::header`]'s), over the element
    /// type `T` (and, packed, the template arguments `BITS` and `GS`).
    pub(crate) fn device_type(self) -> &'static str {
        match self {
            Format::Dense => "lmx_dense<T>",
            Format::Affine => "lmx_affine<T, BITS, GS>",
        }
    }

    /// The device code reading weights of this form: [`STREAM`] and its matrix type.
    pub(crate) fn header(self) -> String {
        let matrix = match self {
            Format::Dense => DENSE,
            Format::Affine => AFFINE,
        };
        format!("{STREAM}{matrix}")
    }

    /// A device expression of the matrix that weight `name`'s inputs are.
    pub(crate) fn matrix(self, name: &str) -> String {
        format!("{}{{{}}}", self.device_type(), self.inputs(name).join(", "))
    }

    /// A device expression of weight `name`'s width (its rows' values).
    pub(crate) fn width(self, name: &str) -> String {
        match self {
            Format::Dense => format!("{name}_shape[1]"),
            Format::Affine => format!("({name}_shape[1] * (32 / BITS))"),
        }
    }
}

impl<'a> Weight<'a> {
    /// A weight packed by MLX's affine quantization in `bits` by `group_size`, from its packed
    /// words, scales and offsets, in that order (tests build their weights so).
    #[cfg(test)]
    pub(crate) fn affine(parts: &'a [Array; 3], bits: i32, group_size: i32) -> Self {
        Weight::Affine {
            packed: &parts[0],
            scales: &parts[1],
            biases: &parts[2],
            bits,
            group_size,
        }
    }

    /// Its arrays, held.
    pub(crate) fn held(&self) -> HeldWeight {
        HeldWeight {
            arrays: self.arrays(),
            packing: self.packing(),
        }
    }

    /// A packed weight's bits and group size; `None` for a dense one.
    fn packing(&self) -> Option<(i32, i32)> {
        match *self {
            Weight::Dense(_) => None,
            Weight::Affine {
                bits, group_size, ..
            } => Some((bits, group_size)),
        }
    }

    pub(crate) fn format(&self) -> Format {
        match self.packing() {
            None => Format::Dense,
            Some(_) => Format::Affine,
        }
    }

    /// The array whose identity is the weight's (its values or packed words).
    pub(crate) fn values(&self) -> &'a Array {
        match *self {
            Weight::Dense(w) => w,
            Weight::Affine { packed, .. } => packed,
        }
    }

    /// Its rows: the output features it makes.
    pub(crate) fn features(&self) -> i32 {
        self.values().shape().first().copied().unwrap_or(0)
    }

    /// The values of each row: the input features it reads.
    pub(crate) fn width(&self) -> i32 {
        let columns = self.values().shape().get(1).copied().unwrap_or(0);
        match self {
            Weight::Dense(_) => columns,
            Weight::Affine { bits, .. } => columns.saturating_mul(32 / bits),
        }
    }

    /// The values one 16-byte chunk of a row holds, for inputs of `dtype`.
    pub(crate) fn chunk(&self, dtype: Dtype) -> i32 {
        match self {
            Weight::Dense(_) => pack_width(dtype),
            Weight::Affine { bits, .. } => 128 / bits,
        }
    }

    /// Whether a kernel over inputs of `dtype` reads it: a floating-point dtype, a 2-D weight of
    /// whole chunks; packed, in 4 or 8 bits by a group size MLX uses, the rows whole groups, the
    /// scales and offsets of `dtype` and one per group.
    pub(crate) fn fits(&self, dtype: Dtype) -> bool {
        use Dtype::{Bfloat16, Float16, Float32};
        let (features, width) = (self.features(), self.width());
        let shape_fits = self.values().ndim() == 2
            && features > 0
            && width > 0
            && width % self.chunk(dtype) == 0;
        let form_fits = match self {
            Weight::Dense(w) => w.dtype() == dtype,
            Weight::Affine {
                packed,
                scales,
                biases,
                bits,
                group_size,
            } => {
                let groups = [features, width / (*group_size).max(1)];
                BITS.contains(bits)
                    && GROUP_SIZES.contains(group_size)
                    && packed.dtype() == Dtype::Uint32
                    && width % group_size == 0
                    && [scales, biases]
                        .iter()
                        .all(|a| a.shape() == groups && a.dtype() == dtype)
            }
        };
        matches!(dtype, Float32 | Float16 | Bfloat16) && shape_fits && form_fits
    }

    /// The kernel's inputs for it, in [`Format::inputs`]'s order.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        match self {
            Weight::Dense(w) => vec![(*w).clone()],
            Weight::Affine {
                packed,
                scales,
                biases,
                ..
            } => [packed, scales, biases].map(|&a| a.clone()).to_vec(),
        }
    }

    /// The template arguments its form adds.
    pub(crate) fn template(&self) -> Vec<TemplateArg> {
        match self.packing() {
            None => Vec::new(),
            Some((bits, group_size)) => vec![
                TemplateArg::Int("BITS", bits),
                TemplateArg::Int("GS", group_size),
            ],
        }
    }

    /// Whether `weights` can share a launch: one form, and packed, the same bits and groups.
    pub(crate) fn alike<'w>(weights: impl IntoIterator<Item = &'w Weight<'a>>) -> bool
    where
        'a: 'w,
    {
        let mut packings = weights.into_iter().map(Weight::packing);
        let first = packings.next();
        packings.all(|packing| Some(packing) == first)
    }
}

/// The device types reading a weight matrix (`lmx_dense<T>`, `lmx_affine<T, BITS, GS>`), each
/// after [`STREAM`] in its own header ([`Format::header`]: MLX hashes a kernel's whole source at
/// every launch, so a kernel carries only the type it reads): `at(r, k,
/// offset)` is row `r` (of `k` values) from value `offset` (a multiple of the chunk's values);
/// a row's `load(c, aligned)` and `stream(c, aligned)` (around L1: a weight read once) read its
/// chunk `c`; `dot(chunk, x, aligned, acc)` adds the chunk's dot product with `VALUES` values
/// of `x`. `aligned` says that the matrix's and the input's pointers are 16-byte aligned (MLX's
/// allocations are; a view into one may not be): value by value otherwise. A dense row converts
/// from a pointer to its first value. They need [`super::matvec::HEADER`] before them.
const STREAM: &str = r#"
template <typename T>
__device__ __forceinline__ uint4 lmx_stream16(const T* p, bool aligned) {
  if (!aligned) {
    return lmx_matvec_load<T, 16 / int(sizeof(T))>(p, false);
  }
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

"#;

const DENSE: &str = r#"
template <typename T>
struct lmx_dense {
  using value = T;
  static constexpr int VALUES = 16 / int(sizeof(T));
  struct chunk {
    uint4 v;
  };
  struct row {
    const T* p;
    __device__ __forceinline__ row(const T* p) : p(p) {}
    __device__ __forceinline__ chunk load(int c, bool aligned) const {
      return {lmx_matvec_load<T, VALUES>(p + size_t(c) * VALUES, aligned)};
    }
    __device__ __forceinline__ chunk stream(int c, bool aligned) const {
      return {lmx_stream16<T>(p + size_t(c) * VALUES, aligned)};
    }
  };
  const T* w;
  __device__ __forceinline__ row at(int r, int k, int offset) const {
    return {w + size_t(r) * k + offset};
  }
  __device__ __forceinline__ bool aligned() const {
    return (reinterpret_cast<size_t>(w) % 16) == 0;
  }
  static __device__ __forceinline__ void dot(const chunk& c, const T* x, bool aligned, float& acc) {
    const uint4 xp = lmx_matvec_load<T, VALUES>(x, aligned);
    const T* wt = reinterpret_cast<const T*>(&c.v);
    const T* xt = reinterpret_cast<const T*>(&xp);
#pragma unroll
    for (int j = 0; j < VALUES; ++j) {
      acc += static_cast<float>(wt[j]) * static_cast<float>(xt[j]);
    }
  }
};

"#;

const AFFINE: &str = r#"
template <typename T, int BITS, int GS>
struct lmx_affine {
  using value = T;
  static constexpr int VALUES = 128 / BITS;
  static constexpr int PER_WORD = 32 / BITS;
  static constexpr unsigned MASK = (1u << BITS) - 1u;
  struct chunk {
    uint4 v;
    float s, b;
  };
  struct row {
    const uint32_t* p;
    const T* s;
    const T* b;
    int first;
    __device__ __forceinline__ chunk load(int c, bool aligned) const {
      const int g = (first + c * VALUES) / GS;
      return {lmx_matvec_load<uint32_t, 4>(p + size_t(c) * 4, aligned),
              static_cast<float>(s[g]), static_cast<float>(b[g])};
    }
    __device__ __forceinline__ chunk stream(int c, bool aligned) const {
      const int g = (first + c * VALUES) / GS;
      return {lmx_stream16<uint32_t>(p + size_t(c) * 4, aligned),
              static_cast<float>(__ldg(s + g)), static_cast<float>(__ldg(b + g))};
    }
  };
  const uint32_t* w;
  const T* s;
  const T* b;
  __device__ __forceinline__ row at(int r, int k, int offset) const {
    return {w + (size_t(r) * k + offset) / PER_WORD, s + size_t(r) * (k / GS),
            b + size_t(r) * (k / GS), offset};
  }
  __device__ __forceinline__ bool aligned() const {
    return (reinterpret_cast<size_t>(w) % 16) == 0;
  }
  // `q` as a float without a conversion instruction: 2^23 + q has q's bits as its mantissa.
  static __device__ __forceinline__ float value_of(unsigned q) {
    return __int_as_float(0x4B000000 | q) - 8388608.0f;
  }
  static __device__ __forceinline__ void dot(const chunk& c, const T* x, bool aligned, float& acc) {
    constexpr int XV = 16 / int(sizeof(T));
    const unsigned* words = reinterpret_cast<const unsigned*>(&c.v);
    float qx = 0.0f, sx = 0.0f;
#pragma unroll
    for (int l = 0; l < VALUES / XV; ++l) {
      const uint4 xp = lmx_matvec_load<T, XV>(x + l * XV, aligned);
      const T* xt = reinterpret_cast<const T*>(&xp);
#pragma unroll
      for (int j = 0; j < XV; ++j) {
        const int v = l * XV + j;
        const unsigned q = (words[v / PER_WORD] >> (BITS * (v % PER_WORD))) & MASK;
        const float xv = static_cast<float>(xt[j]);
        qx += value_of(q) * xv;
        sx += xv;
      }
    }
    acc += c.s * qx + c.b * sx;
  }
};
"#;
