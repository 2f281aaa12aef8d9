//! Symbolic tensor dimensions such as `B`, `d_model`, `3 * d_model`, `T - 1` or `n_heads * head_dim`.
//!
//! A dimension keeps the text a reader wrote (for messages) and a normal form (for comparison):
//! a sum of terms, each a rational coefficient times a product of base symbols with integer
//! exponents. Derived config values are expanded into their base symbols, so `n_heads * head_dim`
//! equals `d_model` when `head_dim = d_model / n_heads`, and sums are ordered and collected, so
//! `T - 0` equals `T` and `1 + d` equals `d + 1`. Only a division by a sum of several terms has
//! no normal form; such a dimension compares by its text.

use std::collections::BTreeMap;
use std::fmt;

/// A symbolic dimension.
#[derive(Debug, Clone)]
pub struct Dim {
    text: String,
    norm: Norm,
}

/// A product of base symbols, each with its (non-zero) exponent.
type Factors = BTreeMap<String, i32>;

/// A normal form's terms: each product of symbols with its coefficient.
type Terms = BTreeMap<Factors, Ratio>;

/// The normal form of a dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Norm {
    /// The sum of `coefficient * product(factors)` over its terms, none with a zero coefficient
    /// (so zero is the empty sum).
    Sum(Terms),
    /// An expression without a normal form, compared by its text.
    Opaque(String),
}

/// A reduced fraction with a positive denominator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ratio {
    num: i64,
    den: i64,
}

/// A sum grown past this many terms is kept as text: products of sums multiply their terms.
const MAX_TERMS: usize = 64;

impl Ratio {
    fn new(num: i64, den: i64) -> Option<Ratio> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den);
        let sign = if den < 0 { -1 } else { 1 };
        Some(Ratio {
            num: num.checked_div(g)?.checked_mul(sign)?,
            den: den.checked_div(g)?.checked_mul(sign)?,
        })
    }

    fn add(self, other: Ratio) -> Option<Ratio> {
        let num = self
            .num
            .checked_mul(other.den)?
            .checked_add(other.num.checked_mul(self.den)?)?;
        Ratio::new(num, self.den.checked_mul(other.den)?)
    }

    fn mul(self, other: Ratio) -> Option<Ratio> {
        Ratio::new(
            self.num.checked_mul(other.num)?,
            self.den.checked_mul(other.den)?,
        )
    }

    fn inverse(self) -> Option<Ratio> {
        Ratio::new(self.den, self.num)
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(1).max(1)
}

/// `terms` with `coefficient * factors` added in, or `None` on overflow.
fn add_term(terms: &mut Terms, factors: Factors, coefficient: Ratio) -> Option<()> {
    let sum = match terms.get(&factors) {
        Some(existing) => existing.add(coefficient)?,
        None => coefficient,
    };
    if sum.num == 0 {
        terms.remove(&factors);
    } else {
        terms.insert(factors, sum);
    }
    Some(())
}

/// The product of two terms' factors, exponents added and zeros dropped.
fn times(a: &Factors, b: &Factors, sign: i32) -> Option<Factors> {
    let mut out = a.clone();
    for (symbol, exponent) in b {
        let e = out.entry(symbol.clone()).or_insert(0);
        *e = e.checked_add(exponent.checked_mul(sign)?)?;
        if *e == 0 {
            out.remove(symbol);
        }
    }
    Some(out)
}

fn sum(terms: Terms) -> Option<Norm> {
    (terms.len() <= MAX_TERMS).then_some(Norm::Sum(terms))
}

