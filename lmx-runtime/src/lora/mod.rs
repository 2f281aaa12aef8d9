//! Low-rank adapters (LoRA, Hu et al., 2021) as mlx-lm makes, saves and fuses them: attached to
//! chosen linear layers of any parameter tree ([`attach`]), saved apart from the base in mlx-lm's
//! adapter layout ([`save_adapters`], [`load_adapters`]), and fused into the base weights
//! ([`fuse`]). While a tree holds adapters only they train (`tree::specs`).

mod attach;
mod files;
mod fuse;

pub use attach::{attach, blocks, LoraParameters};
pub use files::{
    load_adapters, read_config, save_adapters, AdapterConfig, ADAPTERS_FILE, CONFIG_FILE,
};
pub use fuse::fuse;
