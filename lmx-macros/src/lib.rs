//! lmx proc macros.
