//! Memory bounds of the SQLite side: one value is at most [`MAX_VALUE_BYTES`] (so a single
//! `randomblob(3e8)`, which the progress handler cannot interrupt, fails at once instead of
//! running past the timeout), SQLite's whole heap is capped at [`HEAP_LIMIT_BYTES`], and a
//! cell over 64 KiB is cut before it is copied out of SQLite.

use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde_json::{json, Value};

/// The largest string or blob SQLite will make or return (`SQLITE_LIMIT_LENGTH`): 16 MiB.
pub(crate) const MAX_VALUE_BYTES: i32 = 16 * 1024 * 1024;
/// SQLite's hard heap limit for this process (`sqlite3_hard_heap_limit64`): 256 MiB.
pub(crate) const HEAP_LIMIT_BYTES: i64 = 256 * 1024 * 1024;
/// Characters (text) or bytes (blob) kept of a cell cut here.
const KEPT: usize = 950;
/// Cells up to this many bytes are copied whole (and cut, if needed, when rendered).
const COPIED_WHOLE: usize = 64 * 1024;

/// Applies the value cap to `conn` and the heap cap to the process.
pub(crate) fn bound(conn: &Connection) {
    // SAFETY: the handle belongs to `conn`, which outlives the call; both functions only set a
    // limit and return the previous one.
    #[allow(unsafe_code)]
    unsafe {
        rusqlite::ffi::sqlite3_limit(
            conn.handle(),
            rusqlite::ffi::SQLITE_LIMIT_LENGTH,
            MAX_VALUE_BYTES,
        );
        rusqlite::ffi::sqlite3_hard_heap_limit64(HEAP_LIMIT_BYTES);
    }
}

/// The message for a value or query over the caps.
pub(crate) fn too_big() -> String {
    format!(
        "the query made or read a value over {} MiB, or needed more than {} MiB of memory; \
         select a part of large values with substr() or length(), or narrow the query",
        MAX_VALUE_BYTES / (1024 * 1024),
        HEAP_LIMIT_BYTES / (1024 * 1024)
    )
}

/// One cell as JSON; large text and blobs are cut here, before they are copied.
pub(crate) fn cell(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => json!(i),
        ValueRef::Real(f) => serde_json::Number::from_f64(f)
            .map_or_else(|| Value::String(f.to_string()), Value::Number),
        ValueRef::Text(t) if t.len() > COPIED_WHOLE => {
            let head = String::from_utf8_lossy(&t[..4 * KEPT]);
            let head: String = head.chars().take(KEPT).collect();
            Value::String(format!("{head}… [cut: {} bytes]", t.len()))
        }
        ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) if b.len() > COPIED_WHOLE / 2 => Value::String(format!(
            "x'{}'… [cut: {} bytes]",
            hex::encode(&b[..KEPT / 2]),
            b.len()
        )),
        ValueRef::Blob(b) => Value::String(format!("x'{}'", hex::encode(b))),
    }
}
