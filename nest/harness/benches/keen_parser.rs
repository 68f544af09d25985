//! Criterion benchmarks of the Keen `<SYSTEM CALL>` parser (`keen::parser::parse_reply`), the
//! per-turn cost of the Keen dialect: a short call, a plain short answer, long narration with a
//! block at the end, a large multi-line context, and malformed blocks (unterminated, fenced,
//! commentary inside), each reported in bytes/s of reply text.
//!
//! Invariants: runs only under `cargo bench`; each input is checked once before it is timed, so
//! a parser change that alters the outcome fails the bench instead of timing the wrong path.

use std::time::Duration;

use agen_harness::keen::parser::{parse_reply, Mistake, ParsedReply};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// What a case must parse to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    NoCall,
    Call,
    Malformed,
}

fn block(tool: &str, context: &str) -> String {
    format!(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\n{tool}\n!*context\n{context}\n</SYSTEM CALL>\n"
    )
}

fn narration(bytes: usize) -> String {
    let para = "I looked at the repository layout first. The tests live in tests/e2e and the \
                harness starts real binaries, so I will read the harness before changing it.\n\n";
    para.repeat(bytes / para.len() + 1)
}

fn cases() -> Vec<(&'static str, String, Expect)> {
    let short_call = format!(
        "Let me check the time.\n{}",
        block("ToolTimestamp", "{\"zone\": \"UTC\"}")
    );
    let long_then_call = format!(
        "{}{}",
        narration(16 * 1024),
        block("ws_read", "{\"path\": \"src/main.rs\"}")
    );
    let big_context = block(
        "ws_write",
        &"fn main() { println!(\"hi\"); }\n".repeat(1000),
    );
    let unterminated = format!(
        "{}<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nws_read\n!*context\n{{}}\n",
        narration(4 * 1024)
    );
    let fenced = format!("Here is the call:\n```\n{}```\n", block("ws_read", "{}"));
    let commentary =
        "<SYSTEM CALL>\n!*action\nuse tool\nI think this is right\n!*tool\nws_read\n!*context\n{}\n</SYSTEM CALL>\n"
            .to_string();
    vec![
        (
            "short_answer",
            "The answer is 42.".to_string(),
            Expect::NoCall,
        ),
        ("short_call", short_call, Expect::Call),
        (
            "long_narration_16KiB_then_call",
            long_then_call,
            Expect::Call,
        ),
        ("long_answer_16KiB", narration(16 * 1024), Expect::NoCall),
        ("call_with_30KiB_context", big_context, Expect::Call),
        (
            "malformed_unterminated_4KiB",
            unterminated,
            Expect::Malformed,
        ),
        ("malformed_fenced", fenced, Expect::Malformed),
        ("malformed_commentary", commentary, Expect::Malformed),
    ]
}

fn outcome(parsed: &ParsedReply) -> Expect {
    match parsed {
        ParsedReply::NoCall => Expect::NoCall,
        ParsedReply::Call(_) => Expect::Call,
        ParsedReply::Malformed { mistake, .. } => {
            // Name the mistake so an unexpected kind shows in the panic message.
            let _: &Mistake = mistake;
            Expect::Malformed
        }
    }
}

fn parser_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("keen_parse_reply");
    for (name, text, expect) in cases() {
        let parsed = parse_reply(&text);
        assert_eq!(outcome(&parsed), expect, "case {name} parsed as {parsed:?}");
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), &text, |b, text| {
            b.iter(|| parse_reply(std::hint::black_box(text)))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = parser_benches
}
criterion_main!(benches);
