//! The recurrences in the Rust front end: a `#[lmx::model]` whose forward pass calls
//! `ctx.causal_conv1d` and `ctx.ssd` (the same runtime functions `.lmx`'s built-ins lower to)
//! decodes through the generation cache's recurrent states as its full forward pass computes.

use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::nn::init::{self, Keys};
use lmx::runtime::nn::{EmbeddingParams, LinearParams};
use lmx::runtime::tensor::nn::{embedding, linear, silu};
use lmx::runtime::tensor::{Context as Pass, Tensor};
use lmx::runtime::{mlx_rs, Array, Result};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    vocab: i32,
    dim: i32,
    heads: i32,
    head_dim: i32,
    state: i32,
    chunk: i32,
}

impl Config {
    fn tiny() -> Config {
        Config {
            vocab: 32,
            dim: 16,
            heads: 4,
            head_dim: 4,
            state: 8,
            chunk: 4,
        }
    }

    /// The convolved channels: x, then B and C of one group.
    fn channels(&self) -> i32 {
        self.heads * self.head_dim + 2 * self.state
    }
}

#[lmx::model(
    config = Config,
    init = Ssm::build,
    forward = forward,
    vocab_size = vocab,
    presets(tiny = Config::tiny()),
)]
pub struct Ssm {
    embed: EmbeddingParams,
    /// x, B and C, then one step size per head.
    in_proj: LinearParams,
    conv: Array,
    a_log: Array,
    out_proj: LinearParams,
}

impl Ssm {
    fn build(config: &Config, keys: &mut Keys) -> Result<Ssm> {
        let channels = config.channels();
        Ok(Ssm {
            embed: init::embedding(config.vocab, config.dim, keys)?,
            in_proj: init::linear(config.dim, channels + config.heads, false, keys)?,
            conv: init::uniform(&[channels, 1, 3], 0.5, &keys.next()?)?,
            a_log: init::normal(&[config.heads], 0.5, &keys.next()?)?,
            out_proj: init::linear(config.heads * config.head_dim, config.vocab, false, keys)?,
        })
    }
}

fn forward(
    params: &Ssm<Tensor>,
    tokens: &Tensor,
    config: &Config,
    ctx: &mut Pass,
) -> Result<Tensor> {
    let (b, t) = (tokens.dim(0), tokens.dim(1));
    let inner = config.heads * config.head_dim;
    let projected = linear(&params.in_proj, &embedding(&params.embed, tokens)?)?;
    let channels = config.channels();
    let xbc = silu(&ctx.causal_conv1d(&projected.slice(-1, 0..channels)?, &params.conv, None)?)?;
    let dt = projected
        .slice(-1, channels..channels + config.heads)?
        .exp()?;
    let x = xbc
        .slice(-1, 0..inner)?
        .reshape(&[b, t, config.heads, config.head_dim])?;
    let bm = xbc
        .slice(-1, inner..inner + config.state)?
        .reshape(&[b, t, 1, config.state])?;
    let cm = xbc
        .slice(-1, inner + config.state..channels)?
        .reshape(&[b, t, 1, config.state])?;
    let a = params.a_log.exp()?.negative()?;
    let y = ctx.ssd(&x, &dt, &a, &bm, &cm, config.chunk)?;
    linear(&params.out_proj, &y.reshape(&[b, t, inner])?)
}

#[test]
fn rust_front_end_scan_decodes_as_its_full_forward() -> Result<()> {
    let config = Config::tiny();
    let params = Ssm::init(&config, 0)?;
    let key = mlx_rs::random::key(2)?;
    let tokens = mlx_rs::random::randint::<_, i32>(0, config.vocab, &[2, 11], &key)?;
    let full = Ssm::forward(&params, &config, &tokens, &mut Context::evaluation())?;
    let mut ctx = Context::generation();
    let mut pieces = Vec::new();
    for (from, to) in [(0, 6), (6, 7), (7, 8), (8, 11)] {
        let picked = Array::arange::<_, i32>(from, to, None)?;
        pieces.push(Ssm::forward(
            &params,
            &config,
            &tokens.take_axis(&picked, 1)?,
            &mut ctx,
        )?);
    }
    let decoded = mlx_rs::ops::concatenate(&pieces, 1)?;
    let error = decoded
        .subtract(&full)?
        .abs()?
        .max(false)?
        .item_exact::<f32>();
    assert!(error < 1e-5, "recurrent decoding differs by {error:e}");
    Ok(())
}
