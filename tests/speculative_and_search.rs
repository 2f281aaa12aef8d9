//! Speculative decoding keeps the target's output: greedy, token for token, whether the draft
//! agrees often (the target itself) or seldom (another model); sampled, in distribution (a
//! chi-squared test over many seeds on a model of eight tokens, against the exact marginals).
//! Beam search and best-of-n find likely continuations (against an exhaustive search).

use lmx::models::llama;
use lmx::runtime::generate::sampler::Sampler;
use lmx::runtime::generate::{
    beam_search, best_of_n, generate, log_prob, speculative_generate, Models, Sampling,
};
use lmx::runtime::mlx_rs::ops::indexing::IndexOp;
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::{Array, Result};

fn config(vocab: i64, layers: i64) -> llama::Config {
    let mut config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    config.vocab = vocab as _;
    config.n_layers = layers as _;
    config
}

#[test]
fn greedy_speculative_output_is_the_targets() -> Result<()> {
    let target_config = config(256, 2);
    let target = llama::Llama::init(&target_config, 0)?;
    let draft_config = config(256, 1);
    let draft = llama::Llama::init(&draft_config, 1)?;
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 % 256) as u32).collect();
    let sampling = Sampling {
        temperature: 0.0,
        top_k: None,
        max_tokens: 40,
        ..Sampling::default()
    };
    let plain =
        generate::<llama::Llama>(&target, &target_config, &prompt, &sampling, None, |_| ())?;
    for (draft, draft_config, agrees) in [
        (&target, &target_config, true),
        (&draft, &draft_config, false),
    ] {
        for draft_tokens in [1, 3, 5] {
            let mut seen = Vec::new();
            let speculation = speculative_generate::<llama::Llama, llama::Llama>(
                Models {
                    target: (&target, &target_config),
                    draft: (draft, draft_config),
                },
                &prompt,
                &sampling,
                draft_tokens,
                None,
                |t| seen.push(t),
            )?;
            assert_eq!(
                speculation.generation.tokens, plain.tokens,
                "{draft_tokens} drafted"
            );
            assert_eq!(seen, plain.tokens);
            assert!(speculation.accepted <= speculation.drafted);
            if agrees {
                assert_eq!(
                    speculation.accepted, speculation.drafted,
                    "the target agrees with itself"
                );
            }
        }
    }
    // The stop token ends it as it ends plain generation.
    let stop = plain.tokens[9];
    let first = plain
        .tokens
        .iter()
        .position(|&t| t == stop)
        .expect("present");
    let stopped = speculative_generate::<llama::Llama, llama::Llama>(
        Models {
            target: (&target, &target_config),
            draft: (&draft, &draft_config),
        },
        &prompt,
        &sampling,
        4,
        Some(stop),
        |_| (),
    )?;
    assert_eq!(stopped.generation.tokens, plain.tokens[..=first]);
    Ok(())
}

/// The probabilities the sampler draws the token after `sequence` from, with `model`.
fn next_probs(
    params: &llama::Params,
    config: &llama::Config,
    sampling: &Sampling,
    sequence: &[u32],
) -> Result<Vec<f64>> {
    let ids: Vec<i32> = sequence.iter().map(|&t| t as i32).collect();
    let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
    let logits = llama::Llama::forward(params, config, &input, &mut Context::evaluation())?;
    let probs = Sampler::new(sampling, sequence)?.probabilities(&logits.index((0, -1)))?;
    Ok(probs
        .as_slice::<f32>()
        .iter()
        .map(|&p| f64::from(p))
        .collect())
}

/// Pearson's statistic of `counts` against `probs` (every expected count is at least 5 here).
fn chi_squared(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let expected = n as f64 * p;
            (c as f64 - expected).powi(2) / expected
        })
        .sum()
}

