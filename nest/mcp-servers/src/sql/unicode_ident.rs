//! Postgres `U&"…"` identifiers (with an optional `UESCAPE 'c'`) decoded to the name the
//! server will see, so the screen in `guard` judges `U&"\0070g_advisory_lock"` as
//! `pg_advisory_lock`.
//!
//! Invariant: an escape the decoder cannot read is refused, never passed through undecoded.

/// Decodes the body of a `U&"…"` identifier (quotes already removed, `""` already folded) with
/// `escape` (default `\`): `\XXXX` and `\+XXXXXX` are code points, `\\` is the escape itself.
pub(crate) fn decode(body: &str, escape: char) -> Option<String> {
    let chars: Vec<char> = body.chars().collect();
    let mut out = String::with_capacity(body.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c != escape {
            out.push(c);
            i += 1;
            continue;
        }
        match chars.get(i + 1) {
            Some(&n) if n == escape => {
                out.push(escape);
                i += 2;
            }
            Some('+') => {
                out.push(code_point(chars.get(i + 2..i + 8)?)?);
                i += 8;
            }
            Some(_) => {
                out.push(code_point(chars.get(i + 1..i + 5)?)?);
                i += 5;
            }
            None => return None,
        }
    }
    Some(out)
}

fn code_point(hex: &[char]) -> Option<char> {
    if !hex.iter().all(char::is_ascii_hexdigit) {
        return None;
    }
    let s: String = hex.iter().collect();
    char::from_u32(u32::from_str_radix(&s, 16).ok()?)
}

/// Whether `c` may be a `UESCAPE` character (Postgres: not a hex digit, `+`, `'`, `"` or
/// whitespace).
pub(crate) fn valid_escape(c: char) -> bool {
    !(c.is_ascii_hexdigit() || c == '+' || c == '\'' || c == '"' || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_to_the_name_the_server_sees() {
        assert_eq!(
            decode(r"\0070g_advisory_lock", '\\').as_deref(),
            Some("pg_advisory_lock")
        );
        assert_eq!(
            decode(r"\+000070g_sleep", '\\').as_deref(),
            Some("pg_sleep")
        );
        assert_eq!(decode("!0070g!!x", '!').as_deref(), Some("pg!x"));
        assert_eq!(decode(r"d\0061t\0061", '\\').as_deref(), Some("data"));
        assert_eq!(decode(r"\00zz", '\\'), None);
        assert_eq!(decode(r"abc\", '\\'), None);
        assert_eq!(decode(r"\D800", '\\'), None);
    }
}
