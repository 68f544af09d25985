//! The `list` and `grep` tools and the folder walk they share.
//!
//! Invariants:
//! - The walk holds a directory handle for every folder it is in and opens each child folder
//!   beneath it with `RESOLVE_NO_SYMLINKS`, so a folder swapped for a symlink mid-walk is
//!   skipped, never followed.
//! - Symlinks are never descended into. A symlink to a file inside the root is listed by `list`;
//!   grep searches it unless the walk meets the same file under its real path (so no line is
//!   reported twice); a symlink
//!   that leads outside, a broken one, a loop or one to a folder is skipped and named in the
//!   output's notes.
//! - Folders in [`SKIPPED_DIRS`] (version control, dependencies, build output, caches) are not
//!   walked into, except when the call names them explicitly (`list target/**`, `grep
//!   path=node_modules/x`).
//! - Output is sorted (list) or in walk order sorted by name (grep), and bounded.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};
use nix::fcntl::{OFlag, ResolveFlag};
use nix::sys::stat::Mode;
use regex::{Regex, RegexBuilder};
use schemars::JsonSchema;
use serde::Deserialize;

use super::confine::{openat2_retrying, RelPath, Root};
use super::error::{Result, WorkspaceError};
use super::files::{cut_line, read_line_capped, SNIFF_BYTES};
use super::grep_limits::{Stop, GREP_REGEX_SIZE_LIMIT};

/// Folders `list` and `grep` do not walk into (unless named as the starting point).
pub const SKIPPED_DIRS: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    ".jj",
    "node_modules",
    "target",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".gradle",
    ".next",
    ".nuxt",
    ".terraform",
    ".direnv",
    ".cache",
];
/// The most paths `list` returns.
pub const MAX_LIST_RESULTS: usize = 1000;
/// The most matching lines `grep` returns.
pub const MAX_GREP_MATCHES: usize = 300;
/// `grep` stops once its output reaches about this many characters.
pub const MAX_GREP_CHARS: usize = 30_000;
/// Matching lines are cut at this many characters in `grep` output.
pub const MAX_GREP_LINE_CHARS: usize = 500;
/// `grep` matches only the first this many bytes of a line.
pub const MAX_GREP_LINE_BYTES: usize = 32 * 1024;
/// `grep` skips files larger than this.
pub const MAX_GREP_FILE_BYTES: u64 = 20 * 1024 * 1024;
/// A walk stops after looking at this many entries.
pub const MAX_WALK_ENTRIES: usize = 200_000;
/// Notes (skipped links, …) shown at the end of an output.
const MAX_NOTES: usize = 20;
const MAX_DEPTH: usize = 128;

/// Arguments of `list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Glob relative to the workspace root, such as `src/**/*.go`, `*.md` or `docs/**`. `*` stays within one folder, `**` crosses folders.
    pub pattern: String,
}

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// Regular expression (Rust regex syntax) matched against each line.
    pub pattern: String,
    /// Folder or file to search, relative to the workspace root (default: the whole root).
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files matching this glob, such as `*.rs` (matched against the file name) or `src/**/*.rs` (matched against the path).
    #[serde(default)]
    pub glob: Option<String>,
}

/// A file the walk found: a plain entry of a folder it holds open, or a symlink inside the root.
enum Found<'a> {
    Entry {
        dir: BorrowedFd<'a>,
        name: &'a OsStr,
    },
    Link,
}

enum Flow {
    Continue,
    Stop,
}

/// The shared walk: holds the notes it will report and how much it has looked at.
struct Walker<'r> {
    root: &'r Root,
    notes: Vec<String>,
    entries: usize,
    stopped_early: bool,
}

impl<'r> Walker<'r> {
    fn new(root: &'r Root) -> Self {
        Walker {
            root,
            notes: Vec::new(),
            entries: 0,
            stopped_early: false,
        }
    }

    fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Walks the folder `dir` (at `rel`), calling `visit` for every file.
    fn walk(
        &mut self,
        dir: &OwnedFd,
        rel: &RelPath,
        depth: usize,
        visit: &mut dyn FnMut(&mut Walker<'r>, &RelPath, Found<'_>) -> Flow,
    ) -> Flow {
        if depth > MAX_DEPTH {
            self.note(format!(
                "skipped `{}`: folders nested deeper than {MAX_DEPTH} levels",
                rel.shown()
            ));
            return Flow::Continue;
        }
        // Listing through /proc/self/fd reads exactly the folder this handle holds.
        let listing = match fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
            Ok(listing) => listing,
            Err(e) => {
                self.note(format!("skipped `{}`: cannot list it ({e})", rel.shown()));
                return Flow::Continue;
            }
        };
        let mut entries: Vec<(std::ffi::OsString, Option<fs::FileType>)> = listing
            .filter_map(|e| e.ok())
            .map(|e| (e.file_name(), e.file_type().ok()))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, file_type) in entries {
            self.entries += 1;
            if self.entries > MAX_WALK_ENTRIES {
                self.stopped_early = true;
                return Flow::Stop;
            }
            let child = rel.join(&name);
            let Some(file_type) = file_type else { continue };
            let flow = if file_type.is_dir() {
                if SKIPPED_DIRS.iter().any(|s| OsStr::new(s) == name) {
                    continue;
                }
                let no_symlinks = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
                let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
                match openat2_retrying(
                    dir.as_fd(),
                    Path::new(&name),
                    flags,
                    Mode::empty(),
                    no_symlinks,
                ) {
                    Ok(sub) => self.walk(&sub, &child, depth + 1, visit),
                    Err(errno) => {
                        self.note(format!(
                            "skipped `{}`: {}",
                            child.shown(),
                            errno.desc().to_lowercase()
                        ));
                        Flow::Continue
                    }
                }
            } else if file_type.is_file() {
                visit(
                    self,
                    &child,
                    Found::Entry {
                        dir: dir.as_fd(),
                        name: &name,
                    },
                )
            } else if file_type.is_symlink() {
                self.symlink(&child, visit)
            } else {
                Flow::Continue
            };
            if let Flow::Stop = flow {
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// A symlink met during the walk: a file inside the root is visited, anything else noted.
    fn symlink(
        &mut self,
        child: &RelPath,
        visit: &mut dyn FnMut(&mut Walker<'r>, &RelPath, Found<'_>) -> Flow,
    ) -> Flow {
        let shown = child.shown();
        match self.root.open_beneath(child, OFlag::O_PATH, Mode::empty()) {
            Ok(fd) => match File::from(fd).metadata() {
                Ok(meta) if meta.is_file() => visit(self, child, Found::Link),
                Ok(meta) if meta.is_dir() => {
                    let real = self
                        .root
                        .canonical_inside(child)
                        .map(|r| r.shown())
                        .unwrap_or_default();
                    self.note(format!(
                        "not followed: `{shown}` is a symbolic link to the folder `{real}` inside the root; its files are found under `{real}`"
                    ));
                    Flow::Continue
                }
                _ => Flow::Continue,
            },
            Err(WorkspaceError::SymlinkEscape { .. } | WorkspaceError::Escape { .. }) => {
                self.note(format!("skipped `{shown}`: symbolic link leading outside the workspace root (not followed)"));
                Flow::Continue
            }
            Err(WorkspaceError::Loop { .. }) => {
                self.note(format!("skipped `{shown}`: symbolic link loop"));
                Flow::Continue
            }
            Err(WorkspaceError::NotFound { .. } | WorkspaceError::NotADirectory { .. }) => {
                self.note(format!("skipped `{shown}`: broken symbolic link"));
                Flow::Continue
            }
            Err(e) => {
                self.note(format!("skipped `{shown}`: {e}"));
                Flow::Continue
            }
        }
    }

    /// The notes section appended to an output (empty when there is nothing to say).
    fn notes_text(&self) -> String {
        let mut text = String::new();
        if self.stopped_early {
            text.push_str(&format!(
                "\n(stopped after looking at {MAX_WALK_ENTRIES} entries; narrow the search with a more specific pattern or path)"
            ));
        }
        for note in self.notes.iter().take(MAX_NOTES) {
            text.push('\n');
            text.push_str(note);
        }
        if self.notes.len() > MAX_NOTES {
            text.push_str(&format!(
                "\n… and {} more skipped entries",
                self.notes.len() - MAX_NOTES
            ));
        }
        text
    }
}

/// Builds a glob where `*` stays within one folder and `**` crosses folders.
fn glob_matcher(pattern: &str, what: &str) -> Result<GlobMatcher> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| {
            WorkspaceError::Invalid(format!("{what} `{pattern}` is not a valid glob: {e}"))
        })
}

