//! Batched generation gives every sequence the tokens it gets alone, row for row: prompts of
//! different lengths left-padded together, a sequence joining a running batch, one waiting for
//! the batch to drain, per-sequence stop tokens, lengths and sampling settings; and a prompt
//! cache reused for a longer prompt gives the tokens of a fresh generation.

use lmx::models::{gpt2, hybrid, llama, mamba2, mistral};
use lmx::runtime::generate::{
    generate, generate_cached, BatchGenerator, BatchLimits, Event, FinishReason, PromptCache,
    Request, Sampling, SeqId,
};
use lmx::runtime::mlx_rs::random;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::Result;
use std::collections::HashMap;

/// `len` random tokens below `vocab`, from `seed`.
fn tokens(vocab: usize, len: usize, seed: u64) -> Result<Vec<u32>> {
    let ids = random::randint::<_, i32>(0, vocab as i32, &[len as i32][..], &random::key(seed)?)?;
    Ok(ids.as_slice::<i32>().iter().map(|&id| id as u32).collect())
}

fn greedy(max_tokens: usize) -> Sampling {
    Sampling {
        temperature: 0.0,
        top_k: None,
        max_tokens,
        ..Sampling::default()
    }
}

/// What one sequence produced in a batch: its tokens and why it ended.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
}

/// Records `events`, checking that nothing comes after a sequence's last event.
fn record(outcomes: &mut HashMap<SeqId, Outcome>, events: Vec<Event>) {
    for event in events {
        let outcome = outcomes.entry(event.id).or_default();
        assert!(
            outcome.finish.is_none(),
            "{:?} reported after its end",
            event.id
        );
        outcome.tokens.push(event.token);
        outcome.finish = event.finish;
    }
}

/// The tokens `request` gets alone, and why it ends.
fn alone<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    request: &Request,
) -> Result<Outcome> {
    let stop = request.stop_tokens.first().copied();
    let generation = generate::<M>(
        params,
        config,
        &request.prompt,
        &request.sampling,
        stop,
        |_| (),
    )?;
    let stopped = stop.is_some() && generation.tokens.last().copied() == stop;
    Ok(Outcome {
        tokens: generation.tokens,
        finish: Some(if stopped {
            FinishReason::Stop
        } else {
            FinishReason::Length
        }),
    })
}

/// Sequences of `M` decoded in one batch: three prompts of different lengths started together
/// (one greedy with a stop token, one sampled), a short one inserted after two steps (joining the
/// running batch), a long one inserted then (waiting for the batch to drain), each against its
/// own generation alone.
fn batch_matches_alone<M: LanguageModel>(config: &M::Config) -> Result<()> {
    let params = M::init(config, 0)?;
    let vocab = M::vocab_size(config);
    let mut requests = vec![
        Request {
            prompt: tokens(vocab, 7, 1)?,
            sampling: greedy(10),
            stop_tokens: Vec::new(),
        },
        Request {
            prompt: tokens(vocab, 12, 2)?,
            sampling: greedy(9),
            stop_tokens: Vec::new(),
        },
        Request {
            prompt: tokens(vocab, 3, 3)?,
            sampling: Sampling {
                temperature: 1.0,
                top_k: Some(20),
                seed: 11,
                max_tokens: 8,
                ..Sampling::default()
            },
            stop_tokens: Vec::new(),
        },
    ];
    // The first sequence stops at its fourth token, as it does alone.
    let free = alone::<M>(&params, config, &requests[0])?;
    requests[0].stop_tokens = vec![free.tokens[3]];
    let late = [
        Request {
            prompt: tokens(vocab, 5, 4)?,
            sampling: greedy(6),
            stop_tokens: Vec::new(),
        },
        Request {
            prompt: tokens(vocab, 40, 5)?,
            sampling: greedy(5),
            stop_tokens: Vec::new(),
        },
    ];
    let mut generator =
        BatchGenerator::<M>::new(params.clone(), config.clone(), BatchLimits::default())?;
    let mut ids: Vec<SeqId> = requests
        .iter()
        .map(|request| generator.insert(request.clone()))
        .collect::<Result<_>>()?;
    let mut outcomes = HashMap::new();
    for _ in 0..2 {
        record(&mut outcomes, generator.step()?);
    }
    for request in &late {
        ids.push(generator.insert(request.clone())?);
    }
    requests.extend(late);
    let mut steps = 0;
    while generator.active() > 0 {
        record(&mut outcomes, generator.step()?);
        steps += 1;
        assert!(steps < 100, "the batch never drains");
    }
    assert!(generator.step()?.is_empty(), "nothing left to report");
    for (id, request) in ids.iter().zip(&requests) {
        assert_eq!(
            outcomes[id],
            alone::<M>(&params, config, request)?,
            "{}: sequence {id:?} (prompt of {} tokens) differs in the batch",
            M::NAME,
            request.prompt.len()
        );
    }
    assert_eq!(outcomes[&ids[0]].finish, Some(FinishReason::Stop));
    Ok(())
}

