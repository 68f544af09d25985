//! Statement screening before a query reaches the database: one statement, a read-only first
//! keyword, no calls to functions that change server state.
//!
//! This is the first of several fences, and the weakest one on purpose: the database enforces
//! read-only itself (a `READ ONLY` transaction that is always rolled back, or a SQLite file
//! opened read-only with `query_only` and an authorizer). The screen exists so that the model
//! gets a clear, early reason, and so that a trick the database would accept in some
//! configuration (a second statement, a `SET`, `set_config`) never gets that far.
//!
//! Invariant: the scanner errs on the side of refusing. Anything it cannot classify (an
//! unterminated string, an unknown first keyword) is refused; it never skips text that the
//! database would read as code. Comment nesting follows each dialect (Postgres nests block
//! comments, SQLite does not), so a comment trick that fools one fools neither.

use std::fmt;

use super::unicode_ident;

/// The SQL dialect whose lexical rules the scanner follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}

/// Why a statement was refused before it reached the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Empty,
    MultipleStatements,
    NotReadOnly {
        keyword: String,
        allowed: &'static str,
    },
    SessionControl {
        keyword: String,
    },
    Function {
        name: String,
    },
    Pragma {
        name: String,
    },
    Unterminated {
        what: &'static str,
    },
    /// A `U&"…"` identifier or its `UESCAPE` that cannot be decoded.
    BadUnicodeEscape,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Empty => write!(f, "the query is empty; pass one SELECT statement in `sql`"),
            Refusal::MultipleStatements => write!(
                f,
                "only one statement per query is allowed; send each statement in its own `query` call"
            ),
            Refusal::NotReadOnly { keyword, allowed } => write!(
                f,
                "`{keyword}` statements are refused: this server is read-only and runs only {allowed}"
            ),
            Refusal::SessionControl { keyword } => write!(
                f,
                "`{keyword}` is refused: each query runs in its own read-only transaction with a fixed \
                 timeout, which a query cannot change; send a plain SELECT"
            ),
            Refusal::Function { name } => write!(
                f,
                "calling `{name}` is refused: it changes server or session state, and this server is read-only"
            ),
            Refusal::Pragma { name } => write!(
                f,
                "`PRAGMA {name}` is refused: only read-only introspection pragmas (table_info, index_list, \
                 foreign_key_list, …) without a value are allowed"
            ),
            Refusal::Unterminated { what } => {
                write!(f, "the query has an unterminated {what}; check the quoting")
            }
            Refusal::BadUnicodeEscape => write!(
                f,
                "the query has a U&\"…\" identifier whose escapes cannot be read; write the name plainly"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// A significant token of the statement: comments, whitespace and string contents are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A keyword or identifier, lowercased; quoted identifiers are unquoted.
    Word(String),
    /// A string or dollar-quoted literal (contents are irrelevant to screening).
    Literal,
    Semicolon,
    OpenParen,
    /// Any other punctuation or number; the char is kept for `=` detection.
    Other(char),
}

/// First keywords of statements that only read, per dialect.
const POSTGRES_READS: &[&str] = &["select", "with", "values", "table", "explain", "show"];
const SQLITE_READS: &[&str] = &["select", "with", "values", "explain", "pragma"];

/// First keywords that try to control the transaction or the session.
const SESSION_CONTROL: &[&str] = &[
    "set",
    "reset",
    "begin",
    "start",
    "commit",
    "end",
    "rollback",
    "abort",
    "savepoint",
    "release",
    "discard",
];

/// Postgres functions that change server or session state even inside a read-only transaction
/// (or that reach other sessions). Matched when a word is followed by `(`; a trailing `*` is a
/// prefix match.
const POSTGRES_REFUSED_FUNCTIONS: &[&str] = &[
    "set_config",
    "dblink*",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "pg_rotate_logfile",
    "pg_advisory_*",
    "pg_try_advisory_*",
    "lo_*",
    "pg_file_write",
    "pg_file_rename",
    "pg_file_unlink",
    "pg_logical_emit_message",
    "pg_create_*",
    "pg_drop_replication_slot",
    "pg_replication_*",
    "pg_switch_wal",
    "pg_promote",
    "pg_stat_reset*",
    "pg_notify",
    "nextval",
    "setval",
    "pg_import_system_collations",
    "query_to_xml*",
    "query_to_json*",
    "pg_signal_backend",
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_*",
    "pg_stat_file",
    "pg_log_backend_memory_contexts",
    "pg_wal_replay_*",
    "pg_backup_*",
    "pg_start_backup",
    "pg_stop_backup",
    "pg_sequence_*",
    "txid_current*",
    "pg_current_xact_id*",
];

