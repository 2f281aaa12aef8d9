//! A `.lmx` model with adapters (`linear(.., lora_rank = r)`): the report lists the adapters and
//! counts gradients and optimizer moments for them only; without adapters everything trains.

use lmx_grammar::report::report;

#[test]
fn only_adapters_have_gradients_and_optimizer_state() {
    let path = format!(
        "{}/tests/accept/lora_adapters.lmx",
        env!("CARGO_MANIFEST_DIR")
    );
    let source = std::fs::read_to_string(&path).expect("the accept case");
    let model = lmx_grammar::check_source(&path, &source).unwrap_or_else(|e| panic!("{e}"));
    let adapted = report(&model, "default", 1, None).expect("report");
    let adapter_names: Vec<&str> = adapted
        .params
        .iter()
        .filter(|p| p.name.contains(".lora_"))
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(
        adapter_names,
        [
            "q_proj.lora_a",
            "q_proj.lora_b",
            "v_proj.lora_a",
            "v_proj.lora_b"
        ]
    );
    // Two layers of 64 -> 64 at rank 4: 2 * (64 * 4 + 4 * 64).
    assert_eq!(adapted.trainable_count, 1024);
    assert_eq!(adapted.param_count, 256 * 64 * 2 + 64 * 64 * 2 + 64 + 1024);
    assert_eq!(adapted.memory.gradients, 1024 * 4);
    assert_eq!(
        adapted.memory.optimizer,
        2 * 1024 * 4,
        "AdamW's two moments"
    );
    let plain = report(&model, "no_adapters", 1, None).expect("report");
    assert_eq!(plain.trainable_count, plain.param_count);
    assert_eq!(plain.memory.gradients, plain.param_count * 4);
}

/// Entries marked `frozen` (a layer, a list of blocks, a leaf of a group) have no gradients and
/// no optimizer state; an entry named `frozen` is not marked.
#[test]
fn frozen_entries_have_no_gradients_or_optimizer_state() {
    let path = format!(
        "{}/tests/accept/param_marks.lmx",
        env!("CARGO_MANIFEST_DIR")
    );
    let source = std::fs::read_to_string(&path).expect("the accept case");
    let model = lmx_grammar::check_source(&path, &source).unwrap_or_else(|e| panic!("{e}"));
    let marked = report(&model, "default", 1, None).expect("report");
    let embedding = 256 * 64;
    let layers = 2 * (64 + 64 * 64 + 64);
    let (scale, named_frozen, bias, proj) = (64, 64, 256, 64 * 256);
    assert_eq!(
        marked.param_count,
        embedding + layers + scale + named_frozen + bias + proj
    );
    assert_eq!(marked.trainable_count, scale + named_frozen + proj);
    assert_eq!(marked.memory.gradients, marked.trainable_count * 4);
    assert_eq!(marked.memory.optimizer, 2 * marked.trainable_count * 4);
}
