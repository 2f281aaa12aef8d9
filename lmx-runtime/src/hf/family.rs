//! The model families lmx reads and writes as Hugging Face folders: per family, the bundled model
//! it maps to, `config.json`'s keys as the model's settings (and back), and how the tensors of
//! transformers' checkpoints are named and laid out.
//!
//! A setting that changes what transformers' model computes and that the bundled `.lmx` model
//! cannot express is an error naming it; settings that only matter to transformers' training
//! (dropout rates, initialisation ranges, token ids) are not the model's and are not read.

use super::config::{rope, rope_base, ConfigReader};
use super::error::{HfError, Inexpressible};
use serde_json::{json, Map, Value};
use std::path::Path;

/// A model family: a `model_type` of `config.json` and the bundled model it loads into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `gpt2`: `models/gpt2.lmx`.
    Gpt2,
    /// `llama`: `models/llama.lmx`.
    Llama,
    /// `mistral`: `models/mistral.lmx`.
    Mistral,
    /// `mixtral`: `models/mixtral.lmx`.
    Mixtral,
    /// `gemma`: `models/gemma.lmx`.
    Gemma,
    /// `mpt`: `models/mpt.lmx`.
    Mpt,
    /// `qwen2`: `models/qwen2.lmx`.
    Qwen2,
    /// `qwen3`: `models/qwen3.lmx`.
    Qwen3,
    /// `gemma2`: `models/gemma2.lmx`.
    Gemma2,
    /// `gemma3_text`: `models/gemma3_text.lmx`.
    Gemma3Text,
    /// `phi3`: `models/phi3.lmx`.
    Phi3,
    /// `deepseek_v2`: `models/deepseek_v2.lmx`.
    DeepseekV2,
    /// `mamba2`: `models/mamba2.lmx`.
    Mamba2,
    /// `deepseek_v3`: `models/deepseek_v3.lmx`.
    DeepseekV3,
    /// `qwen3_next`: `models/qwen3_next.lmx`.
    Qwen3Next,
}

/// Every family, in the order errors list them.
pub const FAMILIES: [Family; 15] = [
    Family::Gpt2,
    Family::Llama,
    Family::Mistral,
    Family::Mixtral,
    Family::Gemma,
    Family::Mpt,
    Family::Qwen2,
    Family::Qwen3,
    Family::Gemma2,
    Family::Gemma3Text,
    Family::Phi3,
    Family::DeepseekV2,
    Family::Mamba2,
    Family::Qwen3Next,
    Family::DeepseekV3,
];

/// GPT-2's `Conv1D` layers, whose weights transformers stores `[in, out]` (MLX's are `[out, in]`).
const GPT2_CONV1D: [&str; 4] = [
    ".attn.c_attn.weight",
    ".attn.c_proj.weight",
    ".mlp.c_fc.weight",
    ".mlp.c_proj.weight",
];

