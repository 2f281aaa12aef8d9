//! Packed windows, the train/validation split, seeded shuffling and resumable batch iteration.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use lmx_runtime::data::rng::SplitMix64;
use lmx_runtime::data::{
    write_token_file, Batch, BatchIterator, BatchPosition, DataError, Order, TokenDtype, TokenFile,
    Windows,
};
use mlx_rs::Dtype;

/// Tokens `base, base + 1, ...`: a token's value tells its position.
fn counting(base: u32, count: u32) -> Arc<Vec<u32>> {
    Arc::new((base..base + count).collect())
}

fn random_tokens(seed: u64, count: usize) -> Arc<Vec<u32>> {
    let mut rng = SplitMix64::new(seed);
    Arc::new((0..count).map(|_| rng.below(50_000) as u32).collect())
}

/// The windows of a batch over `counting(base, _)`: each row's first input tells its window.
fn windows_of(batch: &Batch, base: i32) -> Vec<usize> {
    batch
        .inputs
        .chunks(batch.seq_len)
        .map(|row| ((row[0] - base) as usize) / batch.seq_len)
        .collect()
}

fn take(iterator: &mut BatchIterator, count: usize) -> Vec<Batch> {
    (0..count).map(|_| iterator.next_batch().unwrap()).collect()
}

#[test]
fn windows_overlap_by_one_token_and_drop_the_short_tail() {
    let seq_len = 4;
    for (count, windows) in [(21, 5), (22, 5), (24, 5), (25, 6), (5, 1)] {
        let w = Windows::new(counting(100, count), seq_len).unwrap();
        assert_eq!(w.count(), windows, "{count} tokens");
        assert_eq!(w.tokens(), count as usize);
    }
    let w = Windows::new(counting(100, 21), seq_len).unwrap();
    let (mut inputs, mut targets) = (vec![0; 4], vec![0; 4]);
    for i in 0..w.count() {
        w.read(i, &mut inputs, &mut targets).unwrap();
        let first = 100 + (i * seq_len) as i32;
        assert_eq!(inputs, (first..first + 4).collect::<Vec<_>>());
        assert_eq!(targets, (first + 1..first + 5).collect::<Vec<_>>());
    }
}

#[test]
fn sequential_batches_have_exact_contents_and_wrap_to_the_next_epoch() {
    // 21 tokens 100..=120, seq_len 4: windows 0..5; batches of 2 leave window 4 out.
    let windows = Windows::new(counting(100, 21), 4).unwrap();
    let mut batches = BatchIterator::new(windows, 2, Order::Sequential, 0).unwrap();
    assert_eq!(batches.batches_per_epoch(), 2);

    let first = batches.next_batch().unwrap();
    assert_eq!(first.shape(), [2, 4]);
    assert_eq!(first.inputs, [100, 101, 102, 103, 104, 105, 106, 107]);
    assert_eq!(first.targets, [101, 102, 103, 104, 105, 106, 107, 108]);
    assert_eq!(
        batches.position(),
        BatchPosition {
            epoch: 0,
            index: 2,
            seed: 0
        }
    );
    let second = batches.next_batch().unwrap();
    assert_eq!(second.inputs, [108, 109, 110, 111, 112, 113, 114, 115]);
    assert_eq!(second.targets, [109, 110, 111, 112, 113, 114, 115, 116]);
    let third = batches.next_batch().unwrap();
    assert_eq!(third, first, "epoch 1 starts again at window 0");
    assert_eq!(
        batches.position(),
        BatchPosition {
            epoch: 1,
            index: 2,
            seed: 0
        }
    );
}

#[test]
fn a_batch_becomes_int32_arrays_of_its_shape() {
    let windows = Windows::new(counting(7, 40), 5).unwrap();
    let batch = BatchIterator::new(windows, 3, Order::Shuffled, 9)
        .unwrap()
        .next_batch()
        .unwrap();
    let (inputs, targets) = batch.to_arrays();
    for (array, host) in [(&inputs, &batch.inputs), (&targets, &batch.targets)] {
        array.eval().unwrap();
        assert_eq!(array.dtype(), Dtype::Int32);
        assert_eq!(array.shape(), &[3, 5]);
        assert_eq!(array.as_slice::<i32>(), host.as_slice());
    }
}