#[test]
fn llama_batched_generation_matches_one_at_a_time() -> Result<()> {
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    batch_matches_alone::<llama::Llama>(&config)
}

/// LLaMA with heads of 64 (query heads 4 over 2 key heads), a shape lmx's decode attention
/// kernel takes on CUDA: a batch's traced step writes every row's key and value at the shared
/// slot as it attends, each row from its own start.
#[test]
fn llama_batched_generation_through_the_decode_attention_kernel() -> Result<()> {
    let mut config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    config.d_model = 256;
    config.d_ff = 256;
    batch_matches_alone::<llama::Llama>(&config)
}

/// Learned absolute positions: a padded or joining row counts its positions from its own first
/// slot, as alone.
#[test]
fn gpt2_batched_generation_matches_one_at_a_time() -> Result<()> {
    let config = gpt2::Config::preset("tiny").expect("gpt2 has a tiny preset");
    batch_matches_alone::<gpt2::Gpt2>(&config)
}

/// Sliding-window attention builds its own mask, which must hide the padding too.
#[test]
fn mistral_batched_generation_matches_one_at_a_time() -> Result<()> {
    let config = mistral::Config::preset("tiny").expect("mistral has a tiny preset");
    batch_matches_alone::<mistral::Mistral>(&config)
}

/// Recurrent states zero a row's padding out: rows of other lengths, and rows joining a running
/// batch (their states appended to the batch's), decode as alone.
#[test]
fn mamba2_and_hybrid_batched_generation_match_one_at_a_time() -> Result<()> {
    batch_matches_alone::<mamba2::Mamba2>(&mamba2::Config::preset("tiny").expect("tiny"))?;
    batch_matches_alone::<hybrid::Hybrid>(&hybrid::Config::preset("tiny").expect("tiny"))
}

/// A cancelled sequence, running or waiting, reports nothing more and frees its row; the others
/// go on as alone; a full batch leaves the next sequences waiting, a full queue refuses one more;
/// bad requests are refused at insert.
#[test]
fn cancel_limits_and_bad_requests() -> Result<()> {
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    let params = llama::Llama::init(&config, 0)?;
    let limits = BatchLimits {
        max_batch: 2,
        max_waiting: 2,
    };
    let mut generator =
        BatchGenerator::<llama::Llama>::new(params.clone(), config.clone(), limits)?;
    let request = |seed, max_tokens| -> Result<Request> {
        Ok(Request {
            prompt: tokens(256, 6, seed)?,
            sampling: greedy(max_tokens),
            stop_tokens: Vec::new(),
        })
    };
    let a = generator.insert(request(1, 5)?)?;
    let b = generator.insert(request(2, 5)?)?;
    let mut outcomes = HashMap::new();
    record(&mut outcomes, generator.step()?);
    let c = generator.insert(request(3, 4)?)?;
    let d = generator.insert(request(4, 4)?)?;
    let refused = generator.insert(request(6, 4)?).unwrap_err().to_string();
    assert!(refused.contains("max_waiting"), "{refused}");
    assert_eq!(generator.active(), 4);
    generator.cancel(a);
    generator.cancel(d);
    assert_eq!(generator.active(), 2);
    while generator.active() > 0 {
        record(&mut outcomes, generator.step()?);
    }
    assert_eq!(outcomes[&a].tokens.len(), 1, "nothing after the cancel");
    assert_eq!(outcomes[&a].finish, None);
    assert!(
        !outcomes.contains_key(&d),
        "a sequence cancelled while waiting never starts"
    );
    for (id, seed, max_tokens) in [(b, 2, 5), (c, 3, 4)] {
        assert_eq!(
            outcomes[&id],
            alone::<llama::Llama>(&params, &config, &request(seed, max_tokens)?)?
        );
    }
    let empty = Request {
        prompt: Vec::new(),
        ..request(5, 4)?
    };
    assert_eq!(
        generator.insert(empty).unwrap_err().to_string(),
        "configuration: generation needs a prompt of at least one token"
    );
    let mut biased = request(5, 4)?;
    biased.sampling.logit_bias.insert(256, 1.0);
    assert!(generator
        .insert(biased)
        .unwrap_err()
        .to_string()
        .contains("logit_bias"));
    assert!(generator
        .insert(request(5, 0)?)
        .unwrap_err()
        .to_string()
        .contains("max_tokens"));
    Ok(())
}

