//! A CUDA kernel of lmx's own, compiled by MLX at run time (`mlx::core::fast::cuda_kernel`).
//!
//! MLX wraps the kernel's body in a `__global__` function whose parameters are the inputs (`const
//! T* name`, plus `name_shape` and `name_strides` when the body mentions them), then the outputs
//! (`U* name`), and whose first lines declare the template arguments (`using T = __nv_bfloat16;`,
//! `constexpr int N = 4;`).
//! It compiles the function with NVRTC on first use and keeps it for the process, by its name and
//! template arguments, not by its inputs' types. MLX 0.32 looks for a custom kernel in its disk
//! cache (under `/tmp/mlx/<version>/ptx`, or `MLX_PTX_CACHE_DIR`) but never writes one there, so
//! each process compiles every kernel it launches once (part of a GPU run's first step). So every
//! kernel here takes the element types it is compiled for as template arguments, and its name
//! carries a hash of its source and parameter names ([`source_name`]): should MLX cache custom
//! kernels on disk, another version of lmx with a changed kernel would not run the old one's
//! code. The launch grid counts threads, not blocks.
//!
//! MLX hashes a custom kernel's whole source at every launch (to name its compiled module), which
//! costs the host about a quarter of a microsecond a kilobyte (`bench/launch-cost/probe.py`), so
//! sources reach MLX without their comments and indentation ([`compact`]), and a kernel's header
//! (the device code it shares with others, most of its text) as a file it includes
//! ([`included`]).

use crate::error::{Error, Result};
use mlx_rs::{Array, Dtype, Stream};
use std::ffi::CString;

/// A kernel's source, compiled on first launch.
pub struct Kernel {
    raw: mlx_sys::mlx_fast_cuda_kernel,
    name: String,
    /// The file MLX's source includes for the header, where it does ([`included`]).
    header: Option<HeaderFile>,
}

/// A kernel's header as the file its source includes, and the template arguments launched so far.
/// MLX compiles a kernel for each set of template arguments on that set's first launch, which
/// may come long after the kernel was made (a server loading another model's shapes): the
/// file is written again then if it has gone.
struct HeaderFile {
    dir: std::path::PathBuf,
    text: String,
    launched: std::cell::RefCell<std::collections::HashSet<u64>>,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: made by `mlx_fast_cuda_kernel_new` and freed once, here.
        unsafe { mlx_sys::mlx_fast_cuda_kernel_free(self.raw) };
    }
}

/// Runs the kernel that `cell` made on this thread, or says why it could not be made.
pub fn with_kernel<T>(
    cell: &'static std::thread::LocalKey<Result<Kernel>>,
    run: impl FnOnce(&Kernel) -> Result<T>,
) -> Result<T> {
    cell.with(|made| match made {
        Ok(kernel) => run(kernel),
        Err(err) => Err(Error::Layout(err.to_string())),
    })
}

/// A template argument, declared at the top of the kernel's body.
#[derive(Clone, Copy, Debug)]
pub enum TemplateArg {
    /// `using NAME = <the CUDA type>;`
    Type(&'static str, Dtype),
    /// `constexpr int NAME = value;`
    Int(&'static str, i32),
}

/// How one launch runs: its outputs, its grid (in threads) and block, its template arguments.
pub struct Launch<'a> {
    /// Each output's shape and element type, in the order of the kernel's output names.
    pub outputs: &'a [(&'a [i32], Dtype)],
    /// Threads along x, y and z (MLX launches `ceil(grid / block)` blocks along each).
    pub grid: (i32, i32, i32),
    /// Threads per block along x, y and z.
    pub block: (i32, i32, i32),
    /// The kernel's template arguments.
    pub template: &'a [TemplateArg],
}

/// How a kernel's inputs reach its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// Made row-contiguous before a launch (copied when they are not).
    RowContiguous,
    /// As they lie, however strided: the body indexes them through `name_strides` (in elements).
    AsTheyLie,
}