/// SQLite functions refused wherever they appear (the authorizer refuses them too).
const SQLITE_REFUSED_FUNCTIONS: &[&str] = &[
    "load_extension",
    "fts3_tokenizer",
    "writefile",
    "readfile",
    "edit",
];

/// SQLite pragmas that take a table or index name and only read.
pub const SQLITE_PRAGMAS_WITH_ARGUMENT: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
];

/// SQLite pragmas that only read when they are given no value.
pub const SQLITE_PRAGMAS_WITHOUT_VALUE: &[&str] = &[
    "database_list",
    "collation_list",
    "function_list",
    "module_list",
    "pragma_list",
    "compile_options",
    "user_version",
    "application_id",
    "schema_version",
    "data_version",
    "page_count",
    "page_size",
    "freelist_count",
    "encoding",
    "foreign_keys",
    "journal_mode",
    "query_only",
];

/// Whether SQLite may run `PRAGMA name` (with `value` when one is given).
pub fn sqlite_pragma_allowed(name: &str, value: Option<&str>) -> bool {
    let name = name.to_ascii_lowercase();
    SQLITE_PRAGMAS_WITH_ARGUMENT.contains(&name.as_str())
        || (value.is_none() && SQLITE_PRAGMAS_WITHOUT_VALUE.contains(&name.as_str()))
}

/// Whether a SQLite function may be called.
pub fn sqlite_function_allowed(name: &str) -> bool {
    !matches_any(&name.to_ascii_lowercase(), SQLITE_REFUSED_FUNCTIONS)
}

/// Screens `sql` for `dialect`: exactly one statement, starting with a read-only keyword, with
/// no call to a refused function.
pub fn screen(sql: &str, dialect: Dialect) -> Result<(), Refusal> {
    let tokens = tokenize(sql, dialect)?;
    // One statement: nothing significant may follow a `;`.
    let mut statement: Vec<&Token> = Vec::new();
    let mut ended = false;
    for token in &tokens {
        match token {
            Token::Semicolon => ended = true,
            _ if ended => return Err(Refusal::MultipleStatements),
            other => statement.push(other),
        }
    }
    let first = statement.iter().find_map(|t| match t {
        Token::OpenParen => None,
        Token::Word(w) => Some(Some(w.clone())),
        _ => Some(None),
    });
    let first = match first {
        None => return Err(Refusal::Empty),
        Some(None) => {
            return Err(Refusal::NotReadOnly {
                keyword: "?".into(),
                allowed: allowed_text(dialect),
            })
        }
        Some(Some(word)) => word,
    };
    let reads = match dialect {
        Dialect::Postgres => POSTGRES_READS,
        Dialect::Sqlite => SQLITE_READS,
    };
    if !reads.contains(&first.as_str()) {
        let keyword = first.to_ascii_uppercase();
        if SESSION_CONTROL.contains(&first.as_str()) {
            return Err(Refusal::SessionControl { keyword });
        }
        return Err(Refusal::NotReadOnly {
            keyword,
            allowed: allowed_text(dialect),
        });
    }
    if dialect == Dialect::Sqlite && first == "pragma" {
        screen_sqlite_pragma(&statement)?;
    }
    let refused = match dialect {
        Dialect::Postgres => POSTGRES_REFUSED_FUNCTIONS,
        Dialect::Sqlite => SQLITE_REFUSED_FUNCTIONS,
    };
    for pair in statement.windows(2) {
        if let (Token::Word(name), Token::OpenParen) = (pair[0], pair[1]) {
            if matches_any(name, refused) {
                return Err(Refusal::Function { name: name.clone() });
            }
        }
    }
    Ok(())
}

fn allowed_text(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "SELECT, WITH, VALUES, TABLE, EXPLAIN and SHOW",
        Dialect::Sqlite => "SELECT, WITH, VALUES, EXPLAIN and introspection PRAGMAs",
    }
}

