//! `agen hub rotate-ca [--finish]`: rolls the Hub's CA in its data dir (the files of
//! `<data-dir>/tls/`, through `agen_shared::tls`). The running Hub sees the new files within a
//! second (`agen_hub::tls_live`) and uses them for new connections and new Nest certificates;
//! its pings tell each Nest, which renews its certificate and takes the new CAs. The join token
//! file is rewritten for the new CA (same secret, so the Hub's record of it is unchanged) and
//! printed on stdout; the local client config's CA file holds the new CA (or, when the client
//! config keeps its own copy, the CAs trusted during the overlap).

use std::path::Path;

use agen_shared::client_config::ClientConfig;
use agen_shared::tls::{self, JoinToken};
use anyhow::Context;

pub fn run(data_dir: &Path, finish: bool) -> anyhow::Result<i32> {
    agen_shared::private::restrict_umask();
    let dir = data_dir.join("tls");
    if !dir.join("ca.key").exists() {
        eprintln!(
            "agen hub rotate-ca: no Hub CA in {}; pass the Hub's --data-dir",
            dir.display()
        );
        return Ok(2);
    }
    let result = if finish {
        tls::finish_hub_ca_rotation(&dir, &[])
    } else {
        tls::rotate_hub_ca(&dir, &[])
    };
    let hub = match result {
        Ok(h) => h,
        Err(tls::TlsError::Rotation(why)) => {
            eprintln!("agen hub rotate-ca: {why}");
            return Ok(2);
        }
        Err(e) => return Err(e).context("cannot rotate the Hub's CA"),
    };
    // The built-in join token for the new CA: same secret, the new CA's hash.
    let token_file = data_dir.join("join-token");
    let token = match std::fs::read_to_string(&token_file)
        .ok()
        .and_then(|t| JoinToken::parse(t.trim()).ok())
    {
        Some(old) => JoinToken {
            ca_sha256: hub.ca_sha256.clone(),
            secret: old.secret,
        },
        None => JoinToken::generate(&hub.ca_sha256),
    };
    tls::write_private(&token_file, token.to_string().as_bytes())
        .with_context(|| format!("cannot write {}", token_file.display()))?;
    rewrite_client_ca(data_dir, &hub)?;
    if finish {
        eprintln!(
            "agen hub rotate-ca: done; only the CA {} is trusted now (a certificate signed by the previous CA alone is refused from the next connection on)",
            hub.ca_sha256
        );
    } else {
        eprintln!(
            "agen hub rotate-ca: the new CA {} signs from now on; the previous one stays trusted until `agen hub rotate-ca --finish`",
            hub.ca_sha256
        );
        eprintln!(
            "  the running Hub uses it within a second; each Nest renews its certificate at its next ping"
        );
        eprintln!(
            "  give {} to clients that keep their own copy of the CA, then run `agen hub rotate-ca --finish`",
            hub.ca_file.display()
        );
    }
    eprintln!("join token for new Nests (the previous CA's tokens work until --finish):");
    println!("{token}");
    Ok(0)
}

/// The local client config trusts what the Hub presents from now on: its `ca_file` is the
/// Hub's `tls/ca.pem` (rewritten by the rotation), or a copy of its own that gets the CAs
/// trusted now.
fn rewrite_client_ca(data_dir: &Path, hub: &tls::HubTls) -> anyhow::Result<()> {
    let ours = ClientConfig::load(&data_dir.join("client.toml")).unwrap_or_default();
    let path = ClientConfig::default_path();
    let local = ClientConfig::load(&path).unwrap_or_default();
    if local.hub.is_none() || local.hub != ours.hub {
        return Ok(());
    }
    match &local.ca_file {
        Some(ca) if ca != &hub.ca_file => {
            tls::write_private(ca, hub.trust_pem.as_bytes())
                .with_context(|| format!("cannot write {}", ca.display()))?;
            eprintln!(
                "client config {}: its CA file {} now holds the CAs the Hub trusts",
                path.display(),
                ca.display()
            );
        }
        _ => eprintln!(
            "client config {}: its CA file {} holds the new CA",
            path.display(),
            hub.ca_file.display()
        ),
    }
    Ok(())
}