impl PartialEq for Dim {
    fn eq(&self, other: &Self) -> bool {
        self.norm == other.norm
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Dim {
    /// A constant dimension.
    pub fn constant(n: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if n != 0 {
            terms.insert(Factors::new(), Ratio { num: n, den: 1 });
        }
        Dim {
            text: n.to_string(),
            norm: Norm::Sum(terms),
        }
    }

    /// A base symbol: a config setting or a size introduced by a shape (`B`, `T`).
    pub fn symbol(name: &str) -> Dim {
        Dim {
            text: name.to_string(),
            norm: Norm::Sum(BTreeMap::from([(
                Factors::from([(name.to_string(), 1)]),
                Ratio { num: 1, den: 1 },
            )])),
        }
    }

    /// A base symbol with a private key, shown as `text` (a block argument).
    pub fn symbol_as(key: &str, text: &str) -> Dim {
        Dim::symbol(key).named(text)
    }

    /// The same dimension shown under another name (a derived config value).
    pub fn named(&self, name: &str) -> Dim {
        Dim {
            text: name.to_string(),
            norm: self.norm.clone(),
        }
    }

    /// Whether the dimension is opaque: equal only to one written the same way.
    pub fn is_opaque(&self) -> bool {
        matches!(self.norm, Norm::Opaque(_))
    }

    /// An opaque dimension compared by its text.
    pub fn opaque(text: &str) -> Dim {
        Dim {
            text: text.to_string(),
            norm: Norm::Opaque(text.to_string()),
        }
    }

    /// The constant value, if the dimension is one.
    pub fn as_constant(&self) -> Option<i64> {
        let Norm::Sum(terms) = &self.norm else {
            return None;
        };
        match terms.iter().next() {
            None => Some(0),
            Some((factors, Ratio { num, den: 1 })) if terms.len() == 1 && factors.is_empty() => {
                Some(*num)
            }
            _ => None,
        }
    }

    fn wrap(&self) -> String {
        if self.text.contains([' ']) {
            format!("({})", self.text)
        } else {
            self.text.clone()
        }
    }

    fn combine(&self, other: &Dim, op: &str, norm: Option<Norm>) -> Dim {
        let text = format!("{} {op} {}", self.wrap(), other.wrap());
        match norm {
            Some(norm) => Dim { text, norm },
            None => Dim::opaque(&text),
        }
    }

    /// Both normal forms, when both dimensions have one.
    fn sums<'a>(&'a self, other: &'a Dim) -> Option<(&'a Terms, &'a Terms)> {
        match (&self.norm, &other.norm) {
            (Norm::Sum(a), Norm::Sum(b)) => Some((a, b)),
            _ => None,
        }
    }

    /// `self * other`.
    pub fn mul(&self, other: &Dim) -> Dim {
        let norm = self.sums(other).and_then(|(a, b)| {
            let mut terms = BTreeMap::new();
            for (fa, ca) in a {
                for (fb, cb) in b {
                    add_term(&mut terms, times(fa, fb, 1)?, ca.mul(*cb)?)?;
                }
            }
            sum(terms)
        });
        self.combine(other, "*", norm)
    }

    /// `self / other`: exact when `other` is a single term, or equal to `self`.
    pub fn div(&self, other: &Dim) -> Dim {
        let norm = self.sums(other).and_then(|(a, b)| {
            if a == b && !a.is_empty() {
                return Dim::constant(1).norm.into();
            }
            let [(fb, cb)] = b.iter().collect::<Vec<_>>()[..] else {
                return None;
            };
            let inverse = cb.inverse()?;
            let mut terms = BTreeMap::new();
            for (fa, ca) in a {
                add_term(&mut terms, times(fa, fb, -1)?, ca.mul(inverse)?)?;
            }
            sum(terms)
        });
        self.combine(other, "/", norm)
    }

    /// `self + other` (`sign = 1`) or `self - other` (`sign = -1`).
    pub fn add(&self, other: &Dim, sign: i64) -> Dim {
        let norm = self.sums(other).and_then(|(a, b)| {
            let mut terms = a.clone();
            let sign = Ratio::new(sign, 1)?;
            for (factors, coefficient) in b {
                add_term(&mut terms, factors.clone(), coefficient.mul(sign)?)?;
            }
            sum(terms)
        });
        self.combine(other, if sign > 0 { "+" } else { "-" }, norm)
    }

    /// The value of the dimension, given the values of its base symbols;
    /// `None` if a symbol is unbound, the value is not a whole number, or it overflows.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        let Norm::Sum(terms) = &self.norm else {
            return None;
        };
        // The sum as one fraction, exactly.
        let (mut total_num, mut total_den) = (0i128, 1i128);
        for (factors, coefficient) in terms {
            let (mut n, mut d) = (i128::from(coefficient.num), i128::from(coefficient.den));
            for (symbol, exponent) in factors {
                let value = i128::from(lookup(symbol)?);
                for _ in 0..exponent.unsigned_abs() {
                    if *exponent > 0 {
                        n = n.checked_mul(value)?;
                    } else {
                        d = d.checked_mul(value)?;
                    }
                }
            }
            if d == 0 {
                return None;
            }
            total_num = total_num
                .checked_mul(d)?
                .checked_add(n.checked_mul(total_den)?)?;
            total_den = total_den.checked_mul(d)?;
        }
        if total_num % total_den != 0 {
            return None;
        }
        i64::try_from(total_num / total_den).ok()
    }

    /// Replaces base symbols by dimensions (binding a callee's `B`, `T` to the caller's).
    pub fn subst(&self, map: &std::collections::HashMap<String, Dim>) -> Dim {
        let Norm::Sum(terms) = &self.norm else {
            return self.clone();
        };
        if !terms.keys().flatten().any(|(k, _)| map.contains_key(k)) {
            return self.clone();
        }
        let mut out: Option<Dim> = None;
        for (factors, coefficient) in terms {
            let (num, den) = (coefficient.num.abs(), coefficient.den);
            let mut term = match (num, den) {
                (1, 1) => None,
                (num, 1) => Some(Dim::constant(num)),
                (num, den) => Some(Dim::constant(num).div(&Dim::constant(den))),
            };
            for (k, e) in factors {
                let base = map.get(k).cloned().unwrap_or_else(|| Dim::symbol(k));
                for _ in 0..e.unsigned_abs() {
                    term = Some(match (term, *e > 0) {
                        (None, true) => base.clone(),
                        (None, false) => Dim::constant(1).div(&base),
                        (Some(t), true) => t.mul(&base),
                        (Some(t), false) => t.div(&base),
                    });
                }
            }
            let term = term.unwrap_or_else(|| Dim::constant(1));
            let sign = coefficient.num.signum();
            out = Some(match out {
                Some(so_far) => so_far.add(&term, sign),
                None if sign < 0 => Dim::constant(-1).mul(&term),
                None => term,
            });
        }
        out.unwrap_or_else(|| Dim::constant(0))
    }

    /// The base symbols the dimension depends on.
    pub fn symbols(&self) -> Vec<String> {
        match &self.norm {
            Norm::Sum(terms) => {
                let mut symbols: Vec<String> =
                    terms.keys().flatten().map(|(k, _)| k.clone()).collect();
                symbols.sort();
                symbols.dedup();
                symbols
            }
            Norm::Opaque(_) => Vec::new(),
        }
    }
}