/// `PRAGMA [schema.]name [= value | (value)]`: the name must be allowlisted, and a value is only
/// accepted by pragmas whose value is a table or index name.
fn screen_sqlite_pragma(statement: &[&Token]) -> Result<(), Refusal> {
    let rest = &statement[1..];
    let (name, after) = match rest {
        [Token::Word(_schema), Token::Other('.'), Token::Word(name), after @ ..] => (name, after),
        [Token::Word(name), after @ ..] => (name, after),
        _ => return Err(Refusal::Pragma { name: "?".into() }),
    };
    let has_value = !after.is_empty();
    let allowed = if has_value {
        SQLITE_PRAGMAS_WITH_ARGUMENT.contains(&name.as_str())
    } else {
        sqlite_pragma_allowed(name, None)
    };
    if allowed {
        Ok(())
    } else {
        Err(Refusal::Pragma { name: name.clone() })
    }
}

fn matches_any(name: &str, patterns: &[&str]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *p,
    })
}

/// Splits `sql` into significant tokens, following `dialect`'s quoting and comment rules.
fn tokenize(sql: &str, dialect: Dialect) -> Result<Vec<Token>, Refusal> {
    tokenize_with_ends(sql, dialect).map(|(tokens, _)| tokens)
}

/// The statement of `sql` without what trails its last significant token (`;`, comments,
/// whitespace), so it can be wrapped in a subquery. `sql` must have passed [`screen`].
pub fn statement_text(sql: &str, dialect: Dialect) -> Result<&str, Refusal> {
    let (tokens, ends) = tokenize_with_ends(sql, dialect)?;
    let last = tokens
        .iter()
        .zip(&ends)
        .rev()
        .find(|(t, _)| **t != Token::Semicolon)
        .map(|(_, end)| *end)
        .ok_or(Refusal::Empty)?;
    let byte = sql.char_indices().nth(last).map_or(sql.len(), |(b, _)| b);
    Ok(&sql[..byte])
}

/// The first keyword of `sql`, lowercased (after any opening parentheses), if it has one.
pub fn first_keyword(sql: &str, dialect: Dialect) -> Option<String> {
    let tokens = tokenize(sql, dialect).ok()?;
    tokens.into_iter().find_map(|t| match t {
        Token::OpenParen => None,
        Token::Word(w) => Some(Some(w)),
        _ => Some(None),
    })?
}

/// [`tokenize`], with the char index where each token ends.
fn tokenize_with_ends(sql: &str, dialect: Dialect) -> Result<(Vec<Token>, Vec<usize>), Refusal> {
    let chars: Vec<char> = sql.chars().collect();
    let mut tokens = Vec::new();
    let mut ends = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let before = tokens.len();
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&chars, i, dialect)?;
        } else if c == '\'' {
            i = skip_quoted(&chars, i, '\'', false)?;
            tokens.push(Token::Literal);
        } else if dialect == Dialect::Postgres
            && (c == 'e' || c == 'E')
            && next == Some('\'')
            && !previous_is_word_char(&chars, i)
        {
            i = skip_quoted(&chars, i + 1, '\'', true)?;
            tokens.push(Token::Literal);
        } else if c == '"' {
            let (word, end) = read_quoted_identifier(&chars, i, '"')?;
            tokens.push(Token::Word(word.to_lowercase()));
            i = end;
        } else if dialect == Dialect::Sqlite && (c == '`' || c == '[') {
            let close = if c == '[' { ']' } else { '`' };
            let (word, end) = read_quoted_identifier(&chars, i, close)?;
            tokens.push(Token::Word(word.to_lowercase()));
            i = end;
        } else if dialect == Dialect::Postgres && c == '$' {
            match dollar_tag(&chars, i) {
                Some(tag) => {
                    i = skip_dollar_quoted(&chars, i, &tag)?;
                    tokens.push(Token::Literal);
                }
                None => {
                    // A positional parameter such as `$1`.
                    i += 1;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                    tokens.push(Token::Other('$'));
                }
            }
        } else if dialect == Dialect::Postgres
            && (c == 'u' || c == 'U')
            && next == Some('&')
            && chars.get(i + 2) == Some(&'"')
            && !previous_is_word_char(&chars, i)
        {
            // U&"\0070g_advisory_lock": screen the name the server will see.
            let (raw, end) = read_quoted_identifier(&chars, i + 2, '"')?;
            let (escape, end) = uescape_clause(&chars, end)?;
            let word = unicode_ident::decode(&raw, escape).ok_or(Refusal::BadUnicodeEscape)?;
            tokens.push(Token::Word(word.to_lowercase()));
            i = end;
        } else if is_word_start(c) {
            let start = i;
            while i < chars.len() && is_word_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            tokens.push(Token::Word(word.to_lowercase()));
        } else if c.is_ascii_digit() {
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                i += 1;
            }
            tokens.push(Token::Other('0'));
        } else {
            tokens.push(match c {
                ';' => Token::Semicolon,
                '(' => Token::OpenParen,
                other => Token::Other(other),
            });
            i += 1;
        }
        if tokens.len() > before {
            ends.push(i);
        }
    }
    Ok((tokens, ends))
}

