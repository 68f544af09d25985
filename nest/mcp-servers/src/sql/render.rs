//! What the sql tools return, as text the model reads: table lists, column lists and query rows
//! (JSON lines, one object per row), with long cells and large results cut.
//!
//! Invariants: no cell in the output is longer than [`MAX_CELL_CHARS`] characters of its text; a
//! query's output never exceeds [`MAX_OUTPUT_CHARS`] characters of rows; every cut says so and
//! tells the model how to narrow the query.

use serde_json::{Map, Value};

/// Cells longer than this many characters are cut.
pub const MAX_CELL_CHARS: usize = 1_000;
/// Rows stop being added once the output reaches this many characters.
pub const MAX_OUTPUT_CHARS: usize = 100_000;
/// Rows returned when the call gives no `limit`.
pub const DEFAULT_ROW_LIMIT: usize = 100;
/// `tables` lists at most this many tables and views.
pub const MAX_TABLES: usize = 1_000;
/// The largest `limit` a call may ask for.
pub const MAX_ROW_LIMIT: usize = 1_000;

/// A table or view the database has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// The schema (Postgres) or attached database (SQLite); `None` when it is the default.
    pub schema: Option<String>,
    pub name: String,
    /// `table`, `view`, `materialized view`, `foreign table`, …
    pub kind: String,
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    pub name: String,
    pub data_type: String,
    pub nullable: bool,
}

/// The rows a query produced, up to the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryRows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    /// The query produced more rows than `rows` holds.
    pub more: bool,
}

/// The row limit for a call: the default when absent, at most [`MAX_ROW_LIMIT`].
pub fn row_limit(requested: Option<u64>) -> Result<(usize, Option<String>), String> {
    match requested {
        None => Ok((DEFAULT_ROW_LIMIT, None)),
        Some(0) => Err(format!(
            "`limit` must be between 1 and {MAX_ROW_LIMIT}; got 0"
        )),
        Some(n) if n > MAX_ROW_LIMIT as u64 => Ok((
            MAX_ROW_LIMIT,
            Some(format!(
                "`limit` {n} is above the maximum; returning at most {MAX_ROW_LIMIT} rows."
            )),
        )),
        Some(n) => Ok((n as usize, None)),
    }
}

/// Cuts a text cell to [`MAX_CELL_CHARS`] characters, saying how long it was.
pub fn cut_text(text: &str) -> (String, bool) {
    match text.char_indices().nth(MAX_CELL_CHARS) {
        None => (text.to_owned(), false),
        Some((byte, _)) => {
            let total = text.chars().count();
            (
                format!("{}… [cut: {total} characters]", &text[..byte]),
                true,
            )
        }
    }
}

/// Cuts one cell: strings by their length, arrays and objects by the length of their JSON.
fn cut_cell(value: Value) -> (Value, bool) {
    match value {
        Value::String(s) => {
            let (s, cut) = cut_text(&s);
            (Value::String(s), cut)
        }
        Value::Array(_) | Value::Object(_) => {
            let text = value.to_string();
            if text.chars().count() > MAX_CELL_CHARS {
                let (s, _) = cut_text(&text);
                (Value::String(s), true)
            } else {
                (value, false)
            }
        }
        other => (other, false),
    }
}

/// Keys for the row objects: column names, with repeats made unique (`id`, `id#2`).
fn row_keys(columns: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::with_capacity(columns.len());
    for column in columns {
        let mut key = if column.is_empty() {
            "?column?".to_owned()
        } else {
            column.clone()
        };
        let mut n = 2;
        while keys.contains(&key) {
            key = format!("{column}#{n}");
            n += 1;
        }
        keys.push(key);
    }
    keys
}

/// The text of a `query` result: one JSON object per row, then a summary line and any notes.
pub fn render_rows(result: QueryRows, limit: usize, limit_note: Option<String>) -> String {
    let keys = row_keys(&result.columns);
    let mut out = String::new();
    let mut shown = 0usize;
    let mut cells_cut = false;
    let mut size_cut = false;
    for row in result.rows {
        let mut object = Map::new();
        for (key, value) in keys.iter().zip(row) {
            let (value, cut) = cut_cell(value);
            cells_cut |= cut;
            object.insert(key.clone(), value);
        }
        let line = Value::Object(object).to_string();
        if out.len() + line.len() > MAX_OUTPUT_CHARS && shown > 0 {
            size_cut = true;
            break;
        }
        out.push_str(&line);
        out.push('\n');
        shown += 1;
    }
    let columns = if keys.is_empty() {
        "(none)".to_owned()
    } else {
        keys.join(", ")
    };
    if shown == 0 {
        out.push_str(&format!("(no rows; columns: {columns})\n"));
    } else {
        let noun = if shown == 1 { "row" } else { "rows" };
        let more = if result.more || size_cut {
            "; the query returned more"
        } else {
            ""
        };
        out.push_str(&format!("({shown} {noun}{more}; columns: {columns})\n"));
    }
    if let Some(note) = limit_note {
        out.push_str(&note);
        out.push('\n');
    }
    if size_cut {
        out.push_str(&format!(
            "Output cut at {MAX_OUTPUT_CHARS} characters after {shown} rows. Narrow the query: select fewer \
             columns, add a WHERE clause, or aggregate.\n"
        ));
    } else if result.more {
        out.push_str(&format!(
            "Cut at the row limit ({limit}). Narrow the query (WHERE, aggregates, ORDER BY with LIMIT/OFFSET) \
             or pass a larger `limit` (at most {MAX_ROW_LIMIT}).\n"
        ));
    }
    if cells_cut {
        out.push_str(&format!(
            "Some cells were longer than {MAX_CELL_CHARS} characters and were cut. Select a part of them \
             (substr/left) if you need more.\n"
        ));
    }
    out
}