impl Family {
    /// `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Mixtral => "mixtral",
            Family::Gemma => "gemma",
            Family::Mpt => "mpt",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma2 => "gemma2",
            Family::Gemma3Text => "gemma3_text",
            Family::Phi3 => "phi3",
            Family::DeepseekV2 => "deepseek_v2",
            Family::Mamba2 => "mamba2",
            Family::Qwen3Next => "qwen3_next",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }

    /// The bundled model's name (`LanguageModel::NAME`), which is the `model_type`.
    pub fn model_name(self) -> &'static str {
        self.model_type()
    }

    /// transformers' causal-LM class, for `architectures`.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Gpt2 => "GPT2LMHeadModel",
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
            Family::Gemma => "GemmaForCausalLM",
            Family::Mpt => "MptForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Gemma2 => "Gemma2ForCausalLM",
            Family::Gemma3Text => "Gemma3ForCausalLM",
            Family::Phi3 => "Phi3ForCausalLM",
            Family::DeepseekV2 => "DeepseekV2ForCausalLM",
            Family::Mamba2 => "Mamba2ForCausalLM",
            Family::Qwen3Next => "Qwen3NextForCausalLM",
            Family::DeepseekV3 => "DeepseekV3ForCausalLM",
        }
    }

    /// The family of `config.json` (read from `path`), by its `model_type`.
    pub fn of_config(path: &Path, config: &Value) -> Result<Family, HfError> {
        let found = config.get("model_type").and_then(Value::as_str);
        FAMILIES
            .into_iter()
            .find(|family| Some(family.model_type()) == found)
            .ok_or_else(|| HfError::UnknownModelType {
                path: path.to_owned(),
                found: found.unwrap_or("-").to_owned(),
                supported: FAMILIES.iter().map(|family| family.model_type()).collect(),
            })
    }

    /// The family whose bundled model is named `model`.
    pub fn of_model(model: &str) -> Option<Family> {
        FAMILIES
            .into_iter()
            .find(|family| family.model_name() == model)
    }

    /// Whether the output head shares the token embedding in `config.json`; transformers then
    /// leaves `lm_head.weight` out of the checkpoint.
    pub(crate) fn tied(self, config: &Value) -> bool {
        let default = matches!(
            self,
            Family::Gpt2 | Family::Gemma | Family::Mpt | Family::Gemma2 | Family::Gemma3Text
        );
        config
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    /// The bundled model's settings that `config.json` (read from `path`) gives, by the names of
    /// the `.lmx` model's `config` block. Settings it does not give (GPT-2's `pdrop`,
    /// `init_std`) keep the model's defaults.
    pub fn lmx_config(self, path: &Path, config: &Value) -> Result<Map<String, Value>, HfError> {
        let hf = ConfigReader::new(path, config)?;
        let mut out = Map::new();
        let mut set = |key: &str, value: Value| out.insert(key.to_owned(), value);
        match self {
            Family::Gpt2 => {
                let d_model = hf.size_or("n_embd", 768)?;
                set("vocab", hf.size_or("vocab_size", 50257)?.into());
                set("ctx", hf.size_or("n_positions", 1024)?.into());
                set("d_model", d_model.into());
                set("n_layers", hf.size_or("n_layer", 12)?.into());
                set("n_heads", hf.size_or("n_head", 12)?.into());
                set("eps", hf.float_or("layer_norm_epsilon", 1e-5)?.into());
                hf.require(
                    "n_inner",
                    (4 * d_model).into(),
                    "the bundled gpt2 model's MLP is 4 x n_embd wide",
                )?;
                hf.one_of(
                    "activation_function",
                    &["gelu_new", "gelu_pytorch_tanh"],
                    "the bundled gpt2 model uses GELU's tanh form (gelu_new)",
                )?;
                hf.require(
                    "scale_attn_weights",
                    true.into(),
                    "the bundled gpt2 model scales attention by 1/sqrt(head_dim)",
                )?;
                hf.require(
                    "scale_attn_by_inverse_layer_idx",
                    false.into(),
                    "the bundled gpt2 model does not scale attention by layer",
                )?;
                hf.require(
                    "add_cross_attention",
                    false.into(),
                    "the bundled gpt2 model has no cross-attention",
                )?;
                require_tied(&hf, true, "gpt2")?;
            }
            Family::Llama | Family::Mistral | Family::Mixtral => {
                let (name, rope_default) = match self {
                    Family::Llama => ("llama", 10000.0),
                    Family::Mistral => ("mistral", 10000.0),
                    _ => ("mixtral", 1e6),
                };
                let d_model = hf.size_or("hidden_size", 4096)?;
                let n_heads = hf.size_or("num_attention_heads", 32)?;
                let ctx = hf.size_or("max_position_embeddings", 2048)?;
                set("vocab", hf.size_or("vocab_size", 32000)?.into());
                set("ctx", ctx.into());
                set("d_model", d_model.into());
                set("n_layers", hf.size_or("num_hidden_layers", 32)?.into());
                set("n_heads", n_heads.into());
                set(
                    "n_kv_heads",
                    hf.size_or("num_key_value_heads", n_heads)?.into(),
                );
                set("d_ff", hf.size_or("intermediate_size", 11008)?.into());
                set("eps", hf.float_or("rms_norm_eps", 1e-6)?.into());
                if self == Family::Llama {
                    for (key, value) in llama_rope(&hf)? {
                        set(key, value);
                    }
                    set("tie", self.tied(config).into());
                } else {
                    set("rope_base", rope_base(&hf, rope_default)?.into());
                }
                hf.one_of(
                    "hidden_act",
                    &["silu"],
                    &format!("the bundled {name} model's MLP uses SiLU"),
                )?;
                let no_bias = format!("the bundled {name} model's projections have no bias");
                hf.require("attention_bias", false.into(), &no_bias)?;
                hf.require("mlp_bias", false.into(), &no_bias)?;
                if d_model % n_heads == 0 {
                    hf.require(
                        "head_dim",
                        (d_model / n_heads).into(),
                        &format!("the bundled {name} model's heads are hidden_size / num_attention_heads wide"),
                    )?;
                }
                match self {
                    Family::Mistral => {
                        let window = hf.size_or("sliding_window", ctx)?;
                        set("window", window.into());
                        set("global_every", 0.into());
                    }
                    Family::Mixtral => {
                        if let Some(window) = hf.get("sliding_window") {
                            if window.as_i64().is_none_or(|window| window < ctx) {
                                return Err(hf.error(
                                    "sliding_window",
                                    window,
                                    "the bundled mixtral model attends over the whole context \
                                     (a window of at least max_position_embeddings)",
                                ));
                            }
                        }
                        set("n_experts", hf.size_or("num_local_experts", 8)?.into());
                        set(
                            "experts_per_token",
                            hf.size_or("num_experts_per_tok", 2)?.into(),
                        );
                        hf.require(
                            "router_jitter_noise",
                            0.into(),
                            "the bundled mixtral model's router adds no noise",
                        )?;
                        // transformers adds the balancing loss only with `output_router_logits`.
                        let aux = match hf.get("output_router_logits").and_then(Value::as_bool) {
                            Some(true) => hf.float_or("router_aux_loss_coef", 0.001)?,
                            _ => 0.0,
                        };
                        set("router_aux_coef", aux.into());
                    }
                    _ => {}
                }
            }
            Family::Gemma => {
                set("vocab", hf.size_or("vocab_size", 256000)?.into());
                set("ctx", hf.size_or("max_position_embeddings", 8192)?.into());
                set("d_model", hf.size_or("hidden_size", 3072)?.into());
                set("n_layers", hf.size_or("num_hidden_layers", 28)?.into());
                let n_heads = hf.size_or("num_attention_heads", 16)?;
                set("n_heads", n_heads.into());
                set(
                    "n_kv_heads",
                    hf.size_or("num_key_value_heads", n_heads)?.into(),
                );
                set("head_dim", hf.size_or("head_dim", 256)?.into());
                set("d_ff", hf.size_or("intermediate_size", 24576)?.into());
                set("eps", hf.float_or("rms_norm_eps", 1e-6)?.into());
                set("rope_base", rope_base(&hf, 10000.0)?.into());
                let tanh =
                    "the bundled gemma model's MLP uses GELU's tanh form (gelu_pytorch_tanh)";
                // transformers 4 reads `hidden_activation` first; `hidden_act = "gelu"` is the
                // first releases' name for the tanh form, which transformers replaces by it.
                match hf.get("hidden_activation") {
                    Some(_) => hf.one_of(
                        "hidden_activation",
                        &["gelu_pytorch_tanh", "gelu_new"],
                        tanh,
                    )?,
                    None => hf.one_of(
                        "hidden_act",
                        &["gelu_pytorch_tanh", "gelu_new", "gelu"],
                        tanh,
                    )?,
                }
                hf.require(
                    "attention_bias",
                    false.into(),
                    "the bundled gemma model's projections have no bias",
                )?;
                require_tied(&hf, true, "gemma")?;
            }
            Family::Qwen2 | Family::Qwen3 | Family::Gemma2 | Family::Gemma3Text | Family::Phi3 => {
                return super::newer::lmx_config(self, &hf, self.tied(config));
            }
            Family::DeepseekV2 | Family::DeepseekV3 => {
                let version = match self {
                    Family::DeepseekV2 => super::deepseek::Version::V2,
                    _ => super::deepseek::Version::V3,
                };
                return super::deepseek::lmx_config(&hf, self.tied(config), version);
            }
            Family::Mamba2 => return super::recurrent::mamba2_config(&hf, self.tied(config)),
            Family::Qwen3Next => return super::qwen3_next::lmx_config(&hf, self.tied(config)),
            Family::Mpt => {
                set("vocab", hf.size_or("vocab_size", 50368)?.into());
                set("ctx", hf.size_or("max_seq_len", 2048)?.into());
                let d_model = hf.size_or("d_model", 2048)?;
                let n_heads = hf.size_or("n_heads", 16)?;
                set("d_model", d_model.into());
                set("n_layers", hf.size_or("n_layers", 24)?.into());
                set("n_heads", n_heads.into());
                set("expansion", hf.size_or("expansion_ratio", 4)?.into());
                set("eps", hf.float_or("layer_norm_epsilon", 1e-5)?.into());
                hf.require(
                    "no_bias",
                    true.into(),
                    "the bundled mpt model's layers have no bias",
                )?;
                let attn = hf.nested("attn_config")?;
                attn.require(
                    "alibi",
                    true.into(),
                    "the bundled mpt model positions tokens by ALiBi",
                )?;
                attn.require(
                    "alibi_bias_max",
                    8.into(),
                    "the bundled mpt model's ALiBi slopes are MPT's for a maximum bias of 8",
                )?;
                attn.require(
                    "clip_qkv",
                    Value::Null,
                    "the bundled mpt model does not clip queries, keys and values",
                )?;
                attn.require(
                    "qk_ln",
                    false.into(),
                    "the bundled mpt model does not normalise queries and keys",
                )?;
                if d_model % n_heads == 0 {
                    let head_dim = (d_model / n_heads) as f64;
                    attn.require(
                        "softmax_scale",
                        (1.0 / head_dim.sqrt()).into(),
                        "the bundled mpt model scales attention by 1/sqrt(head_dim)",
                    )?;
                }
            }
        }
        Ok(out)
    }

    /// `config.json` for the bundled model's configuration `lmx` (its settings by name), with
    /// `architectures`, `model_type` and `torch_dtype` (`dtype`'s name, e.g. `float32`).
    pub fn hf_config(self, lmx: &Value, dtype: &str) -> Result<Value, Inexpressible> {
        let get = |key: &str| lmx.get(key).cloned().unwrap_or(Value::Null);
        let model = self.model_name();
        let mut config = match self {
            Family::Gpt2 => json!({
                "vocab_size": get("vocab"),
                "n_positions": get("ctx"),
                "n_ctx": get("ctx"),
                "n_embd": get("d_model"),
                "n_layer": get("n_layers"),
                "n_head": get("n_heads"),
                "n_inner": null,
                "layer_norm_epsilon": get("eps"),
                "activation_function": "gelu_new",
                "resid_pdrop": get("pdrop"),
                "embd_pdrop": get("pdrop"),
                // The bundled model has no dropout on attention weights.
                "attn_pdrop": 0.0,
                "scale_attn_weights": true,
                "tie_word_embeddings": true,
            }),
            Family::Llama | Family::Mistral | Family::Mixtral => {
                let d_model = get("d_model").as_i64().unwrap_or(0);
                let n_heads = get("n_heads").as_i64().unwrap_or(1).max(1);
                let mut config = json!({
                    "vocab_size": get("vocab"),
                    "max_position_embeddings": get("ctx"),
                    "hidden_size": get("d_model"),
                    "num_hidden_layers": get("n_layers"),
                    "num_attention_heads": get("n_heads"),
                    "num_key_value_heads": get("n_kv_heads"),
                    "head_dim": d_model / n_heads,
                    "intermediate_size": get("d_ff"),
                    "rms_norm_eps": get("eps"),
                    "rope_theta": get("rope_base"),
                    "rope_scaling": null,
                    "hidden_act": "silu",
                    "attention_bias": false,
                    "mlp_bias": false,
                    "tie_word_embeddings": false,
                });
                let object = config.as_object_mut().expect("an object");
                match self {
                    Family::Llama => {
                        object.insert("tie_word_embeddings".into(), get("tie"));
                        if get("rope_scaling").as_str() == Some("llama3") {
                            object.insert(
                                "rope_scaling".into(),
                                json!({
                                    "rope_type": "llama3",
                                    "factor": get("rope_factor"),
                                    "low_freq_factor": get("rope_low_freq"),
                                    "high_freq_factor": get("rope_high_freq"),
                                    "original_max_position_embeddings": get("rope_original_ctx"),
                                }),
                            );
                        }
                    }
                    Family::Mistral => {
                        let global_every = get("global_every");
                        if global_every.as_i64() != Some(0) {
                            return Err(Inexpressible {
                                model: model.into(),
                                key: "global_every".into(),
                                value: global_every.to_string(),
                                reason: "every layer of transformers' Mistral attends through \
                                         the sliding window"
                                    .into(),
                            });
                        }
                        object.insert("sliding_window".into(), get("window"));
                    }
                    Family::Mixtral => {
                        object.insert("sliding_window".into(), Value::Null);
                        object.insert("num_local_experts".into(), get("n_experts"));
                        object.insert("num_experts_per_tok".into(), get("experts_per_token"));
                        object.insert("router_jitter_noise".into(), 0.0.into());
                        let aux = get("router_aux_coef").as_f64().unwrap_or(0.0);
                        object.insert("output_router_logits".into(), (aux != 0.0).into());
                        object.insert("router_aux_loss_coef".into(), aux.into());
                    }
                    _ => {}
                }
                config
            }
            Family::Gemma => json!({
                "vocab_size": get("vocab"),
                "max_position_embeddings": get("ctx"),
                "hidden_size": get("d_model"),
                "num_hidden_layers": get("n_layers"),
                "num_attention_heads": get("n_heads"),
                "num_key_value_heads": get("n_kv_heads"),
                "head_dim": get("head_dim"),
                "intermediate_size": get("d_ff"),
                "rms_norm_eps": get("eps"),
                "rope_theta": get("rope_base"),
                "rope_scaling": null,
                "hidden_act": "gelu_pytorch_tanh",
                "hidden_activation": "gelu_pytorch_tanh",
                "attention_bias": false,
                "tie_word_embeddings": true,
            }),
            Family::Qwen2 | Family::Qwen3 | Family::Gemma2 | Family::Gemma3Text | Family::Phi3 => {
                super::newer::hf_config(self, lmx)?
            }
            Family::DeepseekV2 => super::deepseek::hf_config(lmx, super::deepseek::Version::V2)?,
            Family::DeepseekV3 => super::deepseek::hf_config(lmx, super::deepseek::Version::V3)?,
            Family::Mamba2 => super::recurrent::mamba2_hf_config(lmx),
            Family::Qwen3Next => super::qwen3_next::hf_config(lmx)?,
            Family::Mpt => json!({
                "vocab_size": get("vocab"),
                "max_seq_len": get("ctx"),
                "d_model": get("d_model"),
                "n_layers": get("n_layers"),
                "n_heads": get("n_heads"),
                "expansion_ratio": get("expansion"),
                "layer_norm_epsilon": get("eps"),
                "no_bias": true,
                "learned_pos_emb": false,
                "attn_config": {
                    "alibi": true,
                    "alibi_bias_max": 8,
                    "clip_qkv": null,
                    "qk_ln": false,
                    "softmax_scale": null,
                    "attn_type": "multihead_attention",
                    "attn_impl": "torch",
                },
                "tie_word_embeddings": true,
            }),
        };
        let object = config.as_object_mut().expect("an object");
        object.insert("architectures".into(), json!([self.architecture()]));
        object.insert("model_type".into(), self.model_type().into());
        // transformers 4 reads `torch_dtype`, transformers 5 `dtype`.
        object.insert("torch_dtype".into(), dtype.into());
        object.insert("dtype".into(), dtype.into());
        Ok(config)
    }

    /// The name mlx-lm's module tree gives the leaf `name`: mlx-lm's GPT-2 holds the network as
    /// `model` (`model.h.0.attn.c_attn`), where the checkpoints have no prefix; every other
    /// family's names are the checkpoints'. Adapters must carry these names: mlx-lm loads them
    /// into its tree by name and skips a name it lacks without a word.
    pub fn mlx_lm_name(self, name: &str) -> String {
        match self {
            Family::Gpt2 => format!("model.{name}"),
            _ => name.to_owned(),
        }
    }

    /// The leaf or layer name of mlx-lm's `name` ([`mlx_lm_name`](Self::mlx_lm_name) undone).
    pub(crate) fn name_of_mlx_lm(self, name: &str) -> String {
        match self {
            Family::Gpt2 => name.strip_prefix("model.").unwrap_or(name).to_owned(),
            _ => name.to_owned(),
        }
    }

    /// The names under which a checkpoint may hold the leaf `name`, most usual first: the leaf's
    /// own (every family's checkpoints name their tensors as the bundled models name their
    /// leaves; GPT-2's published weights too, saved from `GPT2Model`), then for GPT-2
    /// `GPT2LMHeadModel.save_pretrained`'s `transformer.`-prefixed one and mlx-lm's own tree's
    /// (`model.h.0...`); an untied head of a model saved tied is the embedding.
    pub(crate) fn stored_names(self, name: &str, tied: bool) -> Vec<String> {
        let mut names = vec![name.to_owned()];
        match self {
            Family::Gpt2 => names.extend([format!("transformer.{name}"), self.mlx_lm_name(name)]),
            // A quantized head of a tied model is the embedding's weight, scales and biases.
            Family::Llama | Family::Mistral | Family::Mixtral
                if tied && name.starts_with("lm_head.") =>
            {
                names.push(name.replacen("lm_head.", "model.embed_tokens.", 1))
            }
            _ => {}
        }
        names
    }

    /// Whether the leaf `name` is stored transposed under transformers' names: GPT-2's `Conv1D`
    /// weights.
    pub fn transposed(self, name: &str) -> bool {
        self == Family::Gpt2 && GPT2_CONV1D.iter().any(|suffix| name.ends_with(suffix))
    }

    /// Whether the leaf `name`, stored as `stored`, is stored transposed: under transformers'
    /// names ([`transposed`](Self::transposed)), not under mlx-lm's, which hold every weight as
    /// the model does (mlx-lm's GPT-2 transposes the `Conv1D` weights as it loads them, and saves
    /// them so).
    pub(crate) fn stored_transposed(self, name: &str, stored: &str) -> bool {
        self.transposed(name) && stored != self.mlx_lm_name(name)
    }

    /// Whether a checkpoint's tensor `stored` (not a leaf of the model) is one transformers
    /// itself skips when loading: attention-mask and rotary buffers of older checkpoints, and
    /// the copy of a tied embedding as the head.
    pub(crate) fn skipped(self, stored: &str, tied: bool) -> bool {
        if tied && stored == "lm_head.weight" {
            return true;
        }
        match self {
            Family::Gpt2 => stored.ends_with(".attn.bias") || stored.ends_with(".attn.masked_bias"),
            Family::Llama
            | Family::Mistral
            | Family::Mixtral
            | Family::Qwen2
            | Family::Qwen3
            | Family::Phi3
            | Family::DeepseekV2 => stored.ends_with(".rotary_emb.inv_freq"),
            // The published checkpoints' multi-token-prediction head, which transformers'
            // model leaves out as well.
            // transformers leaves the checkpoints' multi-token-prediction layer out by name.
            Family::DeepseekV3 => {
                stored.starts_with("model.layers.61.") || stored.ends_with(".rotary_emb.inv_freq")
            }
            Family::Qwen3Next => {
                stored.starts_with("mtp.") || stored.ends_with(".rotary_emb.inv_freq")
            }
            Family::Gemma | Family::Mpt | Family::Gemma2 | Family::Gemma3Text | Family::Mamba2 => {
                false
            }
        }
    }
}

