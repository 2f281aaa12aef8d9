//! Rust names for `.lmx` names: snake case for modules, fields and locals, camel case for types,
//! keywords escaped.

use proc_macro2::{Ident, Span};

/// Rust's strict and reserved keywords, which need `r#` (or a suffix where `r#` is not allowed).
const KEYWORDS: [&str; 51] = [
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut",
    "pub", "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield",
];

/// `DecoderLayer` -> `decoder_layer`, `Wqkv` -> `wqkv`, `h` -> `h`.
pub fn snake(name: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = name.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let after_lower =
                i > 0 && (chars[i - 1].is_lowercase() || chars[i - 1].is_ascii_digit());
            let before_lower = i > 0
                && chars[i - 1].is_uppercase()
                && chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if after_lower || before_lower {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}

/// `train` -> `Train`, `decoder_layer` -> `DecoderLayer`, `tiny-mqa` -> `TinyMqa`.
pub fn camel(name: &str) -> String {
    name.split(['_', '-'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// An identifier for `name`: raw for keywords, suffixed with `_` where raw is not allowed.
pub fn ident(name: &str) -> Ident {
    match name {
        "self" | "Self" | "super" | "crate" | "_" => {
            Ident::new(&format!("{name}_"), Span::call_site())
        }
        _ if KEYWORDS.contains(&name) => Ident::new_raw(name, Span::call_site()),
        _ => Ident::new(name, Span::call_site()),
    }
}

/// A name not in `taken`: `base`, else `base` followed by `suffix`, then numbered.
pub fn fresh(base: &str, suffix: &str, taken: &[String]) -> String {
    if !taken.iter().any(|t| t == base) {
        return base.to_string();
    }
    let with_suffix = format!("{base}{suffix}");
    if !taken.contains(&with_suffix) {
        return with_suffix;
    }
    (2..)
        .map(|n| format!("{with_suffix}{n}"))
        .find(|candidate| !taken.contains(candidate))
        .unwrap_or(with_suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        assert_eq!(snake("DecoderLayer"), "decoder_layer");
        assert_eq!(snake("Wqkv"), "wqkv");
        assert_eq!(snake("Gpt2"), "gpt2");
        assert_eq!(snake("MLPBlock"), "mlp_block");
        assert_eq!(camel("tiny-mqa"), "TinyMqa");
        assert_eq!(camel("train"), "Train");
        assert_eq!(ident("type").to_string(), "r#type");
        assert_eq!(ident("self").to_string(), "self_");
    }
}
