//! `agen._native`: the Rust half of the Python SDK. The fleet client (`fleet`) speaks gRPC to
//! the Hub through the CLI's own client code (`agen_cli::client`: config, `AGEN_*`, TLS, token,
//! the same error messages and exit-code classes); the embedded agent (`embedded`) is the SDK's
//! `agen::Agent` with tools that call back into Python. Everything crossing into Python is a
//! JSON string the typed Python layer (`python/agen/`) reads; errors are raised as the Python
//! exception class of their exit code (`agen.errors.from_code`).

mod embedded;
mod fleet;

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::prelude::*;

/// The runtime every call of this module runs on (one per process, multi-threaded).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        agen_shared::tls::install_crypto_provider();
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("agen-sdk")
            .build()
            .expect("the tokio runtime of the agen Python SDK cannot be built (out of threads?)")
    })
}

/// Runs `fut` to its end with the GIL released, checking for Ctrl-C (and other signals the
/// interpreter handles) every 100 ms; a signal's exception drops `fut` (cancelling what it did).
fn block<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let mut fut = Box::pin(fut);
    loop {
        let step = py.allow_threads(|| {
            rt().block_on(async {
                tokio::time::timeout(Duration::from_millis(100), &mut fut).await
            })
        });
        match step {
            Ok(v) => return Ok(v),
            Err(_) => py.check_signals()?,
        }
    }
}

/// The Python exception for exit code `code` (the CLI's table, docs/exit-codes.md) with
/// `message`, built by `agen.errors.from_code` so the classes live in one place.
fn error(code: i32, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::with_gil(|py| {
        let made = py
            .import("agen.errors")
            .and_then(|m| m.getattr("from_code"))
            .and_then(|f| f.call1((code, message.clone())));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

/// An error of the CLI's client code (a gRPC status, a coded error, anything else: 1).
fn cli_error(e: anyhow::Error) -> PyErr {
    error(agen_cli::exit::of_error(&e), format!("{e:#}"))
}

/// JSON for Python: serialising our own values cannot fail.
fn to_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("JSON values always serialise")
}

#[pymodule]
#[pyo3(name = "_native")]
fn agen_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<fleet::Hub>()?;
    m.add_class::<fleet::EventStream>()?;
    m.add_class::<embedded::Agent>()?;
    m.add_class::<embedded::Run>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
