//! Published parameter counts of the bundled models, computed from their `.lmx` files.

use lmx_grammar::report::{report, Report};

fn report_of(file: &str, preset: &str) -> Report {
    let path = format!("{}/../models/{file}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).expect("model file");
    let model = lmx_grammar::check_source(&path, &source).unwrap_or_else(|e| panic!("{e}"));
    report(&model, preset, 1, None).expect("report")
}

fn count(file: &str, preset: &str) -> u64 {
    report_of(file, preset).param_count
}

/// The parameter count of the benchmark anchor's GPT (shared/bench/anchor_mlx.py),
/// derived from its module structure: tied embeddings, positions of the run's length.
fn anchor_count(d: u64, layers: u64, vocab: u64, seq: u64) -> u64 {
    let ln = 2 * d;
    let linear = |i: u64, o: u64| i * o + o;
    let block = 2 * ln + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d);
    vocab * d + seq * d + layers * block + ln
}

#[test]
fn gpt2_published_counts() {
    assert_eq!(count("gpt2.lmx", "124m"), 124_439_808);
    assert_eq!(count("gpt2.lmx", "355m"), 354_823_168);
    assert_eq!(count("gpt2.lmx", "774m"), 774_030_080);
    assert_eq!(count("gpt2.lmx", "1558m"), 1_557_611_200);
}

#[test]
fn gpt2_anchor_presets_match_the_reference_structure() {
    assert_eq!(count("gpt2.lmx", "tiny"), anchor_count(64, 2, 256, 256));
    assert_eq!(count("gpt2.lmx", "small"), anchor_count(256, 6, 256, 256));
    assert_eq!(
        count("gpt2.lmx", "medium"),
        anchor_count(1024, 12, 256, 512)
    );
    assert_eq!(
        count("gpt2.lmx", "gpt2"),
        anchor_count(768, 12, 50304, 1024)
    );
}

#[test]
fn llama_published_counts() {
    assert_eq!(count("llama.lmx", "7b"), 6_738_415_616);
    assert_eq!(count("llama.lmx", "13b"), 13_015_864_320);
    // TinyLlama-1.1B (Zhang et al., 2024), the LLaMA of the generation benchmark.
    assert_eq!(count("llama.lmx", "tinyllama-1.1b"), 1_100_048_384);
    assert_eq!(count("llama.lmx", "70b"), 68_976_648_192);
}

#[test]
fn gemma_published_counts() {
    assert_eq!(count("gemma.lmx", "2b"), 2_506_172_416);
    assert_eq!(count("gemma.lmx", "7b"), 8_537_680_896);
}

#[test]
fn mistral_mixtral_mpt_published_counts() {
    assert_eq!(count("mistral.lmx", "7b"), 7_241_732_096);
    assert_eq!(count("mixtral.lmx", "8x7b"), 46_702_792_704);
    assert_eq!(count("mpt.lmx", "7b"), 6_649_286_656);
}

/// The families of issue 24 at their published sizes. Each expected count is what transformers'
/// own model class holds for the model's published `config.json` (built on the meta device and
/// counted with a tied head once; the values the model cards round: Llama 3.2 1B 1.24B, 3B
/// 3.21B, Llama 3.1 8B 8.03B, Qwen2.5 0.49B and 7.61B, Qwen3 0.6B and 8.2B, Gemma 2 2.61B and
/// 9.24B, Gemma 3 1B 1.0B and 4B 3.88B of text, Phi-3-mini 3.8B).
#[test]
fn newer_families_published_counts() {
    assert_eq!(count("llama.lmx", "llama-3.2-1b"), 1_235_814_400);
    assert_eq!(count("llama.lmx", "llama-3.2-3b"), 3_212_749_824);
    assert_eq!(count("llama.lmx", "llama-3.1-8b"), 8_030_261_248);
    assert_eq!(count("qwen2.lmx", "qwen2.5-0.5b"), 494_032_768);
    assert_eq!(count("qwen2.lmx", "qwen2.5-7b"), 7_615_616_512);
    assert_eq!(count("qwen3.lmx", "qwen3-0.6b"), 596_049_920);
    assert_eq!(count("qwen3.lmx", "qwen3-8b"), 8_190_735_360);
    assert_eq!(count("gemma2.lmx", "gemma-2-2b"), 2_614_341_888);
    assert_eq!(count("gemma2.lmx", "gemma-2-9b"), 9_241_705_984);
    assert_eq!(count("gemma3_text.lmx", "gemma-3-1b"), 999_885_952);
    assert_eq!(count("gemma3_text.lmx", "gemma-3-4b"), 3_880_263_168);
    assert_eq!(count("phi3.lmx", "phi-3-mini"), 3_821_079_552);
}

/// DeepSeek-V2-Lite: transformers' `DeepseekV2ForCausalLM` for its published `config.json`
/// holds 15,706,484,224 parameters (the model card's 15.7B), of which a token uses 2.4B-odd:
/// the report's FLOPs count only the 6 routed experts a token goes through.
#[test]
fn deepseek_v2_lite_published_count_and_active_flops() {
    let r = report_of("deepseek_v2.lmx", "v2-lite");
    assert_eq!(r.param_count, 15_706_484_224);
    let (d, layers, vocab, ctx) = (2048u64, 27u64, 102_400u64, 163_840u64);
    let attention_weights = d * 16 * 192 + d * (512 + 64) + 512 * 16 * 256 + 16 * 128 * d;
    let dense = 3 * d * 10_944;
    let routed = 6 * 3 * d * 1408 + 3 * d * 2 * 1408 + 64 * d;
    let weights = layers * attention_weights + dense + (layers - 1) * routed + vocab * d;
    let attention = layers * 4 * 16 * 192 * ctx;
    assert_eq!(r.flops_per_token, 3 * (2 * weights + attention));
}