/// Makes a pattern relative to the root: strips `./` and an absolute root prefix, refuses `..`.
fn relative_pattern(root: &Root, pattern: &str) -> Result<String> {
    let trimmed = pattern.trim();
    if trimmed.is_empty() {
        return Err(WorkspaceError::Invalid(
            "the pattern is empty; use a glob such as `src/**/*.rs` or `**/*.md`".into(),
        ));
    }
    let mut pattern = trimmed.to_string();
    if Path::new(&pattern).is_absolute() {
        let root_text = format!("{}/", root.path().display());
        match pattern.strip_prefix(&root_text) {
            Some(rest) => pattern = rest.to_string(),
            None if pattern == root.path().display().to_string() => pattern = "*".into(),
            None => {
                return Err(WorkspaceError::OutsideRoot {
                    path: trimmed.to_string(),
                    root: root.path().display().to_string(),
                })
            }
        }
    }
    while let Some(rest) = pattern.strip_prefix("./") {
        pattern = rest.to_string();
    }
    if pattern.split('/').any(|part| part == "..") {
        return Err(WorkspaceError::OutsideRoot {
            path: trimmed.to_string(),
            root: root.path().display().to_string(),
        });
    }
    Ok(pattern)
}

/// The folder a pattern's walk starts from: its literal leading folders (`src/**/*.go` → `src`).
fn literal_base(pattern: &str) -> String {
    let parts: Vec<&str> = pattern.split('/').collect();
    let mut base = Vec::new();
    for part in &parts[..parts.len().saturating_sub(1)] {
        if part.is_empty() || part.contains(['*', '?', '[', ']', '{', '}', '\\']) {
            break;
        }
        base.push(*part);
    }
    base.join("/")
}

/// `list`: files matching a glob, sorted, relative to the root.
pub fn list(root: &Root, args: &ListArgs) -> Result<String> {
    let pattern = relative_pattern(root, &args.pattern)?;
    let matcher = glob_matcher(&pattern, "pattern")?;
    let base = root.resolve(&literal_base(&pattern)).unwrap_or_default();
    let start = match root.open_beneath(&base, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
    {
        Ok(fd) => fd,
        Err(WorkspaceError::NotFound { .. } | WorkspaceError::NotADirectory { .. }) => {
            return Ok(format!(
                "no files match `{pattern}` (`{}` does not exist)",
                base.shown()
            ));
        }
        Err(e) => return Err(e),
    };
    let mut found: Vec<String> = Vec::new();
    let mut walker = Walker::new(root);
    walker.walk(&start, &base, 0, &mut |_, rel, _| {
        let shown = rel.shown();
        if matcher.is_match(&shown) {
            found.push(shown);
        }
        Flow::Continue
    });
    found.sort();
    let total = found.len();
    let mut out = if total == 0 {
        let mut text = format!("no files match `{pattern}`");
        let literal = root.resolve(&pattern).ok();
        let is_folder = literal
            .and_then(|rel| {
                root.open_beneath(&rel, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
                    .ok()
            })
            .is_some();
        if is_folder {
            text.push_str(&format!(
                " (`{pattern}` is a folder: list `{pattern}/*` or `{pattern}/**`)"
            ));
        }
        text
    } else {
        found.truncate(MAX_LIST_RESULTS);
        found.join("\n")
    };
    if total > MAX_LIST_RESULTS {
        out.push_str(&format!(
            "\n… and {} more files; narrow the pattern",
            total - MAX_LIST_RESULTS
        ));
    }
    out.push_str(&walker.notes_text());
    Ok(out)
}

/// What grep has collected so far.
struct GrepState {
    lines: Vec<String>,
    chars: usize,
    truncated: bool,
    stop: Stop,
    /// Why the search stopped early (deadline, cancel).
    stopped: Option<String>,
}

/// `grep`: lines matching a regular expression, as `path:line: text`.
/// `grep`, stopping when `stop` says so (see `grep_limits`).
pub(crate) fn grep_until(root: &Root, args: &GrepArgs, stop: Stop) -> Result<String> {
    let regex = RegexBuilder::new(&args.pattern)
        .size_limit(GREP_REGEX_SIZE_LIMIT)
        .dfa_size_limit(2 * GREP_REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            WorkspaceError::Invalid(format!(
                "`{}` is not a valid regular expression or is too large once compiled (limit {} KiB): {e}; \
                 use a simpler pattern (a smaller repetition count such as {{1,50}}, or `[a-z]` instead of \\w)",
                args.pattern,
                GREP_REGEX_SIZE_LIMIT / 1024
            ))
        })?;
    let filter = match args
        .glob
        .as_deref()
        .map(str::trim)
        .filter(|g| !g.is_empty())
    {
        Some(glob) => Some((glob_matcher(glob, "glob")?, glob.contains('/'))),
        None => None,
    };
    let rel = match args
        .path
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        Some(path) => root.resolve(path)?,
        None => RelPath::root(),
    };
    let start = root.open_beneath(&rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())?;
    let start = File::from(start);
    let meta = start
        .metadata()
        .map_err(|e| WorkspaceError::io("inspecting", rel.shown(), e))?;
    let mut state = GrepState {
        lines: Vec::new(),
        chars: 0,
        truncated: false,
        stop,
        stopped: None,
    };
    let mut walker = Walker::new(root);
    if meta.is_file() {
        if let Some(skip) = grep_file(start, &rel, &regex, &mut state) {
            walker.note(skip);
        }
    } else if meta.is_dir() {
        let start = OwnedFd::from(start);
        walker.walk(&start, &rel, 0, &mut |walker, child, found| {
            if let Some((matcher, whole_path)) = &filter {
                let shown = child.shown();
                let subject = if *whole_path {
                    shown
                } else {
                    child
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                };
                if !matcher.is_match(&subject) {
                    return Flow::Continue;
                }
            }
            let file = match found {
                Found::Entry { dir, name } => {
                    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW;
                    let no_symlinks =
                        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
                    openat2_retrying(dir, Path::new(name), flags, Mode::empty(), no_symlinks)
                        .map(File::from)
                        .map_err(|errno| errno.desc().to_lowercase())
                }
                Found::Link => {
                    if found_under_real_path(root, child, &rel) {
                        return Flow::Continue;
                    }
                    root.open_beneath(child, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())
                        .map(File::from)
                        .map_err(|e| e.to_string())
                }
            };
            match file {
                Ok(file) => {
                    if let Some(skip) = grep_file(file, child, &regex, &mut state) {
                        walker.note(skip);
                    }
                }
                Err(why) => walker.note(format!("skipped `{}`: {why}", child.shown())),
            }
            if state.truncated || state.stopped.is_some() {
                Flow::Stop
            } else {
                Flow::Continue
            }
        });
    } else {
        return Err(WorkspaceError::NotAFile { path: rel.shown() });
    }

    let mut out = if state.lines.is_empty() {
        format!("no matches for `{}` in `{}`", args.pattern, rel.shown())
    } else {
        state.lines.join("\n")
    };
    if state.truncated {
        out.push_str(&format!(
            "\n(output cut at {} matching lines; narrow the search with `path`, `glob` or a more specific pattern)",
            state.lines.len()
        ));
    }
    if let Some(why) = &state.stopped {
        out.push_str(&format!("\n(search incomplete: {why})"));
    }
    out.push_str(&walker.notes_text());
    Ok(out)
}

