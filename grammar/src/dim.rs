//! Symbolic tensor dimensions such as `B`, `d_model`, `3 * d_model` or `n_heads * head_dim`.
//!
//! A dimension keeps the text a reader wrote (for messages) and a normal form
//! (for comparison): a rational coefficient times a product of base symbols
//! with integer exponents. Derived config values are expanded into their base
//! symbols, so `n_heads * head_dim` equals `d_model` when `head_dim = d_model / n_heads`.
//! Sums of unlike terms cannot be normalised; they compare by their text.

use std::collections::BTreeMap;
use std::fmt;

/// A symbolic dimension.
#[derive(Debug, Clone)]
pub struct Dim {
    text: String,
    norm: Norm,
}

/// The normal form of a dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Norm {
    /// `num / den * prod(symbol ^ exponent)`, with `den > 0` and the fraction reduced.
    Monomial {
        num: i64,
        den: i64,
        factors: BTreeMap<String, i32>,
    },
    /// An expression that is not a monomial, compared by its text.
    Opaque(String),
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

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(1).max(1)
}

fn monomial(num: i64, den: i64, factors: BTreeMap<String, i32>) -> Option<Norm> {
    if den == 0 {
        return None;
    }
    let g = gcd(num, den);
    let sign = if den < 0 { -1 } else { 1 };
    let factors = factors.into_iter().filter(|(_, e)| *e != 0).collect();
    Some(Norm::Monomial {
        num: num.checked_div(g)?.checked_mul(sign)?,
        den: den.checked_div(g)?.checked_mul(sign)?,
        factors,
    })
}

impl Dim {
    /// A constant dimension.
    pub fn constant(n: i64) -> Dim {
        Dim {
            text: n.to_string(),
            norm: Norm::Monomial {
                num: n,
                den: 1,
                factors: BTreeMap::new(),
            },
        }
    }

    /// A base symbol: a config setting or a size introduced by a shape (`B`, `T`).
    pub fn symbol(name: &str) -> Dim {
        Dim {
            text: name.to_string(),
            norm: Norm::Monomial {
                num: 1,
                den: 1,
                factors: BTreeMap::from([(name.to_string(), 1)]),
            },
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

    /// An opaque dimension compared by its text.
    pub fn opaque(text: &str) -> Dim {
        Dim {
            text: text.to_string(),
            norm: Norm::Opaque(text.to_string()),
        }
    }

    /// The constant value, if the dimension is one.
    pub fn as_constant(&self) -> Option<i64> {
        match &self.norm {
            Norm::Monomial {
                num,
                den: 1,
                factors,
            } if factors.is_empty() => Some(*num),
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

    /// `self * other`.
    pub fn mul(&self, other: &Dim) -> Dim {
        let norm = match (&self.norm, &other.norm) {
            (
                Norm::Monomial { num, den, factors },
                Norm::Monomial {
                    num: n2,
                    den: d2,
                    factors: f2,
                },
            ) => {
                let mut f = factors.clone();
                for (k, e) in f2 {
                    *f.entry(k.clone()).or_insert(0) += e;
                }
                num.checked_mul(*n2)
                    .zip(den.checked_mul(*d2))
                    .and_then(|(n, d)| monomial(n, d, f))
            }
            _ => None,
        };
        self.combine(other, "*", norm)
    }

    /// `self / other`.
    pub fn div(&self, other: &Dim) -> Dim {
        let norm = match (&self.norm, &other.norm) {
            (
                Norm::Monomial { num, den, factors },
                Norm::Monomial {
                    num: n2,
                    den: d2,
                    factors: f2,
                },
            ) if *n2 != 0 => {
                let mut f = factors.clone();
                for (k, e) in f2 {
                    *f.entry(k.clone()).or_insert(0) -= e;
                }
                num.checked_mul(*d2)
                    .zip(den.checked_mul(*n2))
                    .and_then(|(n, d)| monomial(n, d, f))
            }
            _ => None,
        };
        self.combine(other, "/", norm)
    }

    /// `self + other` (`sign = 1`) or `self - other` (`sign = -1`).
    pub fn add(&self, other: &Dim, sign: i64) -> Dim {
        let norm = match (&self.norm, &other.norm) {
            (
                Norm::Monomial { num, den, factors },
                Norm::Monomial {
                    num: n2,
                    den: d2,
                    factors: f2,
                },
            ) if factors == f2 => {
                let lhs = num.checked_mul(*d2);
                let rhs = n2.checked_mul(*den).and_then(|r| r.checked_mul(sign));
                lhs.zip(rhs)
                    .and_then(|(l, r)| l.checked_add(r))
                    .zip(den.checked_mul(*d2))
                    .and_then(|(n, d)| monomial(n, d, factors.clone()))
            }
            _ => None,
        };
        self.combine(other, if sign > 0 { "+" } else { "-" }, norm)
    }

    /// The value of the dimension, given the values of its base symbols;
    /// `None` if a symbol is unbound, the division is inexact, or it overflows.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        let Norm::Monomial { num, den, factors } = &self.norm else {
            return None;
        };
        let (mut n, mut d) = (i128::from(*num), i128::from(*den));
        for (k, e) in factors {
            let v = i128::from(lookup(k)?);
            for _ in 0..e.unsigned_abs() {
                if *e > 0 {
                    n = n.checked_mul(v)?;
                } else {
                    d = d.checked_mul(v)?;
                }
            }
        }
        if d == 0 || n % d != 0 {
            return None;
        }
        i64::try_from(n / d).ok()
    }

    /// Replaces base symbols by dimensions (binding a callee's `B`, `T` to the caller's).
    pub fn subst(&self, map: &std::collections::HashMap<String, Dim>) -> Dim {
        let Norm::Monomial { num, den, factors } = &self.norm else {
            return self.clone();
        };
        if !factors.keys().any(|k| map.contains_key(k)) {
            return self.clone();
        }
        let mut out =
            (*num != 1 || *den != 1).then(|| Dim::constant(*num).div(&Dim::constant(*den)));
        for (k, e) in factors {
            let base = map.get(k).cloned().unwrap_or_else(|| Dim::symbol(k));
            for _ in 0..e.unsigned_abs() {
                out = Some(match (out, *e > 0) {
                    (None, true) => base.clone(),
                    (None, false) => Dim::constant(1).div(&base),
                    (Some(o), true) => o.mul(&base),
                    (Some(o), false) => o.div(&base),
                });
            }
        }
        out.unwrap_or_else(|| Dim::constant(1))
    }

    /// The base symbols the dimension depends on.
    pub fn symbols(&self) -> Vec<String> {
        match &self.norm {
            Norm::Monomial { factors, .. } => factors.keys().cloned().collect(),
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
}
