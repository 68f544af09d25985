//! `x-agen/secrets.json` (declared secrets and their sources) and `${NAME}` substitution.
//!
//! Invariants: a secret name is `[A-Za-z_][A-Za-z0-9_]*`; `${NAME}` is the only substitution
//! syntax (`$` alone is literal); a reference to an undeclared secret is a load error; secret
//! values are never logged or put in error messages.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::Result;
use super::json::Obj;

pub const SECRETS_FILE: &str = "x-agen/secrets.json";

/// Declared secrets, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretDecls(pub BTreeMap<String, SecretSource>);

/// Where a secret's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "lowercase")]
pub enum SecretSource {
    /// The Hub's secret store.
    Platform,
    /// An environment variable of the Nest (or of `agen run`).
    Env { var: String },
}

impl SecretDecls {
    pub fn get(&self, name: &str) -> Option<&SecretSource> {
        self.0.get(name)
    }
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&String, &SecretSource)> {
        self.0.iter()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `name` is a valid secret (and environment variable) name.
pub fn valid_secret_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(crate) fn parse(v: &Value) -> Result<SecretDecls> {
    let top = Obj::new(
        SECRETS_FILE,
        "",
        v,
        "an object of secrets by name, e.g. {\"CRM_TOKEN\": {\"source\": \"platform\"}}",
    )?;
    let mut out = BTreeMap::new();
    for (name, decl) in top.map {
        if !valid_secret_name(name) {
            return Err(top.err(
                name,
                "bad secret name; expected letters, digits and `_`, not starting with a digit",
            ));
        }
        let d = Obj::new(SECRETS_FILE, name, decl, "an object such as {\"source\": \"platform\"} or {\"source\": \"env\", \"var\": \"VAR\"}")?;
        let expected = "expected \"platform\" (the Hub's secret store) or \"env\" (with \"var\")";
        let source = match d.opt_str("source")?.as_deref() {
            Some("platform") => {
                d.only_keys(&["source"])?;
                SecretSource::Platform
            }
            Some("env") => {
                d.only_keys(&["source", "var"])?;
                let var = d.opt_str("var")?.unwrap_or_else(|| name.clone());
                if !valid_secret_name(&var) {
                    return Err(d.err(
                        "var",
                        format!("expected an environment variable name, got `{var}`"),
                    ));
                }
                SecretSource::Env { var }
            }
            Some(other) => return Err(d.err("source", format!("{expected}, got \"{other}\""))),
            None => return Err(d.err("source", format!("missing; {expected}"))),
        };
        out.insert(name.clone(), source);
    }
    Ok(SecretDecls(out))
}

/// A `${...}` that is not a well-formed reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubstituteError {
    #[error("`${{` without a closing `}}`; expected `${{NAME}}`")]
    Unterminated,
    #[error("bad secret reference `${{{0}}}`; expected `${{NAME}}` with letters, digits and `_`")]
    BadName(String),
    #[error("secret {0} has no value")]
    Unresolved(String),
}

/// The secret names referenced by `${NAME}` in `s`, in order of appearance (duplicates kept).
pub fn secret_refs(s: &str) -> std::result::Result<Vec<String>, SubstituteError> {
    let mut names = Vec::new();
    substitute_secrets(s, |name| {
        names.push(name.to_string());
        Some(String::new())
    })?;
    Ok(names)
}

/// Replaces every `${NAME}` in `s` with `resolve(NAME)`. A name `resolve` cannot supply, a
/// malformed name or an unterminated `${` is an error. A `$` not followed by `{` is literal.
pub fn substitute_secrets(
    s: &str,
    mut resolve: impl FnMut(&str) -> Option<String>,
) -> std::result::Result<String, SubstituteError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after.find('}').ok_or(SubstituteError::Unterminated)?;
        let name = &after[..end];
        if !valid_secret_name(name) {
            return Err(SubstituteError::BadName(name.to_string()));
        }
        let value = resolve(name).ok_or_else(|| SubstituteError::Unresolved(name.to_string()))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: std::result::Result<&str, SubstituteError>) {
        let got = substitute_secrets(input, |n| match n {
            "TOKEN" => Some("t0k".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        });
        assert_eq!(
            got.as_deref().map_err(Clone::clone),
            expected,
            "input {input:?}"
        );
    }

    #[test]
    fn substitution_table() {
        check("Bearer ${TOKEN}", Ok("Bearer t0k"));
        check("${TOKEN}${TOKEN}", Ok("t0kt0k"));
        check("a${EMPTY}b", Ok("ab"));
        check(
            "no refs, $5 and $HOME stay",
            Ok("no refs, $5 and $HOME stay"),
        );
        check(
            "${MISSING}",
            Err(SubstituteError::Unresolved("MISSING".into())),
        );
        check("${TOKEN", Err(SubstituteError::Unterminated));
        check("${1X}", Err(SubstituteError::BadName("1X".into())));
        check("${}", Err(SubstituteError::BadName(String::new())));
    }

    #[test]
    fn refs_are_listed_in_order() {
        assert_eq!(
            secret_refs("${A} and ${B_2} and ${A}").unwrap(),
            vec!["A", "B_2", "A"]
        );
    }
}
