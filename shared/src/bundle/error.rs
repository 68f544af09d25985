//! `BundleError`: every way a bundle can be wrong or unreadable.
//!
//! Invariant: the `Display` of every variant names the file (relative to the bundle root),
//! the field inside it when there is one, and what was expected, so a user can fix the bundle
//! from the message alone.

use std::path::PathBuf;

/// Result of bundle operations.
pub type Result<T, E = BundleError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The bundle folder itself is missing or not a folder.
    #[error("{}: not a bundle folder: {reason}", dir.display())]
    NotABundle { dir: PathBuf, reason: String },

    /// A file could not be read or written.
    #[error("{file}: {action}: {source}")]
    Io {
        file: String,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A required file is absent.
    #[error("{file}: missing; {hint}")]
    Missing { file: String, hint: String },

    /// A JSON file does not parse (the message carries line and column).
    #[error("{file}: invalid JSON at line {line} column {column}: {message}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },

    /// Front matter is absent, unterminated or not YAML.
    #[error("{file}: front matter: {message}")]
    FrontMatter { file: String, message: String },

    /// A field has the wrong shape or value. `field` is a dotted path inside the file.
    #[error("{file}: {field}: {message}")]
    Invalid {
        file: String,
        field: String,
        message: String,
    },

    /// A `${NAME}` is used but `NAME` is not declared in `x-agen/secrets.json`.
    #[error(
        "x-agen/secrets.json: secret {name} used in {used_in} is not declared; \
         add \"{name}\": {{\"source\": \"platform\"}} (or {{\"source\": \"env\", \"var\": \"{name}\"}}) to x-agen/secrets.json"
    )]
    UndeclaredSecret { name: String, used_in: String },

    /// A `${NAME}` could not be resolved at start time.
    #[error("secret {name} used in {used_in} has no value: {reason}")]
    MissingSecret {
        name: String,
        used_in: String,
        reason: String,
    },

    /// A file is unsafe or too large to read (a device, a link leading outside, over the cap).
    #[error("{file}: {message}")]
    File { file: String, message: String },

    /// The archive form of a bundle is corrupt, unsafe or too large.
    #[error("bundle archive: {0}")]
    Archive(String),
}

impl BundleError {
    pub(crate) fn invalid(file: &str, field: &str, message: impl Into<String>) -> Self {
        BundleError::Invalid {
            file: file.to_string(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn file(file: &str, message: impl Into<String>) -> Self {
        BundleError::File {
            file: file.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn io(
        file: impl Into<String>,
        action: &'static str,
        source: std::io::Error,
    ) -> Self {
        BundleError::Io {
            file: file.into(),
            action,
            source,
        }
    }
}
