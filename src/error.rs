//! Errors for bad user input. Every message names the file, the field and the reason, so a
//! user can fix the input without reading code.

use std::path::{Path, PathBuf};

/// A problem with an input file (workload, architecture, search space, layer costs, CSV).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read at all.
    #[error("{file}: cannot read: {source}", file = .file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML / JSON / CSV, or a field has the wrong type.
    #[error("{file}: malformed {format}: {message}", file = .file.display())]
    Malformed {
        file: PathBuf,
        format: &'static str,
        message: String,
    },
    /// A field is well-formed but its value is not acceptable.
    #[error("{file}: field `{field}`: {reason}", file = .file.display())]
    Invalid {
        file: PathBuf,
        field: String,
        reason: String,
    },
}

impl InputError {
    pub fn invalid(file: &Path, field: impl Into<String>, reason: impl Into<String>) -> Self {
        InputError::Invalid {
            file: file.to_path_buf(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn malformed(file: &Path, format: &'static str, message: impl Into<String>) -> Self {
        InputError::Malformed {
            file: file.to_path_buf(),
            format,
            message: message.into(),
        }
    }
}

/// Reads a whole file, mapping I/O failures to [`InputError::Io`].
pub fn read_input(file: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(file).map_err(|source| InputError::Io {
        file: file.to_path_buf(),
        source,
    })
}

/// Parses TOML into `T`, reporting the offending key and line on failure.
pub fn parse_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, InputError> {
    toml::from_str(text).map_err(|e| InputError::malformed(file, "TOML", e.to_string().trim_end()))
}

/// Parses JSON into `T`, reporting line and column on failure.
pub fn parse_json<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, InputError> {
    serde_json::from_str(text).map_err(|e| InputError::malformed(file, "JSON", e.to_string()))
}