#[test]
fn shuffled_epochs_are_permutations_reproducible_by_seed() {
    // 12 windows of 3 tokens, batches of 3: 4 batches use every window once per epoch.
    let make = |seed| {
        let windows = Windows::new(counting(0, 37), 3).unwrap();
        BatchIterator::new(windows, 3, Order::Shuffled, seed).unwrap()
    };
    let epochs = |seed, count: usize| -> Vec<Vec<usize>> {
        let mut batches = make(seed);
        (0..count)
            .map(|_| {
                take(&mut batches, 4)
                    .iter()
                    .flat_map(|batch| windows_of(batch, 0))
                    .collect()
            })
            .collect()
    };
    let run = epochs(42, 3);
    for order in &run {
        let distinct: BTreeSet<usize> = order.iter().copied().collect();
        assert_eq!(distinct, (0..12).collect(), "each window once: {order:?}");
    }
    assert_ne!(run[0], (0..12).collect::<Vec<_>>(), "shuffled");
    assert_ne!(run[0], run[1], "each epoch has its own order");
    assert_ne!(run[1], run[2]);
    assert_eq!(epochs(42, 3), run, "same seed, same orders");
    assert_ne!(epochs(43, 3), run, "another seed, other orders");
}

#[test]
fn windows_left_over_differ_between_epochs() {
    // 10 windows, batches of 4: 2 windows sit out each epoch, not always the same two.
    let windows = Windows::new(counting(0, 21), 2).unwrap();
    let mut batches = BatchIterator::new(windows, 4, Order::Shuffled, 1).unwrap();
    let mut left_out = BTreeSet::new();
    for _ in 0..6 {
        let used: BTreeSet<usize> = take(&mut batches, 2)
            .iter()
            .flat_map(|batch| windows_of(batch, 0))
            .collect();
        assert_eq!(used.len(), 8);
        left_out.extend((0..10).filter(|w| !used.contains(w)));
    }
    assert!(left_out.len() > 2, "{left_out:?}");
}

#[test]
fn resuming_from_a_saved_position_yields_the_uninterrupted_batches() {
    // 1000 tokens, seq_len 7: 142 windows; batches of 5: 28 per epoch, 70 batches cross two
    // epoch boundaries.
    let tokens = random_tokens(3, 1000);
    let make = |seed| {
        let windows = Windows::new(tokens.clone(), 7).unwrap();
        BatchIterator::new(windows, 5, Order::Shuffled, seed).unwrap()
    };
    let uninterrupted = take(&mut make(1234), 70);

    for stop in [0, 1, 27, 28, 29, 55, 56, 69] {
        let mut first = make(1234);
        let before = take(&mut first, stop);
        assert_eq!(before, uninterrupted[..stop]);
        let saved = serde_json::to_string(&first.position()).unwrap();
        drop(first);

        let restored: BatchPosition = serde_json::from_str(&saved).unwrap();
        assert_eq!(restored.seed, 1234);
        let mut resumed = make(0);
        resumed.seek(restored).unwrap();
        assert_eq!(
            take(&mut resumed, 70 - stop),
            uninterrupted[stop..],
            "resumed after {stop} batches"
        );
    }
}

#[test]
fn seeking_back_replays_and_bad_positions_are_refused() {
    let windows = Windows::new(counting(0, 101), 4).unwrap();
    let mut batches = BatchIterator::new(windows, 2, Order::Shuffled, 5).unwrap();
    take(&mut batches, 30);
    let saved = batches.position();
    let next = take(&mut batches, 5);
    take(&mut batches, 40);
    batches.seek(saved).unwrap();
    assert_eq!(take(&mut batches, 5), next);

    let beyond = BatchPosition {
        epoch: 0,
        index: 26,
        seed: 5,
    };
    let error = batches.seek(beyond).unwrap_err();
    assert!(matches!(error, DataError::BadPosition(_)));
    assert_eq!(
        error.to_string(),
        "cannot resume at window 26 of an epoch of 25 windows"
    );
}

