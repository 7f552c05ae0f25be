//! The review page: one HTML file, a style sheet and a small script, compiled into the binary
//! and served without authentication (`GET /` and `GET /review/{file}`; API Gateway routes both
//! without the authorizer). The page holds no data: every API call it makes carries the
//! reviewer's bearer token.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// Scripts, styles and requests from this origin only: no inline code, no other hosts, no
/// framing, no form posts (the page's forms are handled by its script).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Browsers revalidate on every load, so a new deployment shows at once; the ETag makes an
/// unchanged file a 304.
const CACHE_CONTROL: &str = "no-cache";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
    etag: String,
}

impl Asset {
    fn new(name: &'static str, content_type: &'static str, body: &'static str) -> Self {
        let digest = hex::encode(Sha256::digest(body.as_bytes()));
        Self {
            name,
            content_type,
            body,
            etag: format!("\"{}\"", &digest[..32]),
        }
    }
}

static INDEX: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "index.html",
        "text/html; charset=utf-8",
        include_str!("index.html"),
    )
});

/// The files under `/review/`.
static FILES: LazyLock<[Asset; 2]> = LazyLock::new(|| {
    [
        Asset::new(
            "review.js",
            "text/javascript; charset=utf-8",
            include_str!("review.js"),
        ),
        Asset::new(
            "review.css",
            "text/css; charset=utf-8",
            include_str!("review.css"),
        ),
    ]
});

/// `GET /` and `GET /review/{file}`.
pub(super) fn routes() -> Router {
    Router::new()
        .route("/", get(index))
        .route("/review/{file}", get(file))
}

async fn index(request: HeaderMap) -> Response {
    serve(&INDEX, &request)
}

async fn file(Path(name): Path<String>, request: HeaderMap) -> Response {
    match FILES.iter().find(|asset| asset.name == name) {
        Some(asset) => serve(asset, &request),
        None => ApiError::no_route("GET", &format!("/review/{name}")).into_response(),
    }
}

fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    let unchanged = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == asset.etag));
    let mut response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.body,
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL),
    );
    if let Ok(etag) = HeaderValue::from_str(&asset.etag) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use lambda_http::tower::ServiceExt;

    async fn get(path: &str, if_none_match: Option<&str>) -> Response {
        let mut request = Request::get(path);
        if let Some(tag) = if_none_match {
            request = request.header(header::IF_NONE_MATCH, tag);
        }
        routes()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    async fn text(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn the_page_is_served_with_its_type_and_a_strict_policy() {
        for (path, content_type) in [
            ("/", "text/html; charset=utf-8"),
            ("/review/review.js", "text/javascript; charset=utf-8"),
            ("/review/review.css", "text/css; charset=utf-8"),
        ] {
            let response = get(path, None).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.contains("script-src 'self';"), "{csp}");
            assert!(csp.contains("style-src 'self';"), "{csp}");
            assert!(csp.starts_with("default-src 'none';"), "{csp}");
            assert!(!csp.contains("unsafe"), "{csp}");
        }
    }

    #[tokio::test]
    async fn the_html_loads_only_its_own_script_and_style() {
        let html = text(get("/", None).await).await;
        assert!(html.contains(r#"<script type="module" src="review/review.js"></script>"#));
        assert!(html.contains(r#"<link rel="stylesheet" href="review/review.css">"#));
        assert!(
            !html.contains(" style="),
            "no inline styles under the policy"
        );
        let inline_handler = html.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!inline_handler, "no inline handlers under the policy");
        assert_eq!(html.matches("<script").count(), 1, "no inline scripts");
    }

    #[tokio::test]
    async fn an_unchanged_file_is_a_304() {
        let first = get("/review/review.js", None).await;
        let etag = first.headers()[header::ETAG].to_str().unwrap().to_string();
        let again = get("/review/review.js", Some(&etag)).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::ETAG], etag.as_str());
        assert!(text(again).await.is_empty());
        let other = get("/review/review.js", Some("\"something-else\"")).await;
        assert_eq!(other.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn an_unknown_file_is_a_json_404() {
        let response = get("/review/secrets.txt", None).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert!(text(response).await.contains("no_route"));
    }
}