/// After a `U&"…"` ending at `end`: an optional `UESCAPE 'c'` (whitespace and comments
/// allowed around it). Returns the escape character and where the clause ends.
fn uescape_clause(chars: &[char], end: usize) -> Result<(char, usize), Refusal> {
    let skip = |mut i: usize| -> Result<usize, Refusal> {
        loop {
            match (chars.get(i), chars.get(i + 1)) {
                (Some(c), _) if c.is_whitespace() => i += 1,
                (Some('-'), Some('-')) => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                }
                (Some('/'), Some('*')) => i = skip_block_comment(chars, i, Dialect::Postgres)?,
                _ => return Ok(i),
            }
        }
    };
    let i = skip(end)?;
    let word: String = chars.iter().skip(i).take(7).collect();
    if !word.eq_ignore_ascii_case("uescape") || chars.get(i + 7).is_some_and(|c| is_word_char(*c)) {
        return Ok(('\\', end));
    }
    let j = skip(i + 7)?;
    match (chars.get(j), chars.get(j + 1), chars.get(j + 2)) {
        (Some('\''), Some(&e), Some('\'')) if unicode_ident::valid_escape(e) => Ok((e, j + 3)),
        _ => Err(Refusal::BadUnicodeEscape),
    }
}

fn is_word_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

fn previous_is_word_char(chars: &[char], i: usize) -> bool {
    i > 0 && is_word_char(chars[i - 1])
}

/// Skips `/* … */` starting at `start`; Postgres comments nest, SQLite ones do not.
fn skip_block_comment(chars: &[char], start: usize, dialect: Dialect) -> Result<usize, Refusal> {
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        if chars[i] == '/'
            && chars.get(i + 1) == Some(&'*')
            && (depth == 0 || dialect == Dialect::Postgres)
        {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Ok(i);
            }
        } else {
            i += 1;
        }
    }
    Err(Refusal::Unterminated {
        what: "block comment",
    })
}

/// Skips a quoted literal starting at the opening quote; a doubled quote is an escaped quote,
/// and with `backslash` a backslash escapes the next char (Postgres `E'…'`).
fn skip_quoted(
    chars: &[char],
    start: usize,
    quote: char,
    backslash: bool,
) -> Result<usize, Refusal> {
    let mut i = start + 1;
    while i < chars.len() {
        if backslash && chars[i] == '\\' {
            i += 2;
        } else if chars[i] == quote {
            if chars.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return Ok(i + 1);
            }
        } else {
            i += 1;
        }
    }
    Err(Refusal::Unterminated { what: "string" })
}

fn read_quoted_identifier(
    chars: &[char],
    start: usize,
    close: char,
) -> Result<(String, usize), Refusal> {
    let mut word = String::new();
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == close {
            if close != ']' && chars.get(i + 1) == Some(&close) {
                word.push(close);
                i += 2;
            } else {
                return Ok((word, i + 1));
            }
        } else {
            word.push(chars[i]);
            i += 1;
        }
    }
    Err(Refusal::Unterminated {
        what: "quoted identifier",
    })
}

/// The tag of a Postgres dollar quote (`$$` or `$tag$`) starting at `start`, if it is one.
fn dollar_tag(chars: &[char], start: usize) -> Option<String> {
    if previous_is_word_char(chars, start) {
        return None;
    }
    let mut i = start + 1;
    let mut tag = String::from("$");
    if chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
        return None;
    }
    while i < chars.len() {
        let c = chars[i];
        if c == '$' {
            tag.push('$');
            return Some(tag);
        }
        if !(c.is_alphanumeric() || c == '_') {
            return None;
        }
        tag.push(c);
        i += 1;
    }
    None
}

