//! Tables for people: plain columns (no borders) so `grep`, `awk` and `cut` work on piped
//! output; on a terminal, cells are cut with `…` to fit its width, except the columns that
//! hold ids or names, which are never cut or wrapped.

use std::fmt;
use std::io::IsTerminal;

/// Space between columns.
const GAP: usize = 2;
/// A cut column keeps at least this many characters.
const MIN_CUT: usize = 6;

/// A table of text cells with a header row.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Columns never cut (ids and names); the first column always is.
    keep: Vec<bool>,
    /// Terminal width to fit, `None` when stdout is not a terminal.
    width: Option<usize>,
}

/// A new table; on a terminal it fits the terminal's width.
pub fn table(header: &[&str]) -> Table {
    let width = if std::io::stdout().is_terminal() {
        Some(terminal_width())
    } else {
        None
    };
    Table::new(header, width)
}

impl Table {
    pub fn new(header: &[&str], width: Option<usize>) -> Table {
        let keep = (0..header.len()).map(|i| i == 0).collect();
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            keep,
            width,
        }
    }

    /// Marks the columns with these headers as never cut (ids, names).
    pub fn keep(mut self, headers: &[&str]) -> Table {
        for (i, h) in self.header.iter().enumerate() {
            if headers.contains(&h.as_str()) {
                self.keep[i] = true;
            }
        }
        self
    }

    /// Adds a row; a cell's line breaks become `; ` (one line per row), its other control and
    /// format characters escapes.
    pub fn add_row(&mut self, cells: Vec<String>) -> &mut Table {
        let mut cells: Vec<String> = cells
            .into_iter()
            .map(|c| {
                let joined = c
                    .lines()
                    .map(str::trim_end)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; ");
                // A cell's control characters (from a model, a tool, another user) are shown
                // as escapes.
                agen_shared::text::escape_controls(&joined, false).into_owned()
            })
            .collect();
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
        self
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        if let Some(limit) = self.width {
            let total = |w: &[usize]| w.iter().sum::<usize>() + GAP * w.len().saturating_sub(1);
            while total(&w) > limit {
                // Cut the widest column that may be cut, one character at a time.
                let floor = |i: usize| self.header[i].chars().count().max(MIN_CUT);
                let pick = (0..w.len())
                    .filter(|&i| !self.keep[i] && w[i] > floor(i))
                    .max_by_key(|&i| w[i]);
                match pick {
                    Some(i) => w[i] -= 1,
                    None => break,
                }
            }
        }
        w
    }
}

fn fit(cell: &str, width: usize) -> String {
    if cell.chars().count() <= width {
        return cell.to_string();
    }
    let mut s: String = cell.chars().take(width.saturating_sub(1)).collect();
    s.push('…');
    s
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.widths();
        let mut lines = Vec::with_capacity(self.rows.len() + 1);
        for row in std::iter::once(&self.header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                let cell = fit(cell, w[i]);
                line.push_str(&cell);
                if i + 1 < row.len() {
                    let pad = w[i] - cell.chars().count() + GAP;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            lines.push(line.trim_end().to_string());
        }
        f.write_str(&lines.join("\n"))
    }
}

/// The terminal's width: `COLUMNS`, else the size of the terminal on stdout, else 100.
fn terminal_width() -> usize {
    if let Some(c) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return c;
    }
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we pass; fd 1 is ours.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        ws.ws_col as usize
    } else {
        100
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn sample(width: Option<usize>) -> Table {
        let mut t = Table::new(&["TASK", "STATE", "RESULT"], width);
        t.add_row(vec![
            "t-0123456789abcdef".into(),
            "succeeded".into(),
            "a long answer that goes on and on".into(),
        ]);
        t.add_row(vec![
            "t-2".into(),
            "failed".into(),
            "line one\nline two".into(),
        ]);
        t
    }

    #[test]
    fn piped_tables_are_plain_columns_without_borders() {
        assert_eq!(
            sample(None).to_string(),
            "TASK                STATE      RESULT\n\
             t-0123456789abcdef  succeeded  a long answer that goes on and on\n\
             t-2                 failed     line one; line two"
        );
    }

    #[test]
    fn on_a_narrow_terminal_cells_are_cut_but_ids_never_are() {
        let text = sample(Some(40)).to_string();
        for line in text.lines() {
            assert!(line.chars().count() <= 40, "{line:?} is wider than 40");
        }
        assert!(text.contains("t-0123456789abcdef"), "{text}");
        assert!(text.contains('…'), "{text}");
        // Too narrow for anything but the id: the id still stands whole.
        let text = sample(Some(10)).to_string();
        assert!(text.contains("t-0123456789abcdef"), "{text}");
    }
}
