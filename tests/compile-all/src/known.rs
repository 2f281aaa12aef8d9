//! The known-failures list (`known-failures.txt`): programs the checker accepts that do not
//! compile or run yet, each with the error it fails with. The build script skips the `rustc`
//! ones (so that the rest of the crate compiles); the tests check that every `codegen` and
//! `run` entry still fails as listed, and that no other program fails.
//!
//! Each entry is one line: `ID<TAB>STAGE<TAB>ERROR`, with STAGE one of `codegen` (the code
//! generator refuses it), `rustc` (the generated Rust does not compile) or `run` (initialising
//! it or its forward pass fails). `#` starts a comment line.

/// Where a known failure happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The code generator refuses the program.
    Codegen,
    /// The generated Rust does not compile.
    Rustc,
    /// Initialising the model or its forward pass fails.
    Run,
}

/// One listed program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// The program's model name (`Gpt2M007`, `AcceptFullSlice`).
    pub id: String,
    /// Where it fails.
    pub stage: Stage,
    /// The error, as it was observed.
    pub error: String,
}

/// The entries of `text`; on a malformed line, its number and what is wrong.
pub fn parse(text: &str) -> Result<Vec<Known>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.splitn(3, '\t');
        let (Some(id), Some(stage), Some(error)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!(
                "known-failures.txt:{}: expected `ID<TAB>STAGE<TAB>ERROR`",
                n + 1
            ));
        };
        let stage = match stage {
            "codegen" => Stage::Codegen,
            "rustc" => Stage::Rustc,
            "run" => Stage::Run,
            other => {
                return Err(format!(
                    "known-failures.txt:{}: stage `{other}` is not codegen, rustc or run",
                    n + 1
                ))
            }
        };
        out.push(Known {
            id: id.to_string(),
            stage,
            error: error.to_string(),
        });
    }
    Ok(out)
}
