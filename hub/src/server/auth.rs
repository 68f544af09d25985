//! Bearer-token interceptors: the admin token for `AgenService`, the join token for
//! `NestService`. Health and reflection are served without either.

use tonic::{Request, Status};

/// Accepts requests whose `authorization` is `Bearer <one of the tokens>`.
#[derive(Clone)]
pub struct BearerAuth {
    tokens: Vec<String>,
    what: &'static str,
}

impl BearerAuth {
    /// `what` names the token in errors ("admin token", "join token").
    pub fn new(tokens: Vec<String>, what: &'static str) -> BearerAuth {
        BearerAuth { tokens, what }
    }

    pub fn check<T>(&self, req: Request<T>) -> Result<Request<T>, Status> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let Some(header) = header else {
            return Err(Status::unauthenticated(format!(
                "missing `authorization: Bearer <token>`; present the hub's {} (agen hub writes it into the client config and <data-dir>)",
                self.what
            )));
        };
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .unwrap_or("")
            .trim();
        if self
            .tokens
            .iter()
            .any(|t| constant_time_eq(t.as_bytes(), token.as_bytes()))
        {
            Ok(req)
        } else {
            Err(Status::unauthenticated(format!(
                "the bearer token is not this hub's {}; check --token / AGEN_TOKEN or the client config",
                self.what
            )))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
