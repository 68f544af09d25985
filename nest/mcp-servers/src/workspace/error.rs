//! The workspace server's errors. Every message is written for the model that made the call:
//! it names the path (relative to the root), says what went wrong and what to do instead.
//! These become tool results with `isError: true`, never protocol errors or crashes.

use std::io;

/// Why a workspace tool call failed; `Display` is the text the model sees.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "`{path}` is outside the workspace root `{root}`; use a path relative to the root (absolute paths are accepted only inside the root)"
    )]
    OutsideRoot { path: String, root: String },

    #[error(
        "`{path}` goes through the symbolic link `{link}`, which leads outside the workspace root (to `{target}`); links that leave the root are never followed and the link is left as it is"
    )]
    SymlinkEscape {
        path: String,
        link: String,
        target: String,
    },

    #[error("`{path}` resolves to a place outside the workspace root; refused")]
    Escape { path: String },

    #[error("`{path}` does not exist; `list` shows what does")]
    NotFound { path: String },

    #[error("`{path}` is a symbolic link loop (too many levels of links); it is not followed")]
    Loop { path: String },

    #[error("`{path}`: a part of this path is a file, not a folder; `list` shows what exists")]
    NotADirectory { path: String },

    #[error(
        "`{path}` is a folder; use `list` with a pattern such as `{path}/**` to see its files"
    )]
    IsAFolder { path: String },

    #[error("`{path}` is not a regular file (a device, socket or pipe); refused")]
    NotAFile { path: String },

    #[error("`{path}` looks like a binary file ({size} bytes); `read` shows text files only")]
    Binary { path: String, size: u64 },

    /// Bad arguments or a request that cannot be carried out as asked.
    #[error("{0}")]
    Invalid(String),

    #[error("{what} `{path}` failed: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: io::Error,
    },
}

/// The workspace module's result type.
pub type Result<T, E = WorkspaceError> = std::result::Result<T, E>;

impl WorkspaceError {
    /// The same error about the full path `path` the call named, when it was met on a parent.
    pub(crate) fn for_path(self, path: String) -> Self {
        match self {
            WorkspaceError::SymlinkEscape { link, target, .. } => {
                WorkspaceError::SymlinkEscape { path, link, target }
            }
            WorkspaceError::Escape { .. } => WorkspaceError::Escape { path },
            WorkspaceError::NotADirectory { .. } => WorkspaceError::NotADirectory { path },
            WorkspaceError::Loop { .. } => WorkspaceError::Loop { path },
            other => other,
        }
    }

    pub(crate) fn io(
        what: &'static str,
        path: impl Into<String>,
        source: impl Into<io::Error>,
    ) -> Self {
        WorkspaceError::Io {
            what,
            path: path.into(),
            source: source.into(),
        }
    }
}
