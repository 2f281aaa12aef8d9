//! lmx runtime
