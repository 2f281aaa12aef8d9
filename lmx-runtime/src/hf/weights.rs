//! A folder's weights as published: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` names, memory-mapped and read one tensor at a time.
//!
//! Each tensor is copied once, from the mapped file into the MLX array that holds it (then cast
//! to the requested dtype and evaluated, so the stored-dtype copy is freed before the next
//! tensor is read), and its pages of the mapping are released from the process at once (the
//! kernel's page cache keeps them, shared and reclaimable): loading never holds a second copy of
//! the whole model in the process's memory.

use super::error::HfError;
use crate::checkpoint::tensor::dtype_name;
use memmap2::Mmap;
use mlx_rs::{Array, Dtype};
use safetensors::tensor::Metadata;
use safetensors::{Dtype as FileDtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The single-file weights' name.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One mapped safetensors file and its header.
struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Where the tensors' bytes start: after the header's length and the header.
    data_start: usize,
    header: Metadata,
}

impl Shard {
    /// Maps the file at `path` and reads its header, checking it against the file's size.
    fn open(path: PathBuf) -> Result<Shard, HfError> {
        let map = map(&path)?;
        let invalid = |err| file_error(&path, format!("not a valid safetensors file: {err}"));
        SafeTensors::deserialize(&map).map_err(invalid)?;
        let (header_len, header) = SafeTensors::read_metadata(&map).map_err(invalid)?;
        Ok(Shard {
            data_start: 8 + header_len,
            path,
            map,
            header,
        })
    }

    /// The names of the tensors the file holds.
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.header.tensors().into_keys()
    }
}

/// The tensors of a folder's weights, by their stored names, memory-mapped.
pub struct Weights {
    /// The file errors about a missing tensor name: the single file, or the index.
    source: PathBuf,
    shards: Vec<Shard>,
    /// Each stored tensor's shard.
    names: BTreeMap<String, usize>,
}

fn file_error(path: &Path, message: impl Into<String>) -> HfError {
    HfError::File {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn map(path: &Path) -> Result<Mmap, HfError> {
    let file = std::fs::File::open(path).map_err(|err| file_error(path, err.to_string()))?;
    // SAFETY: the mapping is read-only; a file truncated under it by another process is outside
    // what lmx can guard against, as for any memory-mapped reader (transformers' included).
    unsafe { Mmap::map(&file) }.map_err(|err| file_error(path, err.to_string()))
}

/// A tensor as stored: its file, dtype, shape and bytes (in the mapping).
pub struct Stored<'a> {
    /// The file holding it.
    pub path: &'a Path,
    /// Its stored dtype.
    pub dtype: FileDtype,
    /// Its stored shape.
    pub shape: Vec<usize>,
    map: &'a Mmap,
    /// Where its bytes are in the mapping.
    start: usize,
    end: usize,
}

impl Stored<'_> {
    /// The tensor as an MLX array of its stored dtype: one copy, out of the mapping, whose pages
    /// the process then gives back.
    pub fn to_array(&self) -> Result<Array, HfError> {
        let dtype = match self.dtype {
            FileDtype::F32 => Dtype::Float32,
            FileDtype::F16 => Dtype::Float16,
            FileDtype::BF16 => Dtype::Bfloat16,
            FileDtype::I32 => Dtype::Int32,
            FileDtype::U32 => Dtype::Uint32,
            FileDtype::U8 => Dtype::Uint8,
            other => {
                return Err(file_error(
                    self.path,
                    format!("{} tensors cannot be loaded", dtype_name(other)),
                ))
            }
        };
        let shape = self
            .shape
            .iter()
            .map(|&dim| i32::try_from(dim))
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|_| file_error(self.path, format!("shape {:?} is too large", self.shape)))?;
        if !cfg!(target_endian = "little") {
            return Err(file_error(
                self.path,
                "safetensors files are little-endian; this host is not",
            ));
        }
        let data = &self.map[self.start..self.end];
        // SAFETY: safetensors checked that `data` holds exactly the bytes of `shape` elements of
        // the stored dtype; MLX copies them into its own buffer (byte by byte, so the mapping's
        // alignment does not matter) before returning.
        let array = unsafe { Array::from_raw_data(data.as_ptr().cast(), &shape, dtype) };
        #[cfg(unix)]
        // SAFETY: the mapping is a read-only view of the file: dropping its pages changes no
        // byte of it (a later read faults them in again from the page cache or the file). Only
        // the process's resident memory shrinks; failing to is harmless.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                self.start,
                self.end - self.start,
            )
        };
        Ok(array)
    }
}