impl Kernel {
    /// A kernel named `name` (and the hash of what MLX compiles, [`source_name`]) with `body` as
    /// its function body (and `header` before the function), reading the inputs `inputs` (laid
    /// out as `layout` says) and writing the outputs `outputs`, by those names.
    pub fn new(
        name: &str,
        (inputs, layout): (&[&str], Inputs),
        outputs: &[&str],
        header: &str,
        body: &str,
    ) -> Result<Kernel> {
        let (header, body) = (&compact(header), &compact(body));
        let name = &source_name(name, inputs, outputs, header, body);
        let file = included(header);
        let header = file.as_ref().map_or(header, |(_, line)| line);
        let text = |what: &str, value: &str| {
            CString::new(value).map_err(|_| {
                Error::Layout(format!("kernel {name}: a NUL byte in its {what} `{value}`"))
            })
        };
        let (name_c, header_c, body_c) = (
            text("name", name)?,
            text("header", header)?,
            text("body", body)?,
        );
        let input_names = strings(inputs, &text)?;
        let output_names = strings(outputs, &text)?;
        // SAFETY: every string outlives the call, which copies them; the string vectors are freed
        // here and the kernel by `Drop`.
        let kernel = unsafe {
            let inputs = string_vector(&input_names);
            let outputs = string_vector(&output_names);
            let kernel = mlx_sys::mlx_fast_cuda_kernel_new(
                name_c.as_ptr(),
                inputs,
                outputs,
                body_c.as_ptr(),
                header_c.as_ptr(),
                layout == Inputs::RowContiguous,
                0,
            );
            mlx_sys::mlx_vector_string_free(inputs);
            mlx_sys::mlx_vector_string_free(outputs);
            kernel
        };
        if kernel.ctx.is_null() {
            return Err(Error::Layout(format!(
                "MLX could not make the kernel {name}"
            )));
        }
        Ok(Kernel {
            raw: kernel,
            name: name.to_owned(),
            header: file.map(|(file, _)| file),
        })
    }

    /// Launches the kernel on `inputs` (lazily, as any MLX op) and returns its outputs.
    pub fn launch(&self, inputs: &[Array], launch: &Launch) -> Result<Vec<Array>> {
        if let Some(file) = &self.header {
            if file
                .launched
                .borrow_mut()
                .insert(template_key(launch.template))
            {
                header_file(&file.dir, &file.text).map_err(|err| {
                    Error::Layout(format!(
                        "kernel {}: its header file in {} cannot be written: {err}",
                        self.name,
                        file.dir.display()
                    ))
                })?;
            }
        }
        let names: Vec<CString> = launch
            .template
            .iter()
            .map(|arg| {
                let name = match arg {
                    TemplateArg::Type(name, _) | TemplateArg::Int(name, _) => name,
                };
                CString::new(*name).expect("template argument names are identifiers")
            })
            .collect();
        let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(Array::as_ptr).collect();
        let stream = Stream::thread_local_or_default();
        // SAFETY: the configuration and the vectors are made, used and freed here; mlx-c copies
        // the shapes and names it is given. `Array::from_ptr` takes the one reference that
        // `mlx_vector_array_get` hands out for each output.
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let mut status = 0;
            for (shape, dtype) in launch.outputs {
                status |= mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    *dtype as mlx_sys::mlx_dtype,
                );
            }
            let (gx, gy, gz) = launch.grid;
            let (bx, by, bz) = launch.block;
            status |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, gx, gy, gz);
            status |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, bx, by, bz);
            for (arg, name) in launch.template.iter().zip(&names) {
                status |= match *arg {
                    TemplateArg::Type(_, dtype) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                            config,
                            name.as_ptr(),
                            dtype as mlx_sys::mlx_dtype,
                        )
                    }
                    TemplateArg::Int(_, value) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                            config,
                            name.as_ptr(),
                            value,
                        )
                    }
                };
            }
            let input = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
            let mut output = mlx_sys::mlx_vector_array_new();
            if status == 0 {
                status = mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut output,
                    self.raw,
                    input,
                    config,
                    stream.as_ptr(),
                );
            }
            let mut outputs = Vec::new();
            if status == 0 {
                for index in 0..mlx_sys::mlx_vector_array_size(output) {
                    let mut handle = mlx_sys::mlx_array_new();
                    status |= mlx_sys::mlx_vector_array_get(&mut handle, output, index);
                    outputs.push(Array::from_ptr(handle));
                }
            }
            mlx_sys::mlx_vector_array_free(input);
            mlx_sys::mlx_vector_array_free(output);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            if status != 0 || outputs.len() != launch.outputs.len() {
                let shapes: Vec<&[i32]> = inputs.iter().map(Array::shape).collect();
                return Err(Error::Layout(format!(
                    "MLX could not launch the kernel {} on inputs of shapes {shapes:?}",
                    self.name
                )));
            }
            Ok(outputs)
        }
    }
}

/// The header as a file in lmx's cache folder ([`crate::platform::cache_dir`], `cuda/`) and the
/// `#include` of it that MLX is given in its place ([`header_file`]), so that the text MLX hashes
/// at every launch is the include's line, not the header (a decoder layer's MLP block's header is
/// about 7 KB of its 12); `None`, the header given inline, where it is empty or no such file can
/// be written or named in an include.
fn included(header: &str) -> Option<(HeaderFile, String)> {
    if header.is_empty() {
        return None;
    }
    // Absolute once: NVRTC resolves the include when it compiles, wherever the process is then.
    let dir = std::path::absolute(crate::platform::cache_dir()?.join("cuda")).ok()?;
    let line = include_line(&header_file(&dir, header).ok()?)?;
    let file = HeaderFile {
        dir,
        text: header.to_owned(),
        launched: Default::default(),
    };
    Some((file, line))
}

