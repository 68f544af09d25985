//! The `read`, `write` and `edit` tools: one file at a time, opened beneath the root.
//!
//! Invariants: every file is opened through [`Root::open_beneath`] (never by path string);
//! `edit` reads and rewrites through the same descriptor; special files (pipes, devices) are
//! refused before any byte is read or written; outputs are bounded.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use schemars::JsonSchema;
use serde::Deserialize;

use super::confine::{RelPath, Root};
use super::error::{Result, WorkspaceError};

/// Lines `read` returns when no `limit` is given.
pub const DEFAULT_READ_LINES: usize = 400;
/// The most lines one `read` returns, whatever `limit` asks.
pub const MAX_READ_LINES: usize = 2000;
/// Lines longer than this many characters are cut in `read` output.
pub const MAX_LINE_CHARS: usize = 2000;
/// One `read` stops after about this many characters and says where to continue.
pub const MAX_READ_CHARS: usize = 100_000;
/// Bytes looked at to tell a binary file from a text file.
pub(crate) const SNIFF_BYTES: usize = 8192;

/// Arguments of `read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// File to read, relative to the workspace root.
    pub path: String,
    /// First line to return (1-based; default 1).
    #[serde(default)]
    pub offset: Option<u64>,
    /// How many lines to return (default 400, at most 2000).
    #[serde(default)]
    pub limit: Option<u64>,
}

/// Arguments of `write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// File to create or replace, relative to the workspace root; missing folders are created.
    pub path: String,
    /// The whole new content of the file.
    pub content: String,
}

/// Arguments of `edit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// File to edit, relative to the workspace root.
    pub path: String,
    /// The exact text to replace, including whitespace and indentation; it must occur exactly once unless replace_all is true.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence instead of requiring exactly one (default false).
    #[serde(default)]
    pub replace_all: Option<bool>,
}

/// Opens `rel` for `flags` and checks it is a regular file.
fn open_file(root: &Root, rel: &RelPath, flags: OFlag) -> Result<File> {
    let fd = root.open_beneath(rel, flags | OFlag::O_NONBLOCK, Mode::empty())?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| WorkspaceError::io("inspecting", rel.shown(), e))?;
    if meta.is_dir() {
        return Err(WorkspaceError::IsAFolder { path: rel.shown() });
    }
    if !meta.is_file() {
        return Err(WorkspaceError::NotAFile { path: rel.shown() });
    }
    Ok(file)
}