fn skip_dollar_quoted(chars: &[char], start: usize, tag: &str) -> Result<usize, Refusal> {
    let tag: Vec<char> = tag.chars().collect();
    let mut i = start + tag.len();
    while i + tag.len() <= chars.len() {
        if chars[i..i + tag.len()] == tag[..] {
            return Ok(i + tag.len());
        }
        i += 1;
    }
    Err(Refusal::Unterminated {
        what: "dollar-quoted string",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn check(dialect: Dialect, sql: &str, expected: Result<(), Refusal>) {
        assert_eq!(screen(sql, dialect), expected, "sql: {sql:?}");
    }

    fn refused_keyword(keyword: &str, dialect: Dialect) -> Result<(), Refusal> {
        Err(Refusal::NotReadOnly {
            keyword: keyword.into(),
            allowed: allowed_text(dialect),
        })
    }

    fn session(keyword: &str) -> Result<(), Refusal> {
        Err(Refusal::SessionControl {
            keyword: keyword.into(),
        })
    }

    fn function(name: &str) -> Result<(), Refusal> {
        Err(Refusal::Function { name: name.into() })
    }

    #[test]
    fn postgres_reads_pass() {
        let pg = Dialect::Postgres;
        for sql in [
            "SELECT 1",
            "select * from items;",
            "  -- a comment\n SELECT 1 ; -- trailing comment",
            "(SELECT 1) UNION (SELECT 2)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1), (2)",
            "TABLE items",
            "EXPLAIN SELECT 1",
            "SHOW statement_timeout",
            "SELECT 'a; DROP TABLE items'",
            "SELECT $$ ; DROP TABLE items $$",
            "SELECT $tag$ it's ; $$ DROP $tag$",
            "SELECT E'\\'; DROP TABLE items; --'",
            "SELECT \"weird;name\" FROM items",
            "/* outer /* nested */ still comment; DROP */ SELECT 1",
            "SELECT pg_sleep(5)",
            "SELECT setting FROM pg_settings WHERE name = 'set_config'",
            "SELECT $1::int",
        ] {
            check(pg, sql, Ok(()));
        }
    }

    #[test]
    fn postgres_bypasses_are_refused() {
        let pg = Dialect::Postgres;
        check(
            pg,
            "COMMIT; DROP TABLE items",
            Err(Refusal::MultipleStatements),
        );
        check(pg, "COMMIT", session("COMMIT"));
        check(
            pg,
            "SELECT 1; DROP TABLE items",
            Err(Refusal::MultipleStatements),
        );
        check(
            pg,
            "SELECT 1; END; INSERT INTO items VALUES (1)",
            Err(Refusal::MultipleStatements),
        );
        check(
            pg,
            "END; INSERT INTO items VALUES (1)",
            Err(Refusal::MultipleStatements),
        );
        check(pg, "END", session("END"));
        check(
            pg,
            "/* harmless */ DELETE FROM items",
            refused_keyword("DELETE", pg),
        );
        check(
            pg,
            "-- just a read\nUPDATE items SET name = 'x'",
            refused_keyword("UPDATE", pg),
        );
        check(pg, "SET TRANSACTION READ WRITE", session("SET"));
        check(pg, "SET statement_timeout = 0", session("SET"));
        check(pg, "RESET statement_timeout", session("RESET"));
        check(pg, "BEGIN READ WRITE", session("BEGIN"));
        check(
            pg,
            "DO $$ BEGIN DELETE FROM items; END $$",
            refused_keyword("DO", pg),
        );
        check(pg, "COPY items TO '/tmp/x'", refused_keyword("COPY", pg));
        check(
            pg,
            "SELECT set_config('default_transaction_read_only', 'off', false)",
            function("set_config"),
        );
        check(
            pg,
            "SELECT pg_catalog.set_config('statement_timeout', '0', true)",
            function("set_config"),
        );
        check(
            pg,
            "SELECT \"set_config\" /* gap */ ('statement_timeout', '0', true)",
            function("set_config"),
        );
        check(pg, "SELECT nextval('items_id_seq')", function("nextval"));
        check(
            pg,
            "SELECT dblink_exec('dbname=x', 'DELETE FROM items')",
            function("dblink_exec"),
        );
        check(
            pg,
            "SELECT pg_terminate_backend(1)",
            function("pg_terminate_backend"),
        );
        check(pg, "SELECT lo_import('/etc/passwd')", function("lo_import"));
        // Quoted and Unicode identifiers are decoded before they are judged.
        check(
            pg,
            r#"SELECT U&"\0070g_advisory_lock"(1)"#,
            function("pg_advisory_lock"),
        );
        check(
            pg,
            r#"SELECT u&"\+000070g_terminate_backend" (1)"#,
            function("pg_terminate_backend"),
        );
        check(
            pg,
            r#"SELECT U&"!0070g_advisory_lock" UESCAPE '!' (1)"#,
            function("pg_advisory_lock"),
        );
        check(
            pg,
            r#"SELECT U&"!0070g_try_advisory_lock" /* c */ uescape /* c */ '!'(1)"#,
            function("pg_try_advisory_lock"),
        );
        check(
            pg,
            r#"SELECT pg_catalog."pg_advisory_lock"(1)"#,
            function("pg_advisory_lock"),
        );
        check(
            pg,
            r#"SELECT "PG_CANCEL_BACKEND"(1)"#,
            function("pg_cancel_backend"),
        );
        check(pg, r#"SELECT U&"d\0062link"('x', 'y')"#, function("dblink"));
        check(pg, "SELECT pg_reload_conf()", function("pg_reload_conf"));
        check(
            pg,
            "SELECT * FROM dblink('dbname=x', 'select 1') AS t(a int)",
            function("dblink"),
        );
        check(
            pg,
            r#"SELECT U&"\00zzpg"(1)"#,
            Err(Refusal::BadUnicodeEscape),
        );
        check(
            pg,
            r#"SELECT U&"x" UESCAPE '+'"#,
            Err(Refusal::BadUnicodeEscape),
        );
        check(
            pg,
            "SELECT 1 /* unterminated",
            Err(Refusal::Unterminated {
                what: "block comment",
            }),
        );
        check(
            pg,
            "SELECT 'unterminated",
            Err(Refusal::Unterminated { what: "string" }),
        );
        check(
            pg,
            "/* a /* b */ SELECT 1",
            Err(Refusal::Unterminated {
                what: "block comment",
            }),
        );
        check(pg, "  ; ", Err(Refusal::Empty));
        check(pg, "", Err(Refusal::Empty));
    }

    #[test]
    fn sqlite_reads_pass() {
        let lite = Dialect::Sqlite;
        for sql in [
            "SELECT * FROM items",
            "select [weird;name] from `x`",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            "PRAGMA table_info(items)",
            "PRAGMA main.index_list('items')",
            "PRAGMA user_version",
            "EXPLAIN QUERY PLAN SELECT * FROM items",
            "SELECT * FROM pragma_table_info('items')",
        ] {
            check(lite, sql, Ok(()));
        }
    }

    #[test]
    fn sqlite_bypasses_are_refused() {
        let lite = Dialect::Sqlite;
        check(
            lite,
            "SELECT 1; DROP TABLE items",
            Err(Refusal::MultipleStatements),
        );
        // SQLite block comments do not nest: the DROP after the first `*/` is code.
        check(
            lite,
            "/* /* */ DROP TABLE items /* */",
            refused_keyword("DROP", lite),
        );
        check(
            lite,
            "ATTACH DATABASE '/tmp/x.db' AS x",
            refused_keyword("ATTACH", lite),
        );
        check(
            lite,
            "DETACH DATABASE main",
            refused_keyword("DETACH", lite),
        );
        check(
            lite,
            "VACUUM INTO '/tmp/copy.db'",
            refused_keyword("VACUUM", lite),
        );
        check(
            lite,
            "SELECT load_extension('/tmp/evil.so')",
            function("load_extension"),
        );
        check(
            lite,
            "PRAGMA query_only = 0",
            Err(Refusal::Pragma {
                name: "query_only".into(),
            }),
        );
        check(
            lite,
            "PRAGMA query_only = OFF",
            Err(Refusal::Pragma {
                name: "query_only".into(),
            }),
        );
        check(
            lite,
            "PRAGMA writable_schema = 1",
            Err(Refusal::Pragma {
                name: "writable_schema".into(),
            }),
        );
        check(
            lite,
            "PRAGMA journal_mode = DELETE",
            Err(Refusal::Pragma {
                name: "journal_mode".into(),
            }),
        );
        check(
            lite,
            "INSERT INTO items VALUES (1)",
            refused_keyword("INSERT", lite),
        );
        check(
            lite,
            "REPLACE INTO items VALUES (1)",
            refused_keyword("REPLACE", lite),
        );
        check(
            lite,
            "BEGIN; DELETE FROM items; COMMIT",
            Err(Refusal::MultipleStatements),
        );
    }

    #[test]
    fn pragma_allowlist() {
        let cases = [
            ("table_info", Some("items"), true),
            ("TABLE_INFO", Some("items"), true),
            ("user_version", None, true),
            ("user_version", Some("7"), false),
            ("query_only", Some("0"), false),
            ("writable_schema", None, false),
            ("cache_size", None, false),
        ];
        for (name, value, expected) in cases {
            assert_eq!(
                sqlite_pragma_allowed(name, value),
                expected,
                "pragma {name} = {value:?}"
            );
        }
    }
}