/// `#include "<path>"` and a line break, where the path is absolute and can be named so: text
/// without quotes, backslashes or control characters.
fn include_line(path: &std::path::Path) -> Option<String> {
    let path = path.to_str()?;
    let nameable = !path.contains(['"', '\\']) && !path.chars().any(char::is_control);
    (std::path::Path::new(path).is_absolute() && nameable).then(|| format!("#include \"{path}\"\n"))
}

/// The file in `dir` holding `header`, `lmx_<hash>.cuh` named by the hash of its text
/// ([`source_name`]), so that a changed header is another file; written whole under a fresh name
/// and renamed into place, so that no process reads it half-written, and written again where a
/// file of that name holds other text.
fn header_file(dir: &std::path::Path, header: &str) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join(format!("{}.cuh", source_name("lmx", &[], &[], header, "")));
    if std::fs::read(&path).is_ok_and(|text| text == header.as_bytes()) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    let mut partial = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut partial, header.as_bytes())?;
    partial.persist(&path).map_err(|err| err.error)?;
    Ok(path)
}

/// A hash of a launch's template arguments (their names and values), which name the module MLX
/// compiles for them.
fn template_key(template: &[TemplateArg]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    for arg in template {
        let (name, value) = match *arg {
            TemplateArg::Type(name, dtype) => (name, dtype as i64),
            TemplateArg::Int(name, value) => (name, i64::from(value) + (1 << 40)),
        };
        hasher.write(name.as_bytes());
        hasher.write_i64(value);
    }
    hasher.finish()
}

/// A header, last before the kernel, that gives it CUDA's launch bounds: at most `threads` a
/// block, and registers few enough for `blocks` blocks on each streaming multiprocessor.
///
/// MLX writes the kernel's signature itself (`__global__ void name(...)`, after the header),
/// with no place for `__launch_bounds__`, and NVRTC then allocates registers without a bound: one
/// register over 128 a thread leaves a block of 256 threads alone on its multiprocessor, half the
/// loads in flight that a ticketed decoding kernel counts on (docs/benchmarks.md, "Ninth
/// session of 2026-11-29"). So the header redefines the `__global__` macro that MLX's signature
/// uses to carry the bounds, where CUDA's headers define it as this expects (through
/// `__location__`); elsewhere the kernel compiles as before, without them.
pub fn launch_bounds(threads: i32, blocks: i32) -> String {
    format!(
        "#if defined(__global__) && defined(__location__) && defined(__launch_bounds__)\n\
         #undef __global__\n\
         #define __global__ __location__(global) __launch_bounds__({threads}, {blocks})\n\
         #endif\n"
    )
}

/// `name` followed by the FNV-1a hash of everything MLX compiles into the kernel besides its
/// template arguments: the parameter names, in order (each followed by the byte 0xfe, the inputs'
/// and the outputs' lists each by 0xff), `header`, 0xff, then `body`. Neither byte occurs in
/// UTF-8 text, so moving text from one part to another changes the hash. This is the name MLX
/// caches the kernel by.
pub fn source_name(
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    header: &str,
    body: &str,
) -> String {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    for list in [inputs, outputs] {
        for name in list {
            hasher.write(name.as_bytes());
            hasher.write_u8(0xfe);
        }
        hasher.write_u8(0xff);
    }
    hasher.write(header.as_bytes());
    hasher.write_u8(0xff);
    hasher.write(body.as_bytes());
    format!("{name}_{:016x}", hasher.finish())
}

/// `source` without its `//` comments, each line's leading and trailing spaces and its empty
/// lines; line breaks stay, for the preprocessor's directives. A line that holds a `"` is kept
/// whole, since its `//` could be inside a string, and a source with a line continued by `\` is
/// kept as it is, since a comment line ends a continued macro.
pub fn compact(source: &str) -> String {
    if source.lines().any(|line| line.trim_end().ends_with('\\')) {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let code = match line.find("//") {
            Some(at) if !line.contains('"') => &line[..at],
            _ => line,
        };
        let code = code.trim();
        if !code.is_empty() {
            out.push_str(code);
            out.push('\n');
        }
    }
    out
}

fn strings(values: &[&str], text: &impl Fn(&str, &str) -> Result<CString>) -> Result<Vec<CString>> {
    values
        .iter()
        .map(|value| text("argument name", value))
        .collect()
}