/// How many bytes of each tensor [`Weights::fingerprint`] reads.
pub const FINGERPRINT_BYTES: usize = 64 * 1024;

impl Weights {
    /// The weights of the folder `dir`: its index's shards if it has an index, else
    /// `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Weights, HfError> {
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return Weights::sharded(dir, &index);
        }
        let path = dir.join(WEIGHTS_FILE);
        if !path.exists() {
            return Err(file_error(
                dir,
                format!("holds neither {WEIGHTS_FILE} nor {INDEX_FILE}"),
            ));
        }
        let shard = Shard::open(path.clone())?;
        let names = shard.names().map(|name| (name, 0)).collect();
        Ok(Weights {
            source: path,
            shards: vec![shard],
            names,
        })
    }

    /// Sharded weights: every shard the index names must exist and hold the tensors the index
    /// places in it.
    fn sharded(dir: &Path, index: &Path) -> Result<Weights, HfError> {
        let text =
            std::fs::read_to_string(index).map_err(|err| file_error(index, err.to_string()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|err| file_error(index, format!("not valid JSON: {err}")))?;
        let weight_map = json
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| file_error(index, "has no `weight_map` object"))?;
        let mut shard_of: HashMap<&str, usize> = HashMap::new();
        let mut shards = Vec::new();
        let mut names = BTreeMap::new();
        for (tensor, file) in weight_map {
            let file = file.as_str().ok_or_else(|| {
                file_error(index, format!("`weight_map.{tensor}` is not a file name"))
            })?;
            if Path::new(file).components().count() != 1 {
                return Err(file_error(
                    index,
                    format!("shard `{file}` is not a file of the folder"),
                ));
            }
            let shard = match shard_of.get(file) {
                Some(&shard) => shard,
                None => {
                    let path = dir.join(file);
                    if !path.exists() {
                        return Err(HfError::MissingShard {
                            index: index.to_owned(),
                            shard: file.to_owned(),
                            tensor: tensor.clone(),
                        });
                    }
                    shards.push(Shard::open(path)?);
                    shard_of.insert(file, shards.len() - 1);
                    shards.len() - 1
                }
            };
            names.insert(tensor.clone(), shard);
        }
        let weights = Weights {
            source: index.to_owned(),
            shards,
            names,
        };
        for (name, &shard) in &weights.names {
            let shard = &weights.shards[shard];
            if shard.header.info(name).is_none() {
                return Err(HfError::MissingTensor {
                    path: shard.path.clone(),
                    tensor: name.clone(),
                });
            }
        }
        Ok(weights)
    }

    /// The file that errors about the set of tensors name: the single file, or the index.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The stored names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// Whether a tensor is stored under `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// A fingerprint of the weights, in hexadecimal: every tensor's name, dtype, shape and first
    /// [`FINGERPRINT_BYTES`] bytes, hashed (64-bit FNV-1a). It tells another model or another
    /// fine-tune of the same one from the weights a run recorded, reading a few megabytes where
    /// the files hold gigabytes.
    pub fn fingerprint(&self) -> Result<String, HfError> {
        let mut hash = fnv::FnvHasher::default();
        for name in self.names() {
            let stored = self.get(name)?;
            let head = stored.start..stored.end.min(stored.start + FINGERPRINT_BYTES);
            (name, format!("{:?}", stored.dtype), &stored.shape).hash(&mut hash);
            hash.write(&stored.map[head]);
        }
        Ok(format!("{:016x}", hash.finish()))
    }

    /// The tensor stored under `name`.
    pub fn get(&self, name: &str) -> Result<Stored<'_>, HfError> {
        let missing = || HfError::MissingTensor {
            path: self.source.clone(),
            tensor: name.to_owned(),
        };
        let shard = &self.shards[*self.names.get(name).ok_or_else(missing)?];
        let info = shard.header.info(name).ok_or_else(missing)?;
        // `Shard::open` checked the offsets against the file.
        let (start, end) = info.data_offsets;
        Ok(Stored {
            path: &shard.path,
            dtype: info.dtype,
            shape: info.shape.clone(),
            map: &shard.map,
            start: shard.data_start + start,
            end: shard.data_start + end,
        })
    }
}
