//! Malformed requests are the caller's fault: tonic reports a message that does not decode as
//! `INTERNAL` and one over the message limit as `OUT_OF_RANGE`; the Hub answers both
//! `INVALID_ARGUMENT` (the latter with the limit table's text). [`layer`] rewrites unary
//! answers (tonic puts their status in the response headers), [`next`] reads client streams.

use tonic::{Code, Status, Streaming};

/// The status the caller should get for `status`, when it is a decode failure.
pub fn remap(status: &Status) -> Option<Status> {
    let msg = status.message();
    match status.code() {
        Code::Internal if msg.starts_with("failed to decode Protobuf message") => {
            Some(Status::invalid_argument(format!(
                "request: not a valid protobuf message of this RPC ({}); send the message the RPC expects",
                crate::limits::cut(msg, 200)
            )))
        }
        Code::OutOfRange if msg.contains("decoded message length too large") => {
            let numbers: Vec<&str> = msg
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .collect();
            let text = match numbers.as_slice() {
                [found, limit] => {
                    format!("request: {found} bytes is over the limit of {limit} bytes")
                }
                _ => format!("request: {}", crate::limits::cut(msg, 200)),
            };
            Some(Status::invalid_argument(text))
        }
        _ => None,
    }
}

/// The next message of a client stream, with decode failures as `INVALID_ARGUMENT`.
pub async fn next<T>(stream: &mut Streaming<T>) -> Result<Option<T>, Status> {
    stream.message().await.map_err(|s| remap(&s).unwrap_or(s))
}

/// Rewrites the status of a unary answer in its headers when it is a decode failure.
fn rewrite<B>(mut response: http::Response<B>) -> http::Response<B> {
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    if status.code() == Code::Ok {
        return response;
    }
    if let Some(better) = remap(&status) {
        let headers = response.headers_mut();
        headers.remove(Status::GRPC_MESSAGE);
        headers.remove(Status::GRPC_STATUS_DETAILS);
        if better.add_header(headers).is_err() {
            tracing::warn!("cannot rewrite the status of a malformed request");
        }
    }
    response
}

/// The tower layer the Hub's server applies to every answer.
pub fn layer<B>() -> tower::util::MapResponseLayer<fn(http::Response<B>) -> http::Response<B>> {
    tower::util::MapResponseLayer::new(rewrite::<B> as fn(http::Response<B>) -> http::Response<B>)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_failures_become_invalid_argument() {
        let got = remap(&Status::internal(
            "failed to decode Protobuf message: invalid wire type",
        ))
        .expect("remapped");
        assert_eq!(got.code(), Code::InvalidArgument);
        let got = remap(&Status::out_of_range(
            "Error, decoded message length too large: found 70000000 bytes, the limit is: 67108864 bytes",
        ))
        .expect("remapped");
        assert_eq!(got.code(), Code::InvalidArgument);
        assert_eq!(
            got.message(),
            "request: 70000000 bytes is over the limit of 67108864 bytes"
        );
        assert!(remap(&Status::internal("store failed")).is_none());
    }
}
