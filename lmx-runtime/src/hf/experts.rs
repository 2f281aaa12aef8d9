//! Sparse experts' weights: the bundled models keep each expert projection stacked as one
//! `[experts, out, in]` leaf (mlx-lm's `switch_mlp` layout, which `gather_mm` multiplies), while
//! transformers' checkpoints store one linear layer per expert. Loading stacks the experts'
//! tensors into the leaf; exporting splits the leaf again. A folder written by mlx-lm, which
//! stores the stacked leaf itself, loads by the leaf's own name.

use super::family::Family;

/// Per family: the stacked leaf's name ending, and transformers' per-expert name ending with
/// `{}` for the expert's index.
fn endings(family: Family) -> &'static [(&'static str, &'static str)] {
    match family {
        Family::Mixtral => &[
            (
                ".block_sparse_moe.switch_mlp.gate_proj.weight",
                ".block_sparse_moe.experts.{}.w1.weight",
            ),
            (
                ".block_sparse_moe.switch_mlp.up_proj.weight",
                ".block_sparse_moe.experts.{}.w3.weight",
            ),
            (
                ".block_sparse_moe.switch_mlp.down_proj.weight",
                ".block_sparse_moe.experts.{}.w2.weight",
            ),
        ],
        // Qwen3-Next's checkpoints name each expert's projections as DeepSeek's do.
        Family::DeepseekV2 | Family::DeepseekV3 | Family::Qwen3Next => &[
            (
                ".mlp.switch_mlp.gate_proj.weight",
                ".mlp.experts.{}.gate_proj.weight",
            ),
            (
                ".mlp.switch_mlp.up_proj.weight",
                ".mlp.experts.{}.up_proj.weight",
            ),
            (
                ".mlp.switch_mlp.down_proj.weight",
                ".mlp.experts.{}.down_proj.weight",
            ),
        ],
        _ => &[],
    }
}

/// The names transformers stores the stacked leaf `name` (transformers' name for it, of
/// `experts` experts) under, one per expert in order; `None` when `name` is no stacked leaf.
pub(crate) fn per_expert_names(family: Family, name: &str, experts: usize) -> Option<Vec<String>> {
    endings(family).iter().find_map(|(stacked, each)| {
        let stem = name.strip_suffix(stacked)?;
        Some(
            (0..experts)
                .map(|e| format!("{stem}{}", each.replace("{}", &e.to_string())))
                .collect(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixtral_experts_are_w1_w3_w2_by_index() {
        let names = per_expert_names(
            Family::Mixtral,
            "model.layers.1.block_sparse_moe.switch_mlp.up_proj.weight",
            2,
        );
        assert_eq!(
            names,
            Some(vec![
                "model.layers.1.block_sparse_moe.experts.0.w3.weight".to_string(),
                "model.layers.1.block_sparse_moe.experts.1.w3.weight".to_string(),
            ])
        );
        assert_eq!(
            per_expert_names(
                Family::Mixtral,
                "model.layers.1.block_sparse_moe.gate.weight",
                2
            ),
            None
        );
        assert_eq!(
            per_expert_names(
                Family::Llama,
                "model.layers.1.mlp.switch_mlp.up_proj.weight",
                2
            ),
            None
        );
    }
}
