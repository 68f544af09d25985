//! The client config (`~/.config/agen/config.toml`, or `$AGEN_CONFIG`): the Hub URL, the CA
//! file that signs the Hub's certificate, and the API token. `agen up` and `agen hub` write it
//! when none exists; every client command reads it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Contents of the client config file (TOML keys `hub` or `hubs`, `ca_file`, `token`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientConfig {
    /// `https://127.0.0.1:7070` (or `http://` for an explicitly plaintext loopback Hub).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
    /// Several Hubs on one database (`hubs = ["https://a:7070", "https://b:7070"]`): tried in
    /// turn, the one that leads answers; replaces `hub` when both are present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hubs: Vec<String>,
    /// PEM file of the CA that signs the Hub's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Bearer token presented on every API call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Reading or writing the client config failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    #[error("cannot read client config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("client config {path} is not valid TOML with keys hub, ca_file, token: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("cannot write client config {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ClientConfig {
    /// `$AGEN_CONFIG`, else `$XDG_CONFIG_HOME/agen/config.toml`, else `~/.config/agen/config.toml`.
    pub fn default_path() -> PathBuf {
        if let Some(p) = std::env::var_os("AGEN_CONFIG").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("agen").join("config.toml")
    }

    /// Loads the file; a missing file is an empty config.
    pub fn load(path: &Path) -> Result<ClientConfig, ClientConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|source| ClientConfigError::Parse {
                path: path.to_owned(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClientConfig::default()),
            Err(source) => Err(ClientConfigError::Read {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Writes the file (mode 0600, parents created).
    pub fn write(&self, path: &Path) -> Result<(), ClientConfigError> {
        let err = |source| ClientConfigError::Write {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        let text = toml::to_string(self).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = path.with_extension("toml.tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(err)?;
            f.write_all(text.as_bytes()).map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Writes `self` unless a config already exists at `path`; returns whether it wrote.
    pub fn write_if_absent(&self, path: &Path) -> Result<bool, ClientConfigError> {
        if path.exists() {
            return Ok(false);
        }
        self.write(path)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/config.toml");
        assert_eq!(ClientConfig::load(&path).unwrap(), ClientConfig::default());
        let cfg = ClientConfig {
            hub: Some("https://127.0.0.1:7070".into()),
            hubs: Vec::new(),
            ca_file: Some("/tmp/ca.pem".into()),
            token: Some("t".into()),
        };
        assert!(cfg.write_if_absent(&path).unwrap());
        assert!(!cfg.write_if_absent(&path).unwrap());
        assert_eq!(ClientConfig::load(&path).unwrap(), cfg);
    }
}
