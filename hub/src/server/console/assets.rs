//! The console's page and assets, embedded in the binary from `hub/console/` (plain ES
//! modules and one stylesheet: no bundler, no npm, nothing fetched from elsewhere).

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

/// Every asset: file name, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("../../../console/app.js")),
    ("dom.js", JS, include_str!("../../../console/dom.js")),
    ("api.js", JS, include_str!("../../../console/api.js")),
    ("fleet.js", JS, include_str!("../../../console/fleet.js")),
    ("tasks.js", JS, include_str!("../../../console/tasks.js")),
    ("task.js", JS, include_str!("../../../console/task.js")),
    (
        "waterfall.js",
        JS,
        include_str!("../../../console/waterfall.js"),
    ),
    (
        "approvals.js",
        JS,
        include_str!("../../../console/approvals.js"),
    ),
    (
        "deployment.js",
        JS,
        include_str!("../../../console/deployment.js"),
    ),
    ("audit.js", JS, include_str!("../../../console/audit.js")),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../../console/style.css"),
    ),
];

const JS: &str = "text/javascript; charset=utf-8";
const INDEX: &str = include_str!("../../../console/index.html");

pub async fn to_index() -> Redirect {
    Redirect::permanent("/ui/")
}

pub async fn index() -> Response {
    let mut res = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

pub async fn file(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => {
            let mut res = ([(header::CONTENT_TYPE, *content_type)], *body).into_response();
            res.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            res
        }
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page loads only assets that are embedded, and nothing from another origin.
    #[test]
    fn the_page_refers_only_to_embedded_assets_of_its_own_origin() {
        let mut referred = Vec::new();
        for text in std::iter::once(INDEX).chain(ASSETS.iter().map(|(_, _, b)| *b)) {
            assert!(
                !text.contains("http://") && !text.contains("https://"),
                "an asset names another origin"
            );
            assert!(
                !text.contains("innerHTML"),
                "data must be set with textContent"
            );
            assert!(!text.contains("eval("), "no eval");
            for part in text.split(['"', '\'']) {
                if let Some(name) = part
                    .strip_prefix("/ui/assets/")
                    .or_else(|| part.strip_prefix("./"))
                {
                    if name.ends_with(".js") || name.ends_with(".css") {
                        referred.push(name.to_string());
                    }
                }
            }
        }
        assert!(!referred.is_empty());
        for name in referred {
            assert!(
                ASSETS.iter().any(|(n, _, _)| *n == name),
                "{name} is not embedded"
            );
        }
    }
}
