//! One entry of a bundle archive, the unit that `archive.rs` encodes and decodes and
//! `links.rs` resolves symlinks over (below both, so neither imports the other).

/// One entry of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveEntry {
    /// Relative, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
    /// File contents, or the symlink's target.
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Executable,
    Symlink,
}
