//! The .lmx language.
