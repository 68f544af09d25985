//! Small helpers to read a bundle's JSON files field by field, so every error carries the file,
//! the dotted field path and what was expected (serde's derive errors name neither file nor path).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::error::{BundleError, Result};

/// Reads and parses `dir/file` if it exists. `Ok(None)` when the file is absent.
pub(crate) fn read_optional(dir: &Path, file: &str) -> Result<Option<Value>> {
    match read_text_optional(dir, file)? {
        Some(text) => parse(file, &text).map(Some),
        None => Ok(None),
    }
}

/// Reads `dir/file` as UTF-8 text if it exists (beneath `dir`, bounded: see `read`).
pub(crate) fn read_text_optional(dir: &Path, file: &str) -> Result<Option<String>> {
    match super::read::read_bounded(dir, file)? {
        Some(bytes) => String::from_utf8(bytes)
            .map(|s| Some(s.strip_prefix('\u{feff}').map(str::to_string).unwrap_or(s)))
            .map_err(|_| BundleError::invalid(file, "", "expected UTF-8 text")),
        None => Ok(None),
    }
}

/// Parses JSON text, mapping syntax errors to [`BundleError::Json`] with line and column.
pub(crate) fn parse(file: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        // serde_json appends " at line L column C"; we print those separately.
        let message = match full.rfind(" at line ") {
            Some(i) => full[..i].to_string(),
            None => full,
        };
        BundleError::Json {
            file: file.to_string(),
            line: e.line(),
            column: e.column(),
            message,
        }
    })
}

/// Joins a dotted field path.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// A short description of a JSON value's type, for "expected X, got Y" messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON object being read, with its file and field path for error messages.
pub(crate) struct Obj<'a> {
    pub file: &'a str,
    pub path: String,
    pub map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    /// `v` must be an object; `what` describes it for the error ("an object of servers").
    pub fn new(file: &'a str, path: &str, v: &'a Value, what: &str) -> Result<Self> {
        match v {
            Value::Object(map) => Ok(Obj {
                file,
                path: path.to_string(),
                map,
            }),
            other => Err(BundleError::invalid(
                file,
                if path.is_empty() { "(top level)" } else { path },
                format!("expected {what}, got {}", kind(other)),
            )),
        }
    }

    pub fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn err(&self, key: &str, message: impl Into<String>) -> BundleError {
        BundleError::invalid(self.file, &self.field(key), message)
    }

    /// Refuses keys outside `known`, listing the known ones.
    pub fn only_keys(&self, known: &[&str]) -> Result<()> {
        for key in self.map.keys() {
            if !known.contains(&key.as_str()) {
                return Err(self.err(
                    key,
                    format!("unknown key; expected one of: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.err(key, format!("expected a string, got {}", kind(other)))),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => {
                Err(self.err(key, format!("expected true or false, got {}", kind(other))))
            }
        }
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
                self.err(
                    key,
                    format!("expected a whole number from 0 to {}, got {n}", u64::MAX),
                )
            }),
            Some(other) => {
                Err(self.err(key, format!("expected a whole number, got {}", kind(other))))
            }
        }
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(
                        key,
                        format!("expected a whole number from 0 to {}, got {n}", u32::MAX),
                    )
                }),
            Some(other) => {
                Err(self.err(key, format!("expected a whole number, got {}", kind(other))))
            }
        }
    }

    /// An optional array of strings.
    pub fn str_vec(&self, key: &str) -> Result<Vec<String>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(BundleError::invalid(
                        self.file,
                        &format!("{}[{i}]", self.field(key)),
                        format!("expected a string, got {}", kind(other)),
                    )),
                })
                .collect(),
            Some(other) => Err(self.err(
                key,
                format!("expected an array of strings, got {}", kind(other)),
            )),
        }
    }

    /// An optional object whose values are all strings.
    pub fn str_map(&self, key: &str) -> Result<BTreeMap<String, String>> {
        let Some(v) = self.get(key) else {
            return Ok(BTreeMap::new());
        };
        let obj = Obj::new(self.file, &self.field(key), v, "an object of strings")?;
        let mut out = BTreeMap::new();
        for (k, v) in obj.map {
            match v {
                Value::String(s) => {
                    out.insert(k.clone(), s.clone());
                }
                other => return Err(obj.err(k, format!("expected a string, got {}", kind(other)))),
            }
        }
        Ok(out)
    }
}