/// Formats a shape as `[B, T, d_model]`.
pub fn shape_text(shape: &[Dim]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_dims_cancel() {
        let d = Dim::symbol("d_model");
        let h = Dim::symbol("n_heads");
        let head_dim = d.div(&h).named("head_dim");
        assert_eq!(h.mul(&head_dim), d);
        assert_eq!(head_dim.to_string(), "head_dim");
        assert_eq!(h.mul(&head_dim).to_string(), "n_heads * head_dim");
    }

    #[test]
    fn constants_fold() {
        let d = Dim::symbol("d");
        assert_eq!(
            Dim::constant(3).mul(&d).add(&d, 1),
            Dim::constant(4).mul(&d)
        );
        assert_ne!(d.add(&Dim::constant(1), 1), d);
        assert_eq!(
            d.add(&Dim::constant(1), 1),
            Dim::constant(1).add(&d, 1),
            "1 + d == d + 1"
        );
        let t = Dim::symbol("T");
        assert_eq!(t.add(&Dim::constant(0), -1), t, "T - 0 == T");
        assert_eq!(
            t.add(&Dim::constant(1), -1).add(&Dim::constant(1), 1),
            t,
            "T - 1 + 1 == T"
        );
        assert_eq!(d.add(&d, -1).as_constant(), Some(0));
        assert_eq!(
            Dim::constant(6).div(&Dim::constant(3)).as_constant(),
            Some(2)
        );
    }

    #[test]
    fn evaluates_exactly() {
        let d = Dim::symbol("d").div(&Dim::symbol("h"));
        let vals = |k: &str| match k {
            "d" => Some(768),
            "h" => Some(12),
            _ => None,
        };
        assert_eq!(d.eval(&vals), Some(64));
        let bad = |k: &str| if k == "d" { Some(10) } else { Some(3) };
        assert_eq!(d.eval(&bad), None);
    }

    #[test]
    fn sums_distribute_and_divide_by_single_terms() {
        let (d, h) = (Dim::symbol("d"), Dim::symbol("h"));
        let one = Dim::constant(1);
        // (d + 1) * h == d * h + h, and (d * h + h) / h == d + 1.
        let product = d.add(&one, 1).mul(&h);
        assert_eq!(product, d.mul(&h).add(&h, 1));
        assert_eq!(product.div(&h), d.add(&one, 1));
        // A sum divided by itself is 1; by another sum it has no normal form.
        assert_eq!(product.div(&product).as_constant(), Some(1));
        assert_ne!(
            d.div(&d.add(&one, 1)),
            d.div(&d.add(&one, 1).named("d1")).mul(&one)
        );
        let vals = |k: &str| match k {
            "d" => Some(6),
            "h" => Some(4),
            _ => None,
        };
        assert_eq!(product.eval(&vals), Some(28));
        assert_eq!(
            d.div(&h).add(&one, 1).eval(&vals),
            None,
            "6/4 + 1 is not whole"
        );
        assert_eq!(
            d.div(&h).mul(&Dim::constant(2)).add(&one, 1).eval(&vals),
            Some(4)
        );
    }

    #[test]
    fn substitution_maps_each_term() {
        let t = Dim::symbol("T");
        let map = std::collections::HashMap::from([(
            "T".to_string(),
            Dim::symbol("S").add(&Dim::constant(2), 1),
        )]);
        let shifted = t.add(&Dim::constant(1), -1).subst(&map);
        assert_eq!(shifted, Dim::symbol("S").add(&Dim::constant(1), 1));
    }
}