/// Mixtral's gathered experts count two of eight experts' weights per token.
#[test]
fn sparse_mixtral_flops_count_the_chosen_experts() {
    let r = report_of("mixtral.lmx", "8x7b");
    let (d, layers, vocab, ctx) = (4096u64, 32u64, 32_000u64, 32_768u64);
    let per_layer = 2 * d * d + 2 * d * 1024 + d * 8 + 2 * 3 * d * 14_336;
    let weights = layers * per_layer + vocab * d;
    let attention = layers * 4 * 32 * 128 * ctx;
    assert_eq!(r.flops_per_token, 3 * (2 * weights + attention));
}

/// Mamba-2 at the published sizes (state-spaces/mamba2-130m, -370m, -780m: vocabulary padded to
/// 50,288, state 128, head width 64, one group, the head tied): transformers' `Mamba2ForCausalLM`
/// built from those settings holds these counts.
#[test]
fn mamba2_published_counts() {
    assert_eq!(count("mamba2.lmx", "mamba2-130m"), 128_989_632);
    assert_eq!(count("mamba2.lmx", "mamba2-370m"), 368_346_624);
    assert_eq!(count("mamba2.lmx", "mamba2-780m"), 780_161_280);
}

/// `lmx info`'s FLOPs of Mamba-2 130M: 3 x (2 x the weights of its matrix products + each
/// layer's scan in its chunked form), the scan counted by hand: per token, the chunk's `C.B`
/// scores (2 G L N) and mixing (2 H L P), the state in and out (4 H P N), and the convolution
/// (2 C K), with G = 1 group, L = 256, N = 128, H = 24 heads of P = 64, C = 1,792 channels, K = 4.
#[test]
fn mamba2_flops_count_the_scan() {
    let r = report_of("mamba2.lmx", "mamba2-130m");
    let layer_weights = 768 * 3352 + 1536 * 768;
    let weights: u64 = 24 * layer_weights + 768 * 50288;
    let scan: u64 = 2 * 256 * 128 + 2 * 24 * 256 * 64 + 4 * 24 * 64 * 128 + 2 * 1792 * 4;
    assert_eq!(r.flops_per_token, 3 * (2 * weights + 24 * scan));
}

#[test]
fn gpt2_names_shapes_and_costs() {
    let r = report_of("gpt2.lmx", "124m");
    let names: Vec<&str> = r.params.iter().take(6).map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "wte.weight",
            "wpe.weight",
            "h.0.ln_1.weight",
            "h.0.ln_1.bias",
            "h.0.attn.c_attn.weight",
            "h.0.attn.c_attn.bias"
        ]
    );
    assert_eq!(r.params[4].shape, vec![2304, 768]);
    assert!(r.params.iter().all(|p| !p.name.starts_with("lm_head")));
    // 6N + 12 L d T with T = ctx, as the benchmark anchors count.
    assert_eq!(r.flops_per_token_6n, 6 * 124_439_808 + 12 * 12 * 768 * 1024);
    // Matrix products: every linear plus the tied head; attention 4 d T per layer, all times 3.
    let linear_weights = 12 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072) + 50257 * 768;
    assert_eq!(
        r.flops_per_token,
        3 * (2 * linear_weights + 12 * 4 * 768 * 1024)
    );
    assert_eq!(r.memory.optimizer, 2 * r.memory.parameters);
}

#[test]
fn mistral_layer_pattern_varies_per_layer() {
    let path = format!("{}/../models/mistral.lmx", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).expect("model file");
    let model = lmx_grammar::check_source(&path, &source).expect("checks");
    let tiny = report(&model, "tiny", 2, Some(16)).expect("report");
    assert_eq!(tiny.seq, 16);
    assert!(tiny
        .params
        .iter()
        .any(|p| p.name == "model.layers.3.self_attn.q_proj.weight"));
}

/// Qwen3-Next-80B-A3B: transformers' `Qwen3NextForCausalLM` built on the meta device from the
/// published `config.json` (48 layers, 3 Gated DeltaNet to 1 gated attention, 512 experts of
/// which 10 route, one shared) holds 79,674,391,296 parameters (the model card's 80B; the
/// checkpoint's multi-token-prediction head, which transformers leaves out, is not counted).
#[test]
fn qwen3_next_published_count() {
    assert_eq!(count("qwen3_next.lmx", "80b-a3b"), 79_674_391_296);
}

/// DeepSeek-V3: transformers' `DeepseekV3ForCausalLM` built on the meta device from its config
/// class's defaults (V3's published config) holds 671,026,404,352 parameters (the model card's
/// 671B) and, as buffers, 58 MoE layers' 256-wide `e_score_correction_bias` (14,848 values),
/// which the checkpoint stores and the bundled model holds as leaves.
#[test]
fn deepseek_v3_published_count() {
    assert_eq!(count("deepseek_v3.lmx", "v3"), 671_026_404_352 + 58 * 256);
}
