//! What a run without a Hub needs of a loaded bundle ([`resolve_local`]): its secrets from this
//! process's environment and its model client settings. Shared by `agen run`, its local
//! delegates and embedded agents.

use std::collections::BTreeMap;

use agen_shared::bundle::{referenced_secrets, Bundle, Provider, SecretSource};

use crate::run::model_config;

/// What a run without a Hub needs of a loaded bundle: the values of its secrets (each
/// `env`-sourced one from this process's environment; a `platform` one is an error that says
/// what to write instead) and its model client settings (the API key from `OPENAI_API_KEY` /
/// `ANTHROPIC_API_KEY` when the bundle gives none). Shared by `agen run` and embedded agents.
pub fn resolve_local(
    bundle: &Bundle,
) -> Result<(BTreeMap<String, String>, crate::model::ModelConfig), String> {
    if let Some((name, used_in)) = referenced_secrets(bundle)
        .into_iter()
        .find(|(name, _)| matches!(bundle.secrets.get(name), Some(SecretSource::Platform)))
    {
        return Err(format!(
            "x-agen/secrets.json: secret {name} (used in {used_in}) has source platform, which needs a Hub; \
             use {{\"source\": \"env\", \"var\": \"{name}\"}} to run without one"
        ));
    }
    let secrets = bundle
        .secret_values(|var| std::env::var(var).ok(), |_| None)
        .map_err(|e| e.to_string())?;
    let mut config = model_config(bundle, &secrets).map_err(|e| e.to_string())?;
    if config.api_key.is_none() {
        // What a user of the providers' own tools expects.
        let var = match config.model.provider {
            Provider::OpenAi => "OPENAI_API_KEY",
            Provider::Anthropic => "ANTHROPIC_API_KEY",
        };
        config.api_key = std::env::var(var).ok().filter(|k| !k.is_empty());
    }
    Ok((secrets, config))
}