/// A second prompt that extends the first reuses the cache of the first (and its generated
/// tokens, where they match) and generates what a fresh generation does; a prompt that shares
/// only a prefix truncates the cache to it.
#[test]
fn a_prompt_cache_is_reused_for_a_shared_prefix() -> Result<()> {
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    let params = llama::Llama::init(&config, 0)?;
    let first = tokens(256, 30, 1)?;
    let mut cache = PromptCache::new();
    let run = |cache: &mut PromptCache, prompt: &[u32]| -> Result<Vec<u32>> {
        let generation = generate_cached::<llama::Llama>(
            &params,
            &config,
            cache,
            prompt,
            &greedy(8),
            None,
            |_| true,
        )?;
        Ok(generation.tokens)
    };
    let continued = run(&mut cache, &first)?;
    // The last token is not fed (nothing is generated after it).
    assert_eq!(cache.tokens(), [&first[..], &continued[..7]].concat());
    let mut second = first.clone();
    second.extend(&continued[..4]);
    second.extend(tokens(256, 5, 2)?);
    let fresh = generate::<llama::Llama>(&params, &config, &second, &greedy(8), None, |_| ())?;
    assert_eq!(run(&mut cache, &second)?, fresh.tokens);
    let mut third = first[..10].to_vec();
    third.extend(tokens(256, 3, 3)?);
    let fresh = generate::<llama::Llama>(&params, &config, &third, &greedy(8), None, |_| ())?;
    assert_eq!(run(&mut cache, &third)?, fresh.tokens);
    assert_eq!(&cache.tokens()[..13], &third[..]);
    Ok(())
}