#[test]
fn the_split_holds_out_the_last_tokens_and_shares_none() {
    let all = Windows::new(counting(1000, 100), 4).unwrap();
    let split = all.split(0.2).unwrap();
    let validation = split.validation.unwrap();
    assert_eq!((split.train.tokens(), validation.tokens()), (80, 20));
    assert_eq!((split.train.count(), validation.count()), (19, 4));

    let (mut inputs, mut targets) = (vec![0; 4], vec![0; 4]);
    let mut train_tokens = BTreeSet::new();
    for i in 0..split.train.count() {
        split.train.read(i, &mut inputs, &mut targets).unwrap();
        train_tokens.extend(inputs.iter().chain(&targets).copied());
    }
    let mut validation_tokens = BTreeSet::new();
    for i in 0..validation.count() {
        validation.read(i, &mut inputs, &mut targets).unwrap();
        validation_tokens.extend(inputs.iter().chain(&targets).copied());
    }
    assert!(train_tokens.iter().all(|&t| t < 1080));
    assert_eq!(validation_tokens.first(), Some(&1080));
    assert!(validation_tokens.iter().all(|&t| (1080..1100).contains(&t)));
    assert!(train_tokens.is_disjoint(&validation_tokens));

    let again = all.split(0.2).unwrap();
    assert_eq!(
        (again.train.tokens(), again.validation.unwrap().tokens()),
        (80, 20),
        "deterministic"
    );
    assert!(all.split(0.0).unwrap().validation.is_none());
}

#[test]
fn split_and_setting_errors() {
    let all = Windows::new(counting(0, 100), 4).unwrap();
    for fraction in [1.0, -0.1, f64::NAN] {
        assert!(matches!(
            all.split(fraction),
            Err(DataError::InvalidSetting(_))
        ));
    }
    let error = all.split(0.03).unwrap_err();
    assert!(matches!(
        error,
        DataError::TooFewTokens {
            part: "validation split",
            tokens: 3,
            needed: 5
        }
    ));
    assert_eq!(
        error.to_string(),
        "the validation split has 3 tokens, fewer than the 5 of one window (seq_len + 1)"
    );
    assert!(matches!(
        Windows::new(counting(0, 4), 4),
        Err(DataError::TooFewTokens {
            part: "corpus",
            tokens: 4,
            needed: 5
        })
    ));
    assert!(matches!(
        Windows::new(counting(0, 100), 0),
        Err(DataError::InvalidSetting(_))
    ));
    assert!(matches!(
        BatchIterator::new(all.clone(), 0, Order::Shuffled, 0),
        Err(DataError::InvalidSetting(_))
    ));
    let error = BatchIterator::new(all, 25, Order::Shuffled, 0).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid data setting: 24 windows of 5 tokens cannot fill one batch of 25"
    );
}

#[test]
fn a_token_file_batches_like_the_same_tokens_in_memory() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("data_batches");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("corpus.tok");
    let tokens = random_tokens(8, 5000);
    write_token_file(&path, TokenDtype::U16, &tokens).unwrap();
    let file = Arc::new(TokenFile::open(&path).unwrap());

    let from_file = Windows::new(file, 32).unwrap().split(0.1).unwrap();
    let in_memory = Windows::new(tokens, 32).unwrap().split(0.1).unwrap();
    let mut a = BatchIterator::new(from_file.train, 8, Order::Shuffled, 77).unwrap();
    let mut b = BatchIterator::new(in_memory.train, 8, Order::Shuffled, 77).unwrap();
    assert_eq!(take(&mut a, 40), take(&mut b, 40));
    let mut a = BatchIterator::new(from_file.validation.unwrap(), 4, Order::Sequential, 0).unwrap();
    let mut b = BatchIterator::new(in_memory.validation.unwrap(), 4, Order::Sequential, 0).unwrap();
    assert_eq!(take(&mut a, 3), take(&mut b, 3));
}
