//! Which BLAS MLX's CPU backend gets, decided from `LMX_BLAS` and what is at hand. Kept free of
//! I/O so that the order is unit-tested (`src/lib.rs` includes this file in its tests).

use std::path::PathBuf;

/// What `LMX_BLAS` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Unset or empty: a system OpenBLAS, else the OpenBLAS wheel, else the reference BLAS.
    Fastest,
    /// `reference`: MLX's bundled reference BLAS.
    Reference,
    /// `openblas`: the system's OpenBLAS, or an error.
    System,
    /// `wheel`: the OpenBLAS fetched with pip, or an error.
    Wheel,
    /// Any other value: the library at that path.
    File(PathBuf),
}

impl Request {
    /// `LMX_BLAS`'s value (`None` when unset).
    pub fn parse(value: Option<&str>) -> Request {
        match value {
            None | Some("") => Request::Fastest,
            Some("reference") => Request::Reference,
            Some("openblas") => Request::System,
            Some("wheel") => Request::Wheel,
            Some(path) => Request::File(PathBuf::from(path)),
        }
    }
}

/// The BLAS chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// MLX keeps its bundled reference BLAS; `warning` says why when it was not asked for.
    Reference { warning: Option<String> },
    /// This library is linked ahead of libmlx.
    Linked(PathBuf),
}

/// Decides for `request`, given the system's OpenBLAS (if one is installed) and a way to get the
/// wheel's (called only when needed; it returns the library to link or why it cannot).
pub fn decide(
    request: &Request,
    system: Option<PathBuf>,
    wheel: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<Choice, String> {
    match request {
        Request::Reference => Ok(Choice::Reference { warning: None }),
        Request::File(path) => Ok(Choice::Linked(path.clone())),
        Request::System => system
            .map(Choice::Linked)
            .ok_or_else(|| "LMX_BLAS=openblas, but no system libopenblas.so.0 was found".into()),
        Request::Wheel => wheel()
            .map(Choice::Linked)
            .map_err(|why| format!("LMX_BLAS=wheel, but {why}")),
        Request::Fastest => Ok(match system {
            Some(path) => Choice::Linked(path),
            None => match wheel() {
                Ok(path) => Choice::Linked(path),
                Err(why) => Choice::Reference {
                    warning: Some(format!(
                        "MLX's CPU backend keeps its reference BLAS (several times slower): no \
                         system OpenBLAS, and {why}. Install OpenBLAS, or set LMX_BLAS=reference \
                         to silence this"
                    )),
                },
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system() -> Option<PathBuf> {
        Some(PathBuf::from("/usr/lib/libopenblas.so.0"))
    }

    fn wheel_ok() -> Result<PathBuf, String> {
        Ok(PathBuf::from("/cache/liblmx_blas.so"))
    }

    fn wheel_fails() -> Result<PathBuf, String> {
        Err("pip could not fetch scipy-openblas32".into())
    }

    fn no_wheel() -> Result<PathBuf, String> {
        panic!("the wheel must not be fetched here")
    }

    #[test]
    fn lmx_blas_values_parse_to_requests() {
        assert_eq!(Request::parse(None), Request::Fastest);
        assert_eq!(Request::parse(Some("")), Request::Fastest);
        assert_eq!(Request::parse(Some("reference")), Request::Reference);
        assert_eq!(Request::parse(Some("openblas")), Request::System);
        assert_eq!(Request::parse(Some("wheel")), Request::Wheel);
        assert_eq!(
            Request::parse(Some("/opt/libopenblas.so.0")),
            Request::File(PathBuf::from("/opt/libopenblas.so.0"))
        );
    }

    #[test]
    fn by_default_the_system_openblas_wins_and_the_wheel_is_not_fetched() {
        let choice = decide(&Request::Fastest, system(), no_wheel).unwrap();
        assert_eq!(choice, Choice::Linked(system().unwrap()));
    }

    #[test]
    fn by_default_without_a_system_openblas_the_wheel_is_linked() {
        let choice = decide(&Request::Fastest, None, wheel_ok).unwrap();
        assert_eq!(choice, Choice::Linked(wheel_ok().unwrap()));
    }

    #[test]
    fn by_default_a_wheel_that_cannot_be_had_leaves_the_reference_blas_with_a_warning() {
        let choice = decide(&Request::Fastest, None, wheel_fails).unwrap();
        let Choice::Reference {
            warning: Some(warning),
        } = choice
        else {
            panic!("expected the reference BLAS with a warning, got {choice:?}");
        };
        assert!(
            warning.contains("pip could not fetch scipy-openblas32"),
            "{warning}"
        );
        assert!(warning.contains("LMX_BLAS=reference"), "{warning}");
    }

    #[test]
    fn reference_is_kept_when_asked_for_even_beside_a_system_openblas() {
        let choice = decide(&Request::Reference, system(), no_wheel).unwrap();
        assert_eq!(choice, Choice::Reference { warning: None });
    }

    #[test]
    fn an_explicit_request_that_cannot_be_met_is_an_error() {
        let err = decide(&Request::System, None, no_wheel).unwrap_err();
        assert_eq!(
            err,
            "LMX_BLAS=openblas, but no system libopenblas.so.0 was found"
        );
        let err = decide(&Request::Wheel, system(), wheel_fails).unwrap_err();
        assert_eq!(
            err,
            "LMX_BLAS=wheel, but pip could not fetch scipy-openblas32"
        );
    }

    #[test]
    fn wheel_is_linked_when_asked_for_even_beside_a_system_openblas() {
        let choice = decide(&Request::Wheel, system(), wheel_ok).unwrap();
        assert_eq!(choice, Choice::Linked(wheel_ok().unwrap()));
    }
}
