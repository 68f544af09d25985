//! Property-based fuzzing of the sql screen: it never panics on any text in either dialect,
//! and a refused function is refused however its name is written (any case inside quotes,
//! `U&"…"` escapes with the default or a custom `UESCAPE`, a schema prefix, comments before the
//! parenthesis). Bounded for CI (64 cases unless `PROPTEST_CASES`); failures are kept under
//! `proptest-regressions/`.

use proptest::prelude::*;

use super::guard::{screen, Dialect, Refusal};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

const REFUSED: &[&str] = &[
    "pg_advisory_lock",
    "pg_try_advisory_xact_lock",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "dblink",
    "dblink_exec",
    "set_config",
    "lo_import",
];

/// `name` written with a mix of plain and escaped characters.
fn spelled(name: &'static str) -> impl Strategy<Value = String> {
    (
        prop::collection::vec(0u8..4, name.len()),
        prop_oneof![Just('\\'), Just('!'), Just('#')],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(how, esc, schema, comment)| {
            let mut body = String::new();
            for (c, h) in name.chars().zip(how) {
                match h {
                    0 => body.push(c),
                    1 => body.push_str(&format!("{esc}{:04X}", c as u32)),
                    2 => body.push_str(&format!("{esc}+{:06x}", c as u32)),
                    _ => body.push(c),
                }
            }
            let uescape = if esc == '\\' {
                String::new()
            } else {
                format!(" UESCAPE '{esc}'")
            };
            let prefix = if schema { "pg_catalog." } else { "" };
            let gap = if comment { " /* x */ " } else { "" };
            format!("SELECT {prefix}U&\"{body}\"{uescape}{gap}(1)")
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_screen_never_panics(sql in any::<String>()) {
        let _ = screen(&sql, Dialect::Postgres);
        let _ = screen(&sql, Dialect::Sqlite);
    }

    #[test]
    fn a_refused_function_is_refused_however_it_is_spelled(
        sql in prop::sample::select(REFUSED).prop_flat_map(spelled)
    ) {
        let refused = matches!(screen(&sql, Dialect::Postgres), Err(Refusal::Function { .. }));
        prop_assert!(refused, "not refused: {sql}");
    }
}
