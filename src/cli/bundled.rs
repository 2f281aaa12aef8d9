//! The `.lmx` sources of the bundled models, for `lmx info`, `lmx count` and `lmx models`.

/// `(name, file name, source)` of every model in `models/`, as build.rs compiled them.
pub const MODELS: &[(&str, &str, &str)] = lmx::models::SOURCES;

/// The file name and source of `model`: a bundled model's name, or a path to a `.lmx` file.
pub fn source(model: &str) -> anyhow::Result<(String, String)> {
    if let Some((_, file, source)) = MODELS.iter().find(|(name, _, _)| *name == model) {
        return Ok((file.to_string(), source.to_string()));
    }
    if model.ends_with(".lmx") {
        let source = std::fs::read_to_string(model)
            .map_err(|err| anyhow::anyhow!("cannot read {model}: {err}"))?;
        return Ok((model.to_owned(), source));
    }
    let names: Vec<&str> = MODELS.iter().map(|(name, _, _)| *name).collect();
    anyhow::bail!(
        "no model `{model}`: the bundled models are {}, or give a path to a .lmx file",
        names.join(", ")
    )
}