/// `read`: numbered lines of a text file, a page at a time.
pub fn read(root: &Root, args: &ReadArgs) -> Result<String> {
    let rel = root.resolve(&args.path)?;
    if rel.is_root() {
        return Err(WorkspaceError::IsAFolder { path: rel.shown() });
    }
    let shown = rel.shown();
    let file = open_file(root, &rel, OFlag::O_RDONLY)?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader
        .fill_buf()
        .map_err(|e| WorkspaceError::io("reading", &shown, e))?;
    if head[..head.len().min(SNIFF_BYTES)].contains(&0) {
        return Err(WorkspaceError::Binary { path: shown, size });
    }

    let offset = usize::try_from(args.offset.unwrap_or(1))
        .unwrap_or(usize::MAX)
        .max(1);
    let requested =
        usize::try_from(args.limit.unwrap_or(DEFAULT_READ_LINES as u64)).unwrap_or(usize::MAX);
    if requested == 0 {
        return Err(WorkspaceError::Invalid(
            "limit must be at least 1 line".into(),
        ));
    }
    let limit = requested.min(MAX_READ_LINES);

    let mut out = String::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    let mut last_shown = 0usize;
    let mut budget_hit = false;
    loop {
        let chars = read_line_capped(&mut reader, &mut line, MAX_LINE_CHARS * 4)
            .map_err(|e| WorkspaceError::io("reading", &shown, e))?;
        let Some(chars) = chars else { break };
        number += 1;
        if number < offset || number >= offset + limit || budget_hit {
            continue;
        }
        if out.len() >= MAX_READ_CHARS {
            budget_hit = true;
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        out.push_str(&format!(
            "{number:>6}\t{}\n",
            cut_line(&text, chars, MAX_LINE_CHARS)
        ));
        last_shown = number;
    }
    let total = number;

    if total == 0 {
        return Ok(format!("(`{shown}` is empty)"));
    }
    if offset > total {
        return Err(WorkspaceError::Invalid(format!(
            "offset {offset} is past the end of `{shown}`, which has {total} lines; use an offset from 1 to {total}"
        )));
    }
    if last_shown < total {
        out.push_str(&format!(
            "(lines {offset}-{last_shown} of {total}; call read with offset {} to see more)",
            last_shown + 1
        ));
    } else if offset > 1 {
        out.push_str(&format!(
            "(lines {offset}-{last_shown} of {total}; end of file)"
        ));
    }
    if requested > MAX_READ_LINES {
        out.push_str(&format!(
            "\n(limit is at most {MAX_READ_LINES} lines per call)"
        ));
    }
    Ok(out)
}

/// `write`: creates or replaces a whole file, creating missing folders inside the root.
pub fn write(root: &Root, args: &WriteArgs) -> Result<String> {
    let rel = root.resolve(&args.path)?;
    if rel.is_root() {
        return Err(WorkspaceError::Invalid(
            "write needs a file path, not the workspace root".into(),
        ));
    }
    let shown = rel.shown();
    root.create_parents(&rel)?;
    let mode = Mode::from_bits_truncate(0o644);
    let create = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NONBLOCK;
    // Either a regular file made just now (`O_EXCL`) or one `open_file` checked is a regular file.
    let (mut file, created) = match root.open_beneath(&rel, create, mode) {
        Ok(fd) => (File::from(fd), true),
        // Something is already there (a file, or a link that must resolve inside the root).
        // Opened without `O_TRUNC`: only a regular file is replaced (`open_file` checks), and
        // it is overwritten in place and then cut to the new length, so a rewrite of about the
        // same size keeps its blocks instead of freeing and allocating them again (on a
        // filesystem mounted with `discard`, freeing them is a synchronous discard per write).
        Err(WorkspaceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EEXIST) => {
            (open_file(root, &rel, OFlag::O_WRONLY)?, false)
        }
        Err(e) => return Err(e),
    };
    file.write_all(args.content.as_bytes())
        .map_err(|e| WorkspaceError::io("writing", &shown, e))?;
    file.set_len(args.content.len() as u64)
        .map_err(|e| WorkspaceError::io("writing", &shown, e))?;
    let lines = count_lines(&args.content);
    let verb = if created { "created" } else { "replaced" };
    Ok(format!(
        "{verb} `{shown}` ({lines} lines, {} bytes)",
        args.content.len()
    ))
}

/// `edit`: replaces one exact piece of text (or every occurrence with `replace_all`).
pub fn edit(root: &Root, args: &EditArgs) -> Result<String> {
    let rel = root.resolve(&args.path)?;
    if rel.is_root() {
        return Err(WorkspaceError::IsAFolder { path: rel.shown() });
    }
    let shown = rel.shown();
    if args.old_string.is_empty() {
        return Err(WorkspaceError::Invalid(
            "old_string is empty; give the exact text to replace (to create a file, use write)"
                .into(),
        ));
    }
    if args.old_string == args.new_string {
        return Err(WorkspaceError::Invalid(
            "old_string and new_string are the same; there is nothing to change".into(),
        ));
    }
    let mut file = open_file(root, &rel, OFlag::O_RDWR)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| WorkspaceError::io("reading", &shown, e))?;
    let content = String::from_utf8(bytes).map_err(|_| {
        WorkspaceError::Invalid(format!("`{shown}` is not UTF-8 text; edit works on text files only (write replaces a whole file)"))
    })?;

    let starts: Vec<usize> = content
        .match_indices(args.old_string.as_str())
        .map(|(i, _)| i)
        .collect();
    let replace_all = args.replace_all.unwrap_or(false);
    if starts.is_empty() {
        return Err(WorkspaceError::Invalid(not_found_message(
            &shown,
            &content,
            &args.old_string,
        )));
    }
    if starts.len() > 1 && !replace_all {
        return Err(WorkspaceError::Invalid(format!(
            "old_string occurs {} times in `{shown}` (at lines {}); include more of the surrounding text so it occurs once, or set replace_all to true",
            starts.len(),
            line_list(&content, &starts)
        )));
    }
    let updated = content.replace(args.old_string.as_str(), &args.new_string);
    file.seek(SeekFrom::Start(0))
        .map_err(|e| WorkspaceError::io("writing", &shown, e))?;
    file.set_len(0)
        .map_err(|e| WorkspaceError::io("writing", &shown, e))?;
    file.write_all(updated.as_bytes())
        .map_err(|e| WorkspaceError::io("writing", &shown, e))?;
    file.flush()
        .map_err(|e| WorkspaceError::io("writing", &shown, e))?;
    let what = if starts.len() == 1 {
        "1 occurrence".to_string()
    } else {
        format!("{} occurrences", starts.len())
    };
    let lines = if starts.len() == 1 { "line" } else { "lines" };
    Ok(format!(
        "edited `{shown}`: replaced {what} (at {lines} {})",
        line_list(&content, &starts)
    ))
}

