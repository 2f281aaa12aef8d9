//! SplitMix64, the seeded generator behind window shuffling: the same numbers on every platform.

/// Steele, Lea and Flood's SplitMix64 (as in Vigna's reference `splitmix64.c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first output is that of `splitmix64.c` seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `0..bound` (Lemire's multiply-and-reject, unbiased).
    ///
    /// # Panics
    /// If `bound` is 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range has no number in it");
        let mut product = u128::from(self.next_u64()) * u128::from(bound);
        if (product as u64) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (product as u64) < threshold {
                product = u128::from(self.next_u64()) * u128::from(bound);
            }
        }
        (product >> 64) as u64
    }
}

/// The order of `count` windows in `epoch`: a Fisher–Yates shuffle driven by a SplitMix64 whose
/// state is `seed` mixed with the epoch, so that every epoch of every seed has its own order.
pub fn epoch_permutation(seed: u64, epoch: u64, count: u32) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed ^ SplitMix64::new(epoch).next_u64());
    let mut order: Vec<u32> = (0..count).collect();
    for last in (1..order.len()).rev() {
        let pick = rng.below(last as u64 + 1) as usize;
        order.swap(last, pick);
    }
    order
}
