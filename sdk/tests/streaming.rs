//! An embedded agent's answer as it streams: `run_stream(…).with_deltas()` yields the model's
//! text in pieces between the run events (before the turn's `model.answered`), for the
//! OpenAI-compatible and the Anthropic provider, and the pieces add up to the answer; a plain
//! `run_stream` yields the events alone.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use agen::{Agent, RunEventBody, RunItem};
use agen_fake_model::{FakeModel, Script, Step};
use futures::StreamExt;
use pretty_assertions::assert_eq;

const ANSWER: &str = "The quick brown fox jumps over the lazy dog, twice over.";

async fn model() -> FakeModel {
    let mut step = Step::reply(ANSWER);
    step.chunk_chars = Some(4);
    step.chunk_delay_ms = Some(5);
    FakeModel::start(Script::steps(vec![step]), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn agent(model: &FakeModel, provider: &str) -> Agent {
    let base = match provider {
        "anthropic" => model.anthropic_base_url(),
        _ => model.openai_base_url(),
    };
    Agent::builder()
        .name("talker")
        .model(format!("{provider}/fake"))
        .base_url(base)
        .api_key("k")
        .system_prompt("You talk.")
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn with_deltas_yields_the_answer_in_pieces_before_the_turn_is_answered_on_both_providers() {
    for provider in ["openai", "anthropic"] {
        let model = model().await;
        let agent = agent(&model, provider).await;
        let mut items = agent.run_stream("speak").unwrap().with_deltas();
        let mut pieces = Vec::new();
        let mut answered_after = None;
        while let Some(item) = items.next().await {
            match item {
                RunItem::Delta(d) => {
                    assert_eq!((d.attempt, d.turn, d.reset), (1, 1, false), "{provider}");
                    pieces.push(d.text);
                }
                RunItem::Event(RunEventBody::ModelAnswered(_)) => {
                    answered_after.get_or_insert(pieces.len());
                }
                RunItem::Event(_) => {}
            }
        }
        let outcome = items.outcome().await.unwrap();
        assert_eq!(outcome.result, ANSWER, "{provider}");
        assert_eq!(pieces.concat(), ANSWER, "{provider}: {pieces:?}");
        assert!(pieces.len() >= 3, "{provider}: {pieces:?}");
        assert_eq!(
            answered_after,
            Some(pieces.len()),
            "{provider}: every piece came before model.answered"
        );
        let request = &model.requests()[0];
        assert_eq!(request["body"]["stream"], true, "{provider}: {request}");
        let path = request["path"].as_str().unwrap();
        assert_eq!(
            path,
            if provider == "anthropic" {
                "/v1/messages"
            } else {
                "/v1/chat/completions"
            }
        );

        // The plain stream: events only.
        let events: Vec<RunEventBody> = agent.run_stream("again").unwrap().collect().await;
        assert!(
            matches!(events.last(), Some(RunEventBody::RunFinished(_))),
            "{provider}: {events:?}"
        );
    }
}
