//! gRPC server metrics, per RPC: `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}`
//! and `grpc_server_handling_seconds{grpc_service,grpc_method}` (the grpc-ecosystem names), fed
//! by [`layer`], a tower layer on the Hub's tonic server, and registered into the Hub's
//! `/metrics` by [`register`].
//!
//! Invariants: a call is counted once, when its status is known: from the headers of a
//! trailers-only answer (most errors), else from the trailers at the end of its body; a body
//! dropped before its trailers (a client that went away) counts as `Cancelled`. Requests that
//! are not gRPC (the A2A HTTP API, the web console) are not counted. Label values are bounded:
//! a call the server does not implement is counted under `unknown`/`unknown`, so made-up paths
//! cannot grow the series. Like the store's fsync counters, the families are process-wide
//! (one process may hold several Hubs in tests).

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tonic::Code;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    grpc_service: String,
    grpc_method: String,
    grpc_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_service: String,
    grpc_method: String,
}

fn seconds_histogram() -> Histogram {
    // 1 ms … ~65 s: unary calls; a stream's whole life lands in the last buckets.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

static HANDLED: LazyLock<Family<HandledLabels, Counter>> = LazyLock::new(Family::default);
type Durations = Family<MethodLabels, Histogram, fn() -> Histogram>;

static HANDLING: LazyLock<Durations> =
    LazyLock::new(|| Family::new_with_constructor(seconds_histogram));

/// Adds the gRPC server families to a Hub's registry.
pub fn register(registry: &mut Registry) {
    registry.register(
        "grpc_server_handled",
        "gRPC calls the Hub completed, by service, method and status code",
        HANDLED.clone(),
    );
    registry.register(
        "grpc_server_handling_seconds",
        "How long gRPC calls took from request to status (a stream: its whole life)",
        HANDLING.clone(),
    );
}

/// Calls of `service`/`method` that ended with `code` so far (tests).
pub fn handled(service: &str, method: &str, code: Code) -> u64 {
    HANDLED
        .get_or_create(&HandledLabels {
            grpc_service: service.into(),
            grpc_method: method.into(),
            grpc_code: code_name(code).into(),
        })
        .get()
}

/// The name a status code has in the grpc-ecosystem metrics (`OK`, `NotFound`, …).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// One gRPC call being measured; records itself once.
struct Call {
    service: String,
    method: String,
    started: Instant,
    done: bool,
}

impl Call {
    /// A call to `path` (`/agen.v1.Agen/SubmitTask`), or `None` for a request that is not gRPC.
    fn of<B>(request: &http::Request<B>) -> Option<Call> {
        let grpc = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !grpc {
            return None;
        }
        let (service, method) = request
            .uri()
            .path()
            .trim_start_matches('/')
            .split_once('/')
            .unwrap_or(("unknown", "unknown"));
        Some(Call {
            service: service.to_string(),
            method: method.to_string(),
            started: Instant::now(),
            done: false,
        })
    }

    fn finish(&mut self, code: Code) {
        if self.done {
            return;
        }
        self.done = true;
        let (service, method) = if code == Code::Unimplemented {
            ("unknown".to_string(), "unknown".to_string())
        } else {
            (
                std::mem::take(&mut self.service),
                std::mem::take(&mut self.method),
            )
        };
        HANDLING
            .get_or_create(&MethodLabels {
                grpc_service: service.clone(),
                grpc_method: method.clone(),
            })
            .observe(self.started.elapsed().as_secs_f64());
        HANDLED
            .get_or_create(&HandledLabels {
                grpc_service: service,
                grpc_method: method,
                grpc_code: code_name(code).into(),
            })
            .inc();
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // The body went away before its trailers: the client cancelled.
        self.finish(Code::Cancelled);
    }
}

fn status_in(headers: &http::HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()))
}

/// A response body that records its call when its trailers pass.
pub struct MeteredBody {
    inner: tonic::body::Body,
    call: Option<Call>,
}

impl http_body::Body for MeteredBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(call) = this.call.as_mut() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(code) = frame.trailers_ref().and_then(status_in) {
                        call.finish(code);
                    }
                }
                Poll::Ready(Some(Err(_))) => call.finish(Code::Internal),
                Poll::Ready(None) => call.finish(Code::Unknown),
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The tower layer that measures every gRPC call of the Hub's server.
#[derive(Clone, Copy, Debug, Default)]
pub struct Layer;

impl<S> tower::Layer<S> for Layer {
    type Service = Metered<S>;
    fn layer(&self, inner: S) -> Metered<S> {
        Metered { inner }
    }
}

/// [`Layer`]'s service.
#[derive(Clone, Debug)]
pub struct Metered<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Metered<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = Call::of(&request);
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await?;
            let Some(mut call) = call else {
                return Ok(response);
            };
            if let Some(code) = status_in(response.headers()) {
                // Trailers-only: the status is already known.
                call.finish(code);
                return Ok(response);
            }
            let (parts, inner) = response.into_parts();
            let body = tonic::body::Body::new(MeteredBody {
                inner,
                call: Some(call),
            });
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_counted_once_under_its_code_and_unimplemented_paths_under_unknown() {
        let request = |path: &str| {
            http::Request::builder()
                .uri(path)
                .header("content-type", "application/grpc")
                .body(())
                .expect("request")
        };
        let before = handled("test.v1.T", "Once", Code::NotFound);
        let mut call = Call::of(&request("/test.v1.T/Once")).expect("a gRPC call");
        call.finish(Code::NotFound);
        drop(call);
        assert_eq!(handled("test.v1.T", "Once", Code::NotFound), before + 1);
        assert_eq!(handled("test.v1.T", "Once", Code::Cancelled), 0);

        let unknown = handled("unknown", "unknown", Code::Unimplemented);
        let mut call = Call::of(&request("/made.up/Path")).expect("a gRPC call");
        call.finish(Code::Unimplemented);
        assert_eq!(
            handled("unknown", "unknown", Code::Unimplemented),
            unknown + 1
        );
        assert_eq!(handled("made.up", "Path", Code::Unimplemented), 0);

        let plain = http::Request::builder()
            .uri("/ui/")
            .body(())
            .expect("request");
        assert!(Call::of(&plain).is_none(), "not gRPC, not counted");
    }
}
