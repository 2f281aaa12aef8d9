//! DeepSeek-V3's group-limited routing (`route_groups`) against hand-computed choices.

use lmx::runtime::nn::route_groups;
use lmx::runtime::{Array, Result};

/// The chosen experts of each token, sorted (the order of the choices is not part of routing).
fn chosen(indices: &Array) -> Vec<Vec<i32>> {
    let k = *indices.shape().last().unwrap() as usize;
    let flat: Vec<i32> = indices
        .as_dtype(lmx::runtime::mlx_rs::Dtype::Int32)
        .and_then(|i| i.contiguous())
        .unwrap()
        .as_slice::<i32>()
        .to_vec();
    flat.chunks(k)
        .map(|row| {
            let mut row = row.to_vec();
            row.sort();
            row
        })
        .collect()
}

/// Eight experts in four groups of two: `[0.9, 0.1 | 0.5, 0.6 | 0.2, 0.3 | 0.8, 0.7]`.
fn scores() -> Array {
    Array::from_slice(&[0.9f32, 0.1, 0.5, 0.6, 0.2, 0.3, 0.8, 0.7], &[1, 1, 8])
}

#[test]
fn groups_are_chosen_first_by_their_two_best_scores() -> Result<()> {
    let zero = Array::zeros::<f32>(&[8])?;
    // The groups score 1.0, 1.1, 0.5 and 1.5: groups 3 and 1 stay open, so expert 0 (the best
    // single score, in group 0) is left out; of experts 2, 3, 6 and 7 the best three are 6, 7, 3.
    let idx = route_groups(&scores(), &zero, 3, 4, 2)?;
    assert_eq!(idx.shape(), [1, 1, 3]);
    assert_eq!(chosen(&idx), [[3, 6, 7]]);
    // One group (or every group open): the plain top 3, 0, 6, 7.
    assert_eq!(
        chosen(&route_groups(&scores(), &zero, 3, 1, 1)?),
        [[0, 6, 7]]
    );
    assert_eq!(
        chosen(&route_groups(&scores(), &zero, 3, 4, 4)?),
        [[0, 6, 7]]
    );
    Ok(())
}

#[test]
fn the_bias_moves_the_choice_and_nothing_else() -> Result<()> {
    // Lowering experts 6 and 7 by 0.5 makes group 3 score 0.5: groups 1 (1.1) and 0 (1.0) stay
    // open, and of experts 0..4 (biased 0.9, 0.1, 0.5, 0.6) the best three are 0, 3, 2.
    let bias = Array::from_slice(&[0f32, 0., 0., 0., 0., 0., -0.5, -0.5], &[8]);
    let idx = route_groups(&scores(), &bias, 3, 4, 2)?;
    assert_eq!(chosen(&idx), [[0, 2, 3]]);
    // The weights are the unbiased scores of the chosen experts.
    let weights = scores().take_along_axis(&idx, -1)?;
    let mut weights = weights.as_slice::<f32>().to_vec();
    weights.sort_by(f32::total_cmp);
    assert_eq!(weights, [0.5, 0.6, 0.9]);
    Ok(())
}

#[test]
fn every_token_is_routed_on_its_own() -> Result<()> {
    // Two tokens: the first as above, the second with the scores reversed (groups 0, 2 open by
    // 1.5 and 1.1; experts 0, 1, 4, 5 score 0.7, 0.8, 0.6, 0.5).
    let rows = [
        0.9f32, 0.1, 0.5, 0.6, 0.2, 0.3, 0.8, 0.7, 0.7, 0.8, 0.3, 0.2, 0.6, 0.5, 0.1, 0.9,
    ];
    let scores = Array::from_slice(&rows, &[2, 8]);
    let idx = route_groups(&scores, &Array::zeros::<f32>(&[8])?, 3, 4, 2)?;
    assert_eq!(chosen(&idx), [[3, 6, 7], [0, 1, 4]]);
    Ok(())
}

#[test]
fn a_routing_the_experts_cannot_make_is_refused() {
    let zero = Array::zeros::<f32>(&[8]).unwrap();
    let error = route_groups(&scores(), &zero, 3, 3, 2).unwrap_err();
    assert_eq!(
        error.to_string(),
        "state layout: route_groups needs scores [.., experts], bias [experts], experts in equal \
         groups, 1 <= topk_groups <= groups and 1 <= k <= experts; got scores [1, 1, 8], bias \
         [8], k 3, groups 3, topk_groups 2"
    );
}