#[test]
fn sampled_speculative_output_is_distributed_as_the_targets() -> Result<()> {
    const RUNS: usize = 300;
    // Chi-squared with 7 degrees of freedom exceeds this with probability 0.001.
    const BOUND: f64 = 24.32;
    let vocab = 8;
    let target_config = config(vocab, 2);
    let target = llama::Llama::init(&target_config, 0)?;
    let draft_config = config(vocab, 1);
    let draft = llama::Llama::init(&draft_config, 5)?;
    let prompt = [1u32, 2, 3];
    let sampling = Sampling {
        temperature: 0.5,
        top_k: None,
        max_tokens: 2,
        ..Sampling::default()
    };
    // The exact marginals of the first two tokens under the target.
    let first = next_probs(&target, &target_config, &sampling, &prompt)?;
    let mut second = vec![0.0; vocab as usize];
    for (a, pa) in first.iter().enumerate() {
        let after = next_probs(&target, &target_config, &sampling, &[1, 2, 3, a as u32])?;
        for (b, pb) in after.iter().enumerate() {
            second[b] += pa * pb;
        }
    }
    // The test has power: drawing the first token from the draft would fail it.
    let drafts = next_probs(&draft, &draft_config, &sampling, &prompt)?;
    let power: f64 = drafts
        .iter()
        .zip(&first)
        .map(|(q, p)| RUNS as f64 * (q - p).powi(2) / p)
        .sum();
    assert!(
        power > 3.0 * BOUND,
        "the draft is too close to the target: {power}"
    );
    let mut counts = [vec![0; vocab as usize], vec![0; vocab as usize]];
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..RUNS as u64 {
        let speculation = speculative_generate::<llama::Llama, llama::Llama>(
            Models {
                target: (&target, &target_config),
                draft: (&draft, &draft_config),
            },
            &prompt,
            &Sampling {
                seed,
                ..sampling.clone()
            },
            2,
            None,
            |_| (),
        )?;
        let tokens = speculation.generation.tokens;
        assert_eq!(tokens.len(), 2);
        counts[0][tokens[0] as usize] += 1;
        counts[1][tokens[1] as usize] += 1;
        drafted += speculation.drafted;
        accepted += speculation.accepted;
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "both rules ran: {accepted} of {drafted} kept"
    );
    for (position, (counts, probs)) in counts.iter().zip([&first, &second]).enumerate() {
        let statistic = chi_squared(counts, probs);
        assert!(
            statistic < BOUND,
            "token {position}: chi-squared {statistic} against the target's marginal \
             (counts {counts:?}, probabilities {probs:?})"
        );
    }
    Ok(())
}

/// Every continuation of `len` tokens of an 8-token model, with its log-probability.
fn exhaustive(
    params: &llama::Params,
    config: &llama::Config,
    prompt: &[u32],
    len: u32,
) -> Result<Vec<(Vec<u32>, f64)>> {
    (0..8u32.pow(len))
        .map(|code| {
            let tokens: Vec<u32> = (0..len).map(|i| code / 8u32.pow(i) % 8).collect();
            let score = log_prob::<llama::Llama>(params, config, prompt, &tokens)?;
            Ok((tokens, score))
        })
        .collect()
}

/// Beam search of width 1 is greedy decoding; of width 64 over three tokens of eight it keeps
/// every prefix, so it finds the likeliest continuation of all 512; best-of-n returns the
/// sampled continuations, ranked by their log-probability.
#[test]
fn beam_search_and_best_of_n_find_likely_continuations() -> Result<()> {
    let config = config(8, 2);
    let params = llama::Llama::init(&config, 0)?;
    let prompt = [1u32, 2, 3];
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
        max_tokens: 3,
        ..Sampling::default()
    };
    let plain = generate::<llama::Llama>(&params, &config, &prompt, &greedy, None, |_| ())?;
    let narrow = beam_search::<llama::Llama>(&params, &config, &prompt, 1, 3, None)?;
    assert_eq!(narrow[0].tokens, plain.tokens);
    let all = exhaustive(&params, &config, &prompt, 3)?;
    let (best, best_score) = all
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("continuations");
    let wide = beam_search::<llama::Llama>(&params, &config, &prompt, 64, 3, None)?;
    assert_eq!(&wide[0].tokens, best);
    assert!((wide[0].log_prob - best_score).abs() < 1e-4);
    // A stop token finishes a beam early, the stop token included.
    let stopped = beam_search::<llama::Llama>(&params, &config, &prompt, 4, 3, Some(best[1]))?;
    assert!(stopped
        .iter()
        .all(|s| !s.tokens[..s.tokens.len() - 1].contains(&best[1])));
    let sampled = Sampling {
        temperature: 1.0,
        top_k: None,
        max_tokens: 3,
        seed: 7,
        ..Sampling::default()
    };
    let ranked = best_of_n::<llama::Llama>(&params, &config, &prompt, &sampled, 5, None)?;
    assert_eq!(ranked.len(), 5);
    let mut drawn: Vec<Vec<u32>> = (7..12)
        .map(|seed| {
            let sampling = Sampling {
                seed,
                ..sampled.clone()
            };
            Ok(
                generate::<llama::Llama>(&params, &config, &prompt, &sampling, None, |_| ())?
                    .tokens,
            )
        })
        .collect::<Result<_>>()?;
    let mut returned: Vec<Vec<u32>> = ranked.iter().map(|s| s.tokens.clone()).collect();
    drawn.sort();
    returned.sort();
    assert_eq!(returned, drawn);
    for pair in ranked.windows(2) {
        assert!(pair[0].mean_log_prob() >= pair[1].mean_log_prob());
    }
    for scored in &ranked {
        let (_, score) = all
            .iter()
            .find(|(t, _)| *t == scored.tokens)
            .expect("listed");
        assert!((scored.log_prob - score).abs() < 1e-4);
    }
    Ok(())
}
