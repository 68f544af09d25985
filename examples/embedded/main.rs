//! `examples/embedded`: an Agen agent inside a Rust program, with one host tool (`weather`,
//! written in Rust below). Point it at a model with `--base-url URL --model provider/model` (or
//! `OPENAI_BASE_URL` / `AGEN_MODEL`), or at the scripted fake model with `--fake-model SCRIPT`
//! (no network, no key; see README.md).
//!
//! `cargo run -p agen --example embedded -- [--fake-model SCRIPT | --base-url URL --model M] [PROMPT]`

use std::process::ExitCode;

use agen::{Agent, Tool, ToolContext};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct WeatherArgs {
    /// The city, e.g. Paris.
    city: String,
}

/// The host tool: a real program would call its own code or service here.
async fn weather(args: WeatherArgs, _cx: ToolContext) -> Result<String, String> {
    let forecast = match args.city.to_lowercase().as_str() {
        "paris" => "sunny, 21 C",
        "oslo" => "snow, -3 C",
        _ => "cloudy, 12 C",
    };
    Ok(format!("{}: {forecast}", args.city))
}

struct Args {
    fake_model: Option<String>,
    base_url: Option<String>,
    model: Option<String>,
    prompt: String,
}

const USAGE: &str = "usage: embedded [--fake-model SCRIPT | --base-url URL --model PROVIDER/MODEL] [PROMPT]\n\
  --base-url defaults to $OPENAI_BASE_URL, --model to $AGEN_MODEL; the key comes from $OPENAI_API_KEY";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        fake_model: None,
        base_url: std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|v| !v.is_empty()),
        model: std::env::var("AGEN_MODEL").ok().filter(|v| !v.is_empty()),
        prompt: "What is the weather in Paris?".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--fake-model" => args.fake_model = Some(value("--fake-model")?),
            "--base-url" => args.base_url = Some(value("--base-url")?),
            "--model" => args.model = Some(value("--model")?),
            "-h" | "--help" => return Err(String::new()),
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            prompt => args.prompt = prompt.to_string(),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The scripted fake model runs in this process when asked for (tests and demos only).
    let _fake;
    let (base_url, model) = match &args.fake_model {
        Some(script) => {
            let script = match agen_fake_model::Script::load(std::path::Path::new(script)) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let Ok(addr) = "127.0.0.1:0".parse() else {
                return ExitCode::FAILURE;
            };
            let fake = match agen_fake_model::FakeModel::start(script, addr).await {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("error: while starting the fake model: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let url = fake.openai_base_url();
            _fake = fake;
            (Some(url), Some("openai/fake".to_string()))
        }
        None => (args.base_url, args.model),
    };
    let Some(model) = model else {
        eprintln!("error: no model: pass --model provider/model (or set AGEN_MODEL), or --fake-model SCRIPT\n{USAGE}");
        return ExitCode::from(2);
    };

    let mut builder = Agent::builder()
        .name("weather-helper")
        .model(model)
        .system_prompt("You answer questions about the weather. Use the weather tool.")
        .tool(
            Tool::new("weather", "Today's weather in a city")
                .read_only()
                .handler(weather),
        );
    if let Some(url) = base_url {
        builder = builder.base_url(url);
    }
    if args.fake_model.is_some() {
        builder = builder.api_key("not-a-real-key");
    }
    let agent = match builder.build().await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = match agent.run(args.prompt).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    agent.shutdown().await;
    if outcome.succeeded() {
        println!("{}", outcome.result);
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: the run {}: {}",
            outcome.state.as_str(),
            outcome.result
        );
        ExitCode::FAILURE
    }
}