/// The error for an `old_string` that is not in the file, with a hint where its first line is.
fn not_found_message(shown: &str, content: &str, old: &str) -> String {
    let mut message = format!(
        "old_string was not found in `{shown}`; read the file and copy the exact text, including whitespace and indentation"
    );
    if let Some(first) = old.lines().map(str::trim).find(|l| !l.is_empty()) {
        let hits: Vec<usize> = content
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(first))
            .map(|(i, _)| i + 1)
            .take(5)
            .collect();
        if !hits.is_empty() {
            let hits: Vec<String> = hits.iter().map(usize::to_string).collect();
            message.push_str(&format!(
                " (its first line occurs at line {})",
                hits.join(", ")
            ));
        }
    }
    message
}

/// "3, 17, 40" for byte offsets, at most ten of them.
fn line_list(content: &str, starts: &[usize]) -> String {
    let mut lines: Vec<String> = starts
        .iter()
        .take(10)
        .map(|&i| (content[..i].matches('\n').count() + 1).to_string())
        .collect();
    if starts.len() > 10 {
        lines.push("…".into());
    }
    lines.join(", ")
}

fn count_lines(text: &str) -> usize {
    if text.is_empty() {
        0
    } else {
        text.matches('\n').count() + usize::from(!text.ends_with('\n'))
    }
}

/// Reads one line into `buf` without its `\n` or `\r\n`, keeping at most `cap` bytes of it
/// (so a huge line never fills memory). Returns the line's full length in characters, or
/// `None` at the end of the input.
pub(crate) fn read_line_capped<R: BufRead>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<Option<usize>> {
    buf.clear();
    let mut chars = 0usize;
    let mut seen_any = false;
    let mut last = None;
    loop {
        let (used, done) = {
            let available = reader.fill_buf()?;
            if available.is_empty() {
                break;
            }
            seen_any = true;
            let newline = available.iter().position(|b| *b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            // UTF-8 continuation bytes do not start a character.
            chars += chunk.iter().filter(|b| (**b & 0xC0) != 0x80).count();
            if let Some(&byte) = chunk.last() {
                last = Some(byte);
            }
            let room = cap.saturating_sub(buf.len());
            buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            match newline {
                Some(at) => (at + 1, true),
                None => (available.len(), false),
            }
        };
        reader.consume(used);
        if done {
            break;
        }
    }
    if !seen_any {
        return Ok(None);
    }
    if last == Some(b'\r') {
        chars -= 1;
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Ok(Some(chars))
}

/// Cuts a line of `total_chars` characters (of which `text` holds at least the first `max`) at
/// `max` characters and says so.
pub(crate) fn cut_line(text: &str, total_chars: usize, max: usize) -> String {
    if total_chars <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept} … [line cut: {total_chars} characters in total]")
}