/// Whether the walk from `start` also meets the target of the link `child` under its real path
/// (so grep searches it once): the target lies under `start` and not in a skipped folder.
fn found_under_real_path(root: &Root, child: &RelPath, start: &RelPath) -> bool {
    let Some(real) = root.canonical_inside(child) else {
        return false;
    };
    real.as_path().starts_with(start.as_path())
        && !real
            .as_path()
            .components()
            .any(|c| SKIPPED_DIRS.iter().any(|s| OsStr::new(s) == c.as_os_str()))
}

/// Greps one file into `state`; returns a note when the file is skipped.
fn grep_file(file: File, rel: &RelPath, regex: &Regex, state: &mut GrepState) -> Option<String> {
    let shown = rel.shown();
    let meta = match file.metadata() {
        Ok(meta) => meta,
        Err(e) => return Some(format!("skipped `{shown}`: {e}")),
    };
    if !meta.is_file() {
        return None;
    }
    if meta.len() > MAX_GREP_FILE_BYTES {
        return Some(format!(
            "skipped `{shown}`: larger than {} MB",
            MAX_GREP_FILE_BYTES / (1024 * 1024)
        ));
    }
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    match reader.fill_buf() {
        Ok(head) if head[..head.len().min(SNIFF_BYTES)].contains(&0) => return None, // binary
        Ok(_) => {}
        Err(e) => return Some(format!("skipped `{shown}`: {e}")),
    }
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        let chars = match read_line_capped(&mut reader, &mut line, MAX_GREP_LINE_BYTES) {
            Ok(None) => return None,
            Ok(Some(chars)) => chars,
            Err(e) => return Some(format!("stopped reading `{shown}` at line {number}: {e}")),
        };
        number += 1;
        if let Some(why) = state.stop.reason() {
            state.stopped = Some(why);
            return None;
        }
        let text = String::from_utf8_lossy(&line);
        if regex.is_match(&text) {
            if state.lines.len() >= MAX_GREP_MATCHES || state.chars >= MAX_GREP_CHARS {
                state.truncated = true;
                return None;
            }
            let hit = format!(
                "{shown}:{number}: {}",
                cut_line(&text, chars, MAX_GREP_LINE_CHARS)
            );
            state.chars += hit.len() + 1;
            state.lines.push(hit);
        }
    }
}