/// Fails unless `config.json` ties the output head to the embedding as the bundled `model` does.
fn require_tied(hf: &ConfigReader, tied: bool, model: &str) -> Result<(), HfError> {
    hf.require(
        "tie_word_embeddings",
        tied.into(),
        &format!("the bundled {model} model's output head is the token embedding"),
    )
}

/// Llama's RoPE settings: the base, and Llama 3's frequency scaling when `config.json` asks for it.
fn llama_rope(hf: &ConfigReader) -> Result<Vec<(&'static str, Value)>, HfError> {
    let rope = rope(
        hf,
        10000.0,
        &["llama3"],
        "the bundled llama model applies RoPE unscaled or with Llama 3's scaling (llama3)",
    )?;
    let mut settings = vec![("rope_base", rope.base.into())];
    if rope.kind == "llama3" {
        let p = &rope.params;
        settings.extend([
            ("rope_scaling", "llama3".into()),
            ("rope_factor", p.float_or("factor", 8.0)?.into()),
            ("rope_low_freq", p.float_or("low_freq_factor", 1.0)?.into()),
            (
                "rope_high_freq",
                p.float_or("high_freq_factor", 4.0)?.into(),
            ),
            (
                "rope_original_ctx",
                p.size_or("original_max_position_embeddings", 8192)?.into(),
            ),
        ]);
    } else {
        settings.push(("rope_scaling", "off".into()));
    }
    Ok(settings)
}
