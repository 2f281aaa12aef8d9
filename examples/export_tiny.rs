//! Writes the inputs of the reference test (`tests/models_reference.rs`): every bundled model at
//! its `tiny` preset, initialised from a fixed seed, and a fixed batch of tokens.
//!
//! ```text
//! cargo run --example export_tiny -- tests/fixtures
//! ```
//!
//! For each model `<name>` it writes, into the given folder (default `tests/fixtures`):
//! - `<name>_tiny.safetensors`: the parameters by their dotted tree names
//!   (`lmx::runtime::tree::names`), stored as float16 to keep the fixtures small; both the Rust
//!   test and the Python reference widen them to float32, so both compute on identical weights.
//!   Leaves that start constant (norm scales, biases) get noise of standard deviation 0.1, so
//!   that the reference checks how each of them is applied, not only its initial value;
//! - `<name>_tiny_io.safetensors`: `tokens`, int32 `[2, T]`. The Python reference
//!   (`tests/reference/models.py`) adds the logits it computes as `logits`.
//!
//! `tests/reference/make_fixtures.sh` runs this program and then the Python reference.

use lmx::models::{gemma, gpt2, llama, mistral, mixtral, mpt};
use lmx::runtime::checkpoint::save_tree;
use lmx::runtime::mlx_rs::{random, Dtype};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::nn::init::Keys;
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::{Array, Error, Result};
use std::path::{Path, PathBuf};

/// The seed of every model's parameters.
const SEED: u64 = 2024;

/// Writes the tiny parameters of `M` and a `[2, len]` batch of tokens drawn from `token_seed`.
fn export<M: LanguageModel>(dir: &Path, len: i32, token_seed: u64) -> Result<()> {
    let config = M::preset("tiny").expect("every bundled model has a tiny preset");
    let params = M::init(&config, SEED)?;
    // A key stream of its own: `init` drew the weights from SEED.
    let mut keys = Keys::from_seed(SEED + 1)?;
    let halves = tree::flatten(&params)
        .iter()
        .map(|leaf| -> Result<Array> {
            let constant =
                leaf.max(None)?.item_exact::<f32>() == leaf.min(None)?.item_exact::<f32>();
            let leaf = if constant {
                leaf.add(random::normal::<f32>(
                    leaf.shape(),
                    None,
                    0.1,
                    &keys.next()?,
                )?)?
            } else {
                leaf.clone()
            };
            Ok(leaf.as_dtype(Dtype::Float16)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let halves = tree::rebuild(&params, halves)?;
    save_tree(&dir.join(format!("{}_tiny.safetensors", M::NAME)), &halves)?;

    let vocab = M::vocab_size(&config) as i32;
    let key = random::key(token_seed)?;
    let tokens = random::randint::<_, i32>(0, vocab, &[2, len], &key)?;
    let path = dir.join(format!("{}_tiny_io.safetensors", M::NAME));
    Array::save_safetensors([("tokens", &tokens)], None, &path).map_err(|err| {
        Error::Checkpoint {
            path: path.clone(),
            message: err.to_string(),
        }
    })?;
    let mut count = 0;
    params.for_each(&mut |leaf: &Array| count += leaf.size());
    println!("{}: {count} parameters, tokens [2, {len}]", M::NAME);
    Ok(())
}

fn main() -> Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("tests/fixtures"), PathBuf::from);
    std::fs::create_dir_all(&dir).map_err(|cause| Error::Io {
        path: dir.clone(),
        cause,
    })?;
    export::<gpt2::Gpt2>(&dir, 16, 1)?;
    export::<llama::Llama>(&dir, 16, 2)?;
    export::<gemma::Gemma>(&dir, 16, 3)?;
    // 40 tokens: past the sliding window of 32, so the window changes the logits.
    export::<mistral::Mistral>(&dir, 40, 4)?;
    export::<mixtral::Mixtral>(&dir, 16, 5)?;
    export::<mpt::Mpt>(&dir, 16, 6)
}
