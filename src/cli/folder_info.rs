//! `lmx info DIR`: what a Hugging Face model folder holds, read from its files without loading
//! a weight: the bundled model and settings its `config.json` maps to, its parameters (a
//! quantized layer's counted unpacked, its scales and biases apart), dtypes, size and tokenizer.

use super::check::{bytes, group_digits};
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::quant::layout::QuantizedLayout;
use std::collections::BTreeMap;

/// What the stored tensors add up to.
#[derive(Default)]
struct Tally {
    /// Parameters, a quantized weight's counted as its unpacked elements.
    parameters: u64,
    /// Elements of quantized layers' `scales` and `biases`.
    quantization: u64,
    /// Bytes by stored dtype.
    bytes: BTreeMap<String, u64>,
    /// Layers quantized, by `(bits, group size)`.
    quantized: BTreeMap<(i32, i32), usize>,
}

/// Prints what `folder` holds.
pub fn describe(folder: &HfFolder) -> anyhow::Result<()> {
    let config_path = folder.dir().join(hf::CONFIG_FILE);
    let layout = QuantizedLayout::from_config(folder.config(), &config_path.display().to_string())?;
    let tally = tally(folder, layout.as_ref())?;
    let family = folder.family();
    println!("folder            {}", folder.dir().display());
    println!(
        "model             {} ({}, model_type `{}`)",
        family.model_name(),
        family.architecture(),
        family.model_type()
    );
    let settings: Vec<String> = folder
        .lmx_config()?
        .iter()
        .map(|(name, value)| format!("{name} = {value}"))
        .collect();
    println!("settings          {}", settings.join(", "));
    println!("parameters        {}", group_digits(tally.parameters));
    for ((bits, group_size), layers) in &tally.quantized {
        println!(
            "quantized         {layers} layers to {bits} bits in groups of {group_size} ({} scales and biases)",
            group_digits(tally.quantization)
        );
    }
    let total: u64 = tally.bytes.values().sum();
    let dtypes: Vec<String> = tally
        .bytes
        .iter()
        .map(|(dtype, size)| format!("{dtype} {}", bytes(*size)))
        .collect();
    println!(
        "weights           {} ({}) in {}",
        bytes(total),
        dtypes.join(", "),
        folder.weights().source().display()
    );
    let tokenizer = folder.tokenizer_file().map_or_else(
        || "none (give --tokenizer)".to_owned(),
        |path| path.display().to_string(),
    );
    println!("tokenizer         {tokenizer}");
    let special = |token: Option<String>| token.unwrap_or_else(|| "none".to_owned());
    println!(
        "special tokens    bos {}, eos {}",
        special(folder.bos_token()),
        special(folder.eos_token())
    );
    let template = match folder.chat_template()? {
        Some(_) => "yes",
        None => "none",
    };
    println!("chat template     {template}");
    Ok(())
}

fn tally(folder: &HfFolder, layout: Option<&QuantizedLayout>) -> anyhow::Result<Tally> {
    let weights = folder.weights();
    let quantization_of =
        |layer: &str| layout.and_then(|layout| layout.layer(layer, &|name| weights.contains(name)));
    let mut tally = Tally::default();
    for name in weights.names() {
        let stored = weights.get(name)?;
        let elements: u64 = stored.shape.iter().map(|&d| d as u64).product();
        *tally
            .bytes
            .entry(format!("{:?}", stored.dtype))
            .or_default() += elements * stored.dtype.bitsize() as u64 / 8;
        let (layer, leaf) = name.rsplit_once('.').unwrap_or(("", name));
        match (quantization_of(layer), leaf) {
            (Some(q), "weight") => {
                tally.parameters += elements * 32 / q.bits as u64;
                *tally.quantized.entry((q.bits, q.group_size)).or_default() += 1;
            }
            (Some(_), "scales" | "biases") => tally.quantization += elements,
            _ => tally.parameters += elements,
        }
    }
    Ok(tally)
}