/// An mlx-c vector holding copies of `values`.
///
/// # Safety
/// The caller frees the vector.
unsafe fn string_vector(values: &[CString]) -> mlx_sys::mlx_vector_string {
    let vector = mlx_sys::mlx_vector_string_new();
    for value in values {
        mlx_sys::mlx_vector_string_append_value(vector, value.as_ptr());
    }
    vector
}

#[cfg(test)]
mod tests {
    use super::{compact, header_file, include_line, launch_bounds, source_name};

    #[test]
    fn compact_sources_keep_code_and_line_breaks() {
        let source = "\n  // why\n  int i = 0;  // the row\n\n#define N 4\n    \
                      if (i < N) {\n      y[i] = x[i] / 2;\n  }\n  printf(\"a // b\"); // c\n";
        assert_eq!(
            compact(source),
            "int i = 0;\n#define N 4\nif (i < N) {\ny[i] = x[i] / 2;\n}\n\
             printf(\"a // b\"); // c\n"
        );
        assert_eq!(compact("// only\n   \n"), "");
        let continued = "#define TWICE(x) \\\n  // what\n  (2 * (x))\n";
        assert_eq!(compact(continued), continued);
    }

    /// The bounds' header is preprocessor lines alone, which `compact` keeps as they are.
    #[test]
    fn launch_bounds_are_a_guarded_redefinition() {
        let header = launch_bounds(256, 2);
        assert_eq!(
            header,
            "#if defined(__global__) && defined(__location__) && defined(__launch_bounds__)\n\
             #undef __global__\n\
             #define __global__ __location__(global) __launch_bounds__(256, 2)\n\
             #endif\n"
        );
        assert_eq!(compact(&header), header);
    }

    #[test]
    fn a_kernel_is_named_by_its_source() {
        // FNV-1a of b"\xff\xff\xffa" and of b"x\xfe\xffy\xfe\xfffoo\xffbar", computed apart from
        // this code (in Python).
        assert_eq!(source_name("k", &[], &[], "", "a"), "k_994f00653e2970cf");
        assert_eq!(
            source_name("k", &["x"], &["y"], "foo", "bar"),
            "k_3c1618fc452cc9d6"
        );

        let name = |inputs: &[&str], header: &str, body: &str| {
            source_name("lmx_sum", inputs, &["out"], header, body)
        };
        let sum = name(&["x", "w"], "", "out[0] = x[0];");
        assert_eq!(sum, name(&["x", "w"], "", "out[0] = x[0];"));
        assert!(sum.starts_with("lmx_sum_") && sum.len() == "lmx_sum_".len() + 16);
        for other in [
            name(&["x", "w"], "", "out[0] = x[1];"),
            name(&["x", "w"], "out[0] = x[0];", ""),
            name(&["w", "x"], "", "out[0] = x[0];"),
            name(&["xw"], "", "out[0] = x[0];"),
            source_name("lmx_total", &["x", "w"], &["out"], "", "out[0] = x[0];"),
        ] {
            assert_ne!(sum, other);
        }
    }

    /// A header's file holds its text under its hash's name, is found again, and is written
    /// again where another text took its place or it is gone; a path an include cannot name is
    /// refused.
    #[test]
    fn headers_are_files_named_by_their_text() {
        let dir = tempfile::tempdir().unwrap();
        let cuda = dir.path().join("cuda");
        let header = "__device__ inline int lmx_two() { return 2; }\n";
        let path = header_file(&cuda, header).unwrap();
        assert_eq!(path.parent(), Some(cuda.as_path()));
        assert_eq!(
            path.file_name().unwrap().to_str().unwrap(),
            format!("{}.cuh", source_name("lmx", &[], &[], header, ""))
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), header);
        assert_eq!(header_file(&cuda, header).unwrap(), path);
        std::fs::write(&path, "int lmx_two;").unwrap();
        assert_eq!(header_file(&cuda, header).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), header);
        let other = header_file(&cuda, "#define LMX_THREE 3\n").unwrap();
        assert_ne!(other, path);
        // Only the two headers' files: no partial file is left behind.
        assert_eq!(std::fs::read_dir(&cuda).unwrap().count(), 2);
        // Gone, it is written again.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(header_file(&cuda, header).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), header);
        assert_eq!(
            include_line(&path).unwrap(),
            format!("#include \"{}\"\n", path.display())
        );
        for refused in [
            "/tmp/a\"b.cuh",
            "/tmp/a\\b.cuh",
            "/tmp/a\rb.cuh",
            "cuda/a.cuh",
        ] {
            assert_eq!(
                include_line(std::path::Path::new(refused)),
                None,
                "{refused:?}"
            );
        }
    }
}
