//! `examples/embedded` as a user runs it: the real example binary (cargo builds examples
//! before it runs tests), once with the scripted fake model of its README's first command and
//! once pointed at a fake model server by `--base-url` / `--model`; its answer holds what its
//! host tool returned.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::path::PathBuf;
use std::process::Command;

use agen_fake_model::{FakeModel, Script};
use pretty_assertions::assert_eq;

/// `target/<profile>/examples/embedded`, beside this test's `deps/` folder.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let bin = profile.join("examples").join("embedded");
    assert!(
        bin.exists(),
        "{} is missing; run cargo test -p agen (it builds the examples)",
        bin.display()
    );
    bin
}

fn script_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/embedded/script.json")
}

#[test]
fn the_example_answers_with_its_host_tools_output_from_the_scripted_model() {
    // The README's first command.
    let out = Command::new(example())
        .arg("--fake-model")
        .arg(script_path())
        .env_remove("OPENAI_BASE_URL")
        .env_remove("AGEN_MODEL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "The weather tool says: Paris: sunny, 21 C\n"
    );
}

#[tokio::test]
async fn the_example_talks_to_the_model_its_flags_name() {
    let script = Script::load(&script_path()).unwrap();
    let model = FakeModel::start(script, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let out = tokio::process::Command::new(example())
        .args([
            "--base-url",
            &model.openai_base_url(),
            "--model",
            "openai/some-model",
        ])
        .arg("Weather in Oslo?")
        .env("OPENAI_API_KEY", "test-key")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The scripted call asks for Paris whatever the prompt; the prompt reached the model.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "The weather tool says: Paris: sunny, 21 C\n"
    );
    let first = &model.requests()[0]["body"];
    assert_eq!(first["model"], "some-model");
    assert!(first["messages"].to_string().contains("Weather in Oslo?"));

    // Without a model it says what to pass and exits 2.
    let out = tokio::process::Command::new(example())
        .env_remove("AGEN_MODEL")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--model"));
}
