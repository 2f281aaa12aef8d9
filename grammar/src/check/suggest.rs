//! "Did you mean" suggestions for misspelt names.

/// The candidate closest to `name` by edit distance, if close enough to be a likely typo; of
/// candidates as close, one whose first letter has `name`'s case (a tensor `x` for `y`, not the
/// dimension `B`), then the first in the candidates' order (a scope's innermost names first:
/// the block's input `x` for `y`, not the configuration's `p`).
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != name)
        .enumerate()
        .map(|(order, c)| (distance(name, c), !same_case(name, c), order, c))
        .filter(|(d, ..)| *d <= limit)
        .min()
        .map(|(.., c)| c)
}

/// Whether the first letters of `a` and `b` are both upper case or both not.
fn same_case(a: &str, b: &str) -> bool {
    let upper = |s: &str| s.chars().next().is_some_and(char::is_uppercase);
    upper(a) == upper(b)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut row = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            let best = (prev[j] + cost).min(prev[j + 1] + 1).min(row[j] + 1);
            row.push(best);
        }
        prev = row;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_typos() {
        assert_eq!(closest("d_modle", ["d_model", "n_heads"]), Some("d_model"));
        assert_eq!(closest("xyz", ["d_model"]), None);
        assert_eq!(closest("y", ["B", "T", "x"]), Some("x"));
        assert_eq!(closest("C", ["B", "x"]), Some("B"));
        // As close and of one case: the first given.
        assert_eq!(closest("y", ["x", "p"]), Some("x"));
        assert_eq!(closest("y", ["p", "x"]), Some("p"));
    }
}