/// The text of a `tables` result: one `name (kind)` per line.
pub fn render_tables(tables: &[TableInfo]) -> String {
    if tables.is_empty() {
        return "(no tables or views)\n".to_owned();
    }
    let mut out = String::new();
    for table in tables.iter().take(MAX_TABLES) {
        match &table.schema {
            Some(schema) => out.push_str(&format!("{schema}.{} ({})\n", table.name, table.kind)),
            None => out.push_str(&format!("{} ({})\n", table.name, table.kind)),
        }
    }
    if tables.len() > MAX_TABLES {
        out.push_str(&format!(
            "Cut at {MAX_TABLES} of {} tables and views. Use `query` on the catalog (information_schema.tables, \
             sqlite_schema) with a WHERE clause to find the rest.\n",
            tables.len()
        ));
    }
    out
}

/// The text of a `describe` result: the table, then `name type null|not null` per column.
pub fn render_columns(table: &str, columns: &[ColumnInfo]) -> String {
    let name_width = columns
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0);
    let type_width = columns
        .iter()
        .map(|c| c.data_type.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = format!("{table}: {} columns\n", columns.len());
    for column in columns {
        let nullable = if column.nullable { "null" } else { "not null" };
        out.push_str(&format!(
            "{:name_width$}  {:type_width$}  {nullable}\n",
            column.name, column.data_type
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn cells_are_cut_at_a_thousand_characters() {
        let check = |input: &str, expected: &str, expected_cut: bool| {
            assert_eq!(cut_text(input), (expected.to_owned(), expected_cut));
        };
        check("short", "short", false);
        check(&"a".repeat(1000), &"a".repeat(1000), false);
        check(
            &"a".repeat(1001),
            &format!("{}… [cut: 1001 characters]", "a".repeat(1000)),
            true,
        );
        // Characters, not bytes: a multi-byte text is cut on a char boundary.
        check(
            &"é".repeat(1500),
            &format!("{}… [cut: 1500 characters]", "é".repeat(1000)),
            true,
        );
    }

    #[test]
    fn long_json_cells_become_cut_text() {
        let long = json!(vec!["x"; 400]);
        let (value, cut) = cut_cell(long);
        assert!(cut);
        assert!(value
            .as_str()
            .is_some_and(|s| s.ends_with("[cut: 1601 characters]")));
        assert_eq!(cut_cell(json!([1, 2])), (json!([1, 2]), false));
        assert_eq!(cut_cell(json!(5)), (json!(5), false));
    }

    #[test]
    fn row_limits() {
        assert_eq!(row_limit(None), Ok((100, None)));
        assert_eq!(row_limit(Some(5)), Ok((5, None)));
        assert_eq!(row_limit(Some(1000)), Ok((1000, None)));
        assert!(matches!(row_limit(Some(1001)), Ok((1000, Some(_)))));
        assert!(row_limit(Some(0)).is_err());
    }

    #[test]
    fn rows_render_as_json_lines_with_a_summary() {
        let rows = QueryRows {
            columns: vec!["id".into(), "name".into(), "id".into()],
            rows: vec![
                vec![json!(1), json!("a"), json!(10)],
                vec![json!(2), Value::Null, json!(20)],
            ],
            more: true,
        };
        assert_eq!(
            render_rows(rows, 2, None),
            "{\"id\":1,\"name\":\"a\",\"id#2\":10}\n\
             {\"id\":2,\"name\":null,\"id#2\":20}\n\
             (2 rows; the query returned more; columns: id, name, id#2)\n\
             Cut at the row limit (2). Narrow the query (WHERE, aggregates, ORDER BY with LIMIT/OFFSET) \
             or pass a larger `limit` (at most 1000).\n"
        );
    }

    #[test]
    fn empty_results_name_their_columns() {
        let rows = QueryRows {
            columns: vec!["id".into()],
            rows: vec![],
            more: false,
        };
        assert_eq!(render_rows(rows, 100, None), "(no rows; columns: id)\n");
    }

    #[test]
    fn huge_results_are_cut_by_size() {
        let cell = "y".repeat(900);
        let rows = QueryRows {
            columns: vec!["a".into(), "b".into()],
            rows: (0..200).map(|_| vec![json!(cell), json!(cell)]).collect(),
            more: false,
        };
        let text = render_rows(rows, 1000, None);
        assert!(text.len() < MAX_OUTPUT_CHARS + 1_000, "{}", text.len());
        assert!(text.contains("Output cut at 100000 characters"));
        assert!(text.contains("the query returned more"));
    }

    #[test]
    fn long_table_lists_are_cut() {
        let tables: Vec<TableInfo> = (0..1500)
            .map(|i| TableInfo {
                schema: None,
                name: format!("t{i}"),
                kind: "table".into(),
            })
            .collect();
        let text = render_tables(&tables);
        assert_eq!(text.lines().count(), MAX_TABLES + 1);
        assert!(
            text.ends_with("with a WHERE clause to find the rest.\n"),
            "{text}"
        );
    }

    #[test]
    fn columns_render_as_an_aligned_list() {
        let columns = vec![
            ColumnInfo {
                name: "id".into(),
                data_type: "integer".into(),
                nullable: false,
            },
            ColumnInfo {
                name: "label".into(),
                data_type: "text".into(),
                nullable: true,
            },
        ];
        assert_eq!(
            render_columns("public.items", &columns),
            "public.items: 2 columns\nid     integer  not null\nlabel  text     null\n"
        );
    }
}