/// Sequences joining a running batch one by one and leaving at different lengths (the batch's
/// rows going 1, 2, 3, 4 and down) decode through few traces of the compiled step, one per
/// bucket of rows (1, 2, 4) within one cache capacity block, and each gets its tokens alone.
#[test]
fn batch_step_traces_stay_bounded_as_rows_join_and_leave() -> Result<()> {
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    let params = llama::Llama::init(&config, 0)?;
    let limits = BatchLimits {
        max_batch: 4,
        max_waiting: 16,
    };
    let mut generator =
        BatchGenerator::<llama::Llama>::new(params.clone(), config.clone(), limits)?;
    let requests = (0..10u64)
        .map(|i| {
            Ok(Request {
                prompt: tokens(256, 2 + i as usize % 4, i)?,
                sampling: greedy(3 + (i as usize * 5) % 7),
                stop_tokens: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut ids = Vec::new();
    let mut outcomes = HashMap::new();
    let mut batch_sizes = std::collections::BTreeSet::new();
    let mut steps = 0;
    while ids.len() < requests.len() || generator.active() > 0 {
        if let Some(request) = requests.get(ids.len()) {
            ids.push(generator.insert(request.clone())?);
        }
        let events = generator.step()?;
        batch_sizes.insert(events.len());
        record(&mut outcomes, events);
        steps += 1;
        assert!(steps < 200, "the batch never drains");
    }
    assert!(
        batch_sizes.is_superset(&[1, 2, 3, 4].into()),
        "the batch ran {batch_sizes:?} rows"
    );
    assert!(
        (1..=3).contains(&generator.traces()),
        "{} traces for buckets of 1, 2 and 4 rows",
        generator.traces()
    );
    for (id, request) in ids.iter().zip(&requests) {
        assert_eq!(
            outcomes[id],
            alone::<llama::Llama>(&params, &config, request)?
        );
    }
    Ok(())
}

/// GRPO's rollouts ([`rollout::sample`]), decoded in one batch, are each row's own generation:
/// row `i` of prompts of different lengths (left-padded together) samples at temperature 1 with
/// seed `seed + i` the tokens `generate` gives it alone, and ends at the stop token where it
/// does alone; the rows laid out for the step hold the prompt and those tokens.
#[test]
fn grpo_rollouts_are_each_rows_own_generation() -> Result<()> {
    use lmx::runtime::objectives::{rollout, Length, Prompt};
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    let params = llama::Llama::init(&config, 0)?;
    let prompts = [(3, 1), (9, 2), (5, 3)]
        .into_iter()
        .map(|(len, seed)| {
            Ok(Prompt {
                ids: tokens(256, len, seed)?,
                answer: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (group, width) = (3, 16);
    let sampling = Sampling {
        temperature: 1.0,
        top_k: None,
        seed: 40,
        max_tokens: 7,
        ..Sampling::default()
    };
    let alone = |row: usize, stop: Option<u32>| -> Result<Vec<u32>> {
        let sampling = Sampling {
            seed: sampling.seed + row as u64,
            ..sampling.clone()
        };
        let prompt = &prompts[row / group].ids;
        Ok(generate::<llama::Llama>(&params, &config, prompt, &sampling, stop, |_| ())?.tokens)
    };
    // The fifth row's third token ends it (and any other row that draws it).
    let stop = alone(4, None)?[2];
    let decode = |ids: &[u32]| format!("{ids:?}");
    let rollouts = rollout::sample::<llama::Llama>(
        &params,
        &config,
        &prompts,
        group,
        &sampling,
        Some(stop),
        width,
        &decode,
        &Length { target: 4 },
    )?;
    let laid_out = rollouts.tokens.as_slice::<i32>().to_vec();
    for row in 0..prompts.len() * group {
        let completion = alone(row, Some(stop))?;
        assert_eq!(rollouts.completions[row], decode(&completion), "row {row}");
        let mut ids: Vec<i32> = prompts[row / group]
            .ids
            .iter()
            .map(|&id| id as i32)
            .collect();
        ids.extend(completion.iter().map(|&id| id as i32));
        ids.resize(width, 0);
        assert_eq!(laid_out[row * width..(row + 1) * width], ids, "row {row}");
    }
    assert_eq!(rollouts.completions[4], decode(&alone(4, None)?[..3]));
    Ok(())
}

/// A generator takes up new parameters between generations (GRPO's policy between updates):
/// rows that sample alike (the same settings, their own seeds) then get what a generator made
/// with those parameters gives them, through the decode step already traced. While sequences
/// run, new parameters are refused.
#[test]
fn new_parameters_reuse_the_compiled_step_between_generations() -> Result<()> {
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    let (first, second) = (
        llama::Llama::init(&config, 0)?,
        llama::Llama::init(&config, 1)?,
    );
    let limits = BatchLimits {
        max_batch: 4,
        max_waiting: 4,
    };
    let requests = (0..4u64)
        .map(|i| {
            Ok(Request {
                prompt: tokens(256, 3 + i as usize, i)?,
                sampling: Sampling {
                    temperature: 1.0,
                    top_k: Some(50),
                    seed: 7 + i,
                    max_tokens: 6 + i as usize,
                    ..Sampling::default()
                },
                stop_tokens: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let generate = |generator: &mut BatchGenerator<llama::Llama>| -> Result<Vec<Outcome>> {
        let ids: Vec<SeqId> = requests
            .iter()
            .map(|request| generator.insert(request.clone()))
            .collect::<Result<_>>()?;
        let mut outcomes = HashMap::new();
        while generator.active() > 0 {
            record(&mut outcomes, generator.step()?);
        }
        Ok(ids.iter().map(|id| outcomes.remove(id).unwrap()).collect())
    };
    let mut reused =
        BatchGenerator::<llama::Llama>::new(first.clone(), config.clone(), limits.clone())?;
    let before = generate(&mut reused)?;
    let traces = reused.traces();
    reused.set_params(second.clone())?;
    let after = generate(&mut reused)?;
    assert_eq!(reused.traces(), traces, "no new trace for new parameters");
    let mut fresh = BatchGenerator::<llama::Llama>::new(second.clone(), config.clone(), limits)?;
    assert_eq!(after, generate(&mut fresh)?);
    assert_ne!(before, after, "the new parameters were used");
    for (request, outcome) in requests.iter().zip(&after) {
        assert_eq!(*outcome, alone::<llama::Llama>(&second, &config, request)?);
    }

    reused.insert(requests[0].clone())?;
    let refused = reused.set_params(first).unwrap_err().to_string();
    assert!(
        refused.contains(
            "the parameters change between generations: 1 sequences are running or waiting"
        ),
        "{refused}"
    );
    Ok(())
}
