//! A tool bound to an HTTP endpoint: the `http` binding of an agent definition.
//!
//! ```toml
//! [tools.issue_refund.http]
//! method = "POST"                     # GET, POST, PUT, PATCH, DELETE
//! url = "${ORDERS_URL}/orders/{order_id}/refunds"
//! headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
//! timeout = "10s"                     # optional, default 10s, at most 60s
//! max_response_bytes = 65536          # optional, default 64 KiB, at most 1 MiB
//!
//! [tools.issue_refund.http.reconcile]  # optional
//! method = "GET"
//! url = "${ORDERS_URL}/refunds/by-key/{idempotency_key}"
//! headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
//! timeout = "5s"
//! ```
//!
//! The contract:
//! - `${VAR}` in the URL and in header values is filled from the environment when the binding
//!   is resolved, at start-up; an unset variable fails at once, naming the field.
//! - `{name}` in the URL's path is filled from the call's top-level argument `name` (a string or
//!   an integer), percent-encoded as one path segment; `{idempotency_key}` is the call's key. A
//!   missing argument fails the call before anything is sent. Placeholders live in the path only.
//! - POST, PUT and PATCH send the exact approved arguments as the JSON body; GET and DELETE send
//!   no body, and the arguments the path does not use go as query parameters. Every request
//!   carries `Idempotency-Key: <action_id>:<version>`, `Accept: application/json`,
//!   `Content-Type: application/json` when it has a body, and the configured headers.
//! - 2xx: succeeded, with the body as the result (JSON, or a JSON string when it is not JSON,
//!   `null` when empty). At most `max_response_bytes` are read, as they stream in; a longer
//!   body is cut and the result says so (`{"body": "<the first bytes>", "cut": "<why>"}`), as
//!   does a 2xx body that breaks off (the status already said the call took effect).
//! - 4xx other than 408, 425 and 429: failed, with the status and the body's error message; the
//!   model reads it as a plain result.
//! - 408, 425, 429, 5xx, 3xx (redirects are never followed), a timeout, or a connection lost
//!   after the request was sent: unknown. The call may have taken effect, so it is never sent
//!   again; the sweep asks the reconcile binding, or a person decides.
//! - No connection at all (refused, DNS failure): failed, saying nothing was sent. A timeout
//!   while still connecting counts as a timeout (unknown): the conservative reading.
//! - Reconcile sends its request with the same key (its URL may use `{idempotency_key}` and the
//!   arguments). 2xx: the call took effect, with that body as its result. 404 or 410: it did not
//!   take effect. This relies on the service's promise that, once it has answered 404 for a key,
//!   it never lets that key take effect (it refuses the late request, or records the key as
//!   spent). Anything else, a timeout or no connection: not known yet; the sweep asks again.
//! - Secrets: header values and any URL filled from `${VAR}` never appear in a result, an
//!   error, a log line or `Debug` output; values of variables used in headers are scrubbed from
//!   what the service answers too. Logs name only the tool, method, host, status and time taken.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde_json::{Value, json};

use super::env_template::BindingError;
use super::env_template::{self, Lookup};
use crate::domain::action::ToolOutcome;
use crate::domain::args::Args;
use crate::ports::model::ToolSpec;
use crate::ports::tools::{Tool, ToolCall};

/// How long a request may take, connection and body included, unless the binding says.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest timeout a binding may set.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a response is read, unless the binding says.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// The most a binding may ask to read.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of a refusal's message the model reads.
const MAX_ERROR_TEXT: usize = 300;
/// Shorter variable values are not scrubbed from answers: they would match everywhere.
const MIN_SCRUBBED_SECRET: usize = 4;
const REDACTED: &str = "[redacted]";
const KEY_PLACEHOLDER: &str = "idempotency_key";
/// Headers Countersign sets itself; a binding may not replace them.
const RESERVED_HEADERS: [&str; 4] = ["idempotency-key", "content-type", "content-length", "host"];

/// The HTTP client every HTTP tool shares: redirects are never followed (the request may have
/// taken effect where it first landed), connecting is bounded, each binding's own timeout
/// bounds each request, and the roots trusted are the system bundle's, read once
/// (`adapters::trust`).
pub fn http_client() -> reqwest::Client {
    build_client()
}

/// The one [`http_client`] of a process's HTTP tools, built the first time it is asked for, so
/// a process that never calls a tool (the decide and sweep functions) never builds it nor reads
/// the roots. Cheap to clone: every clone shares the one client.
#[derive(Debug, Clone, Default)]
pub struct SharedClient(Arc<OnceLock<reqwest::Client>>);

impl SharedClient {
    /// The client, built now if nothing asked for it before.
    pub fn get(&self) -> &reqwest::Client {
        self.0.get_or_init(http_client)
    }

    /// Whether anything asked for the client yet.
    pub fn is_built(&self) -> bool {
        self.0.get().is_some()
    }
}

impl From<reqwest::Client> for SharedClient {
    fn from(client: reqwest::Client) -> Self {
        Self(Arc::new(OnceLock::from(client)))
    }
}

fn build_client() -> reqwest::Client {
    super::trust::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("countersign/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("an HTTP client trusting the system roots")
}

/// The binding as written in an agent definition, before the environment fills it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpBinding {
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Headers,
    /// A duration such as `10s` or `500ms`.
    pub timeout: Option<String>,
    pub max_response_bytes: Option<u64>,
    /// How to ask, with the same key, whether a call whose outcome is unknown took effect: a
    /// request of the same fields, without a reconcile of its own.
    #[serde(default, deserialize_with = "reconcile_request")]
    pub reconcile: Option<Box<HttpBinding>>,
}

fn reconcile_request<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Box<HttpBinding>>, D::Error> {
    let reconcile = Option::<Box<HttpBinding>>::deserialize(deserializer)?;
    if reconcile.as_ref().is_some_and(|r| r.reconcile.is_some()) {
        return Err(serde::de::Error::custom(
            "a reconcile request has no reconcile of its own",
        ));
    }
    Ok(reconcile)
}

/// A binding's headers as written. `Debug` shows their names only: a value may hold a secret
/// written in the file itself.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Headers(pub BTreeMap<String, String>);

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(redacted(self.0.keys().map(String::as_str)))
            .finish()
    }
}

/// `name: [redacted]` for each header name.
fn redacted<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    names.map(|name| format!("{name}: {REDACTED}")).collect()
}

impl HttpBinding {
    /// Fills `${VAR}` from `env` and checks everything that can be checked before a call.
    /// `field` is where the binding sits in its file, such as `tools.issue_refund.http`.
    pub fn resolve(&self, field: &str, env: Lookup<'_>) -> Result<ResolvedHttp, BindingError> {
        let call = Endpoint::resolve(field, self, env)?;
        let reconcile = match &self.reconcile {
            Some(r) => Some(Endpoint::resolve(&format!("{field}.reconcile"), r, env)?),
            None => None,
        };
        Ok(ResolvedHttp { call, reconcile })
    }
}

/// A binding ready to call: the environment filled in, everything checked.
#[derive(Debug, Clone)]
pub struct ResolvedHttp {
    call: Endpoint,
    reconcile: Option<Endpoint>,
}

impl ResolvedHttp {
    pub fn method(&self) -> &Method {
        &self.call.method
    }

    /// `host` or `host:port`: what logs may name.
    pub fn host(&self) -> &str {
        &self.call.host
    }

    pub fn timeout(&self) -> Duration {
        self.call.timeout
    }

    pub fn has_reconcile(&self) -> bool {
        self.reconcile.is_some()
    }

    /// The arguments the URLs' paths name (the call's and the reconcile's), without
    /// `idempotency_key`: a definition can check each against the tool's input schema.
    pub fn path_arguments(&self) -> BTreeSet<&str> {
        std::iter::once(&self.call)
            .chain(&self.reconcile)
            .flat_map(|e| &e.pieces)
            .filter_map(|p| match p {
                Piece::Arg(name) if name != KEY_PLACEHOLDER => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// One part of a URL template: text as is, or a placeholder filled per call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Arg(String),
}

#[derive(Clone)]
struct Endpoint {
    method: Method,
    pieces: Vec<Piece>,
    /// The URL as the file writes it, `${VAR}` unfilled: what `Debug` shows.
    written: String,
    headers: HeaderMap,
    timeout: Duration,
    max_response_bytes: usize,
    host: String,
    /// Values of the variables the headers used, scrubbed from anything the service answers.
    secrets: Vec<String>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers = redacted(self.headers.keys().map(HeaderName::as_str));
        f.debug_struct("Endpoint")
            .field("method", &self.method)
            .field("url", &self.written)
            .field("host", &self.host)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Endpoint {
    fn resolve(field: &str, request: &HttpBinding, env: Lookup<'_>) -> Result<Self, BindingError> {
        let method = parse_method(&format!("{field}.method"), &request.method)?;

        let url_field = format!("{field}.url");
        let url_from_env = env_template::mentions_env(&request.url);
        let url = env_template::expand(&request.url, &url_field, env)?;
        let pieces = parse_template(&url, &url_field, !url_from_env)?;
        let host = check_url(&pieces, &url_field)?;

        let mut headers = HeaderMap::new();
        let seen = RefCell::new(Vec::new());
        let recording = |name: &str| {
            let value = env(name);
            if let Some(v) = &value {
                seen.borrow_mut().push(v.clone());
            }
            value
        };
        for (name, value) in &request.headers.0 {
            let header_field = format!("{field}.headers.{name}");
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                BindingError::invalid(&header_field, "is not a valid HTTP header name")
            })?;
            if headers.contains_key(&header) {
                return Err(BindingError::invalid(
                    &header_field,
                    "is the same header as another one (names ignore case)",
                ));
            }
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(BindingError::invalid(
                    &header_field,
                    "Countersign sets this header itself",
                ));
            }
            let text = env_template::expand(value, &header_field, &recording)?;
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                BindingError::invalid(
                    &header_field,
                    "its value is not a valid HTTP header value (control characters or non-ASCII)",
                )
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let mut secrets = seen.into_inner();
        secrets.retain(|s| s.len() >= MIN_SCRUBBED_SECRET);
        // Longest first, so a secret that contains another is scrubbed whole.
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();

        let timeout = match request.timeout.as_deref() {
            None => DEFAULT_TIMEOUT,
            Some(text) => parse_timeout(&format!("{field}.timeout"), text)?,
        };
        let max_response_bytes = match request.max_response_bytes {
            None => DEFAULT_MAX_RESPONSE_BYTES,
            Some(n) if n >= 1 && n <= MAX_RESPONSE_BYTES as u64 => n as usize,
            Some(n) => {
                return Err(BindingError::invalid(
                    format!("{field}.max_response_bytes"),
                    format!("{n} is not between 1 and {MAX_RESPONSE_BYTES} (1 MiB)"),
                ));
            }
        };
        Ok(Self {
            method,
            pieces,
            written: request.url.to_string(),
            headers,
            timeout,
            max_response_bytes,
            host,
            secrets,
        })
    }
}

fn parse_method(field: &str, text: &str) -> Result<Method, BindingError> {
    match text.to_ascii_uppercase().as_str() {
        "GET" => Ok(Method::GET),
        "POST" => Ok(Method::POST),
        "PUT" => Ok(Method::PUT),
        "PATCH" => Ok(Method::PATCH),
        "DELETE" => Ok(Method::DELETE),
        _ => Err(BindingError::invalid(
            field,
            format!("{text:?} is not one of GET, POST, PUT, PATCH, DELETE"),
        )),
    }
}

fn parse_timeout(field: &str, text: &str) -> Result<Duration, BindingError> {
    let timeout = humantime::parse_duration(text).map_err(|e| {
        BindingError::invalid(
            field,
            format!("{text:?} is not a duration such as \"10s\" or \"500ms\": {e}"),
        )
    })?;
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(BindingError::invalid(
            field,
            format!(
                "{text:?} must be more than 0 and at most {}",
                humantime::format_duration(MAX_TIMEOUT)
            ),
        ));
    }
    Ok(timeout)
}

/// Splits a URL into text and `{name}` placeholders. `show` says whether the URL may be echoed
/// in an error (it did not come from the environment).
fn parse_template(url: &str, field: &str, show: bool) -> Result<Vec<Piece>, BindingError> {
    let mut pieces = Vec::new();
    let mut rest = url;
    while let Some(at) = rest.find(['{', '}']) {
        if rest[at..].starts_with('}') {
            return Err(BindingError::invalid(
                field,
                "has a `}` without its `{`; placeholders are written {argument_name}",
            ));
        }
        if at > 0 {
            pieces.push(Piece::Text(rest[..at].to_string()));
        }
        let after = &rest[at + 1..];
        let end = after.find('}').ok_or_else(|| {
            BindingError::invalid(
                field,
                "has a `{` that never closes; placeholders are written {argument_name}",
            )
        })?;
        let name = &after[..end];
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            let shown = if show {
                format!("{{{name}}}")
            } else {
                "a placeholder".to_string()
            };
            return Err(BindingError::invalid(
                field,
                format!(
                    "{shown} is not a placeholder: write {{argument_name}}, letters, digits and _"
                ),
            ));
        }
        pieces.push(Piece::Arg(name.to_string()));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

/// Checks that the URL is http(s) with a host and that placeholders sit in its path; returns
/// the host (with a port that is not the scheme's own) for logs.
fn check_url(pieces: &[Piece], field: &str) -> Result<String, BindingError> {
    let not_http = || {
        BindingError::invalid(
            field,
            "is not an http:// or https:// URL with a host (once ${...} is filled)",
        )
    };
    let mut sample = String::new();
    let mut placeholders = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => sample.push_str(text),
            Piece::Arg(_) => {
                placeholders.push(sample.len());
                sample.push('x');
            }
        }
    }
    let lower = sample.to_ascii_lowercase();
    let Some(scheme_end) = ["http://", "https://"]
        .iter()
        .find(|s| lower.starts_with(*s))
        .map(|s| s.len())
    else {
        return Err(not_http());
    };
    let url = Url::parse(&sample).map_err(|_| not_http())?;
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(not_http)?;
    let host = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    let path_start = sample[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(sample.len(), |i| scheme_end + i);
    let path_end = sample[path_start..]
        .find(['?', '#'])
        .map_or(sample.len(), |i| path_start + i);
    if placeholders
        .iter()
        .any(|&at| at < path_start || at >= path_end)
    {
        return Err(BindingError::invalid(
            field,
            "placeholders such as {order_id} may stand only in the URL's path",
        ));
    }
    Ok(host)
}

/// Percent-encodes `value` as one path segment: everything but RFC 3986's unreserved bytes.
fn encode_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Why a call could not be turned into a request; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unfillable(String);

impl Endpoint {
    /// The URL of one call: placeholders filled, and for GET and DELETE the other arguments as
    /// query parameters.
    fn url_for(&self, args: &Args, key: &str) -> Result<Url, Unfillable> {
        let mut text = String::new();
        let mut used = BTreeSet::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => text.push_str(t),
                Piece::Arg(name) if name == KEY_PLACEHOLDER => text.push_str(&encode_segment(key)),
                Piece::Arg(name) => {
                    let value = match args.get(name) {
                        None | Some(Value::Null) => {
                            return Err(Unfillable(format!(
                                "the call has no argument `{name}` to fill the URL with"
                            )));
                        }
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                        Some(_) => {
                            return Err(Unfillable(format!(
                                "the argument `{name}` must be a string or an integer to fill the URL"
                            )));
                        }
                    };
                    if matches!(value.as_str(), "" | "." | "..") {
                        return Err(Unfillable(format!(
                            "the argument `{name}` cannot be empty, `.` or `..` in a URL path"
                        )));
                    }
                    text.push_str(&encode_segment(&value));
                    used.insert(name.as_str());
                }
            }
        }
        let mut url = Url::parse(&text)
            .map_err(|_| Unfillable("the URL could not be built from the arguments".into()))?;
        if !has_body(&self.method)
            && let Value::Object(map) = args.as_value()
        {
            let rest: Vec<(String, String)> = map
                .into_iter()
                .filter(|(name, value)| !used.contains(name.as_str()) && !value.is_null())
                .map(|(name, value)| match value {
                    Value::String(s) => (name, s),
                    other => (name, other.to_string()),
                })
                .collect();
            if !rest.is_empty() {
                url.query_pairs_mut().extend_pairs(rest);
            }
        }
        Ok(url)
    }

    /// Replaces every secret the headers used with `[redacted]`.
    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }

    fn scrub_value(&self, value: Value) -> Value {
        if self.secrets.is_empty() {
            return value;
        }
        match value {
            Value::String(s) => Value::String(self.scrub(&s)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.scrub_value(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.scrub(&k), self.scrub_value(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

fn has_body(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// What came of sending one request.
enum Exchange {
    /// Nothing left this process, or no connection was made: the call did not take effect.
    NotSent(String),
    Answered {
        status: StatusCode,
        body: Vec<u8>,
        cut: Option<Cut>,
    },
    /// No answer in time, after the request may have been sent.
    TimedOut,
    /// The connection broke after the request may have been sent.
    Lost(String),
}

/// Why a body was not read to its end.
enum Cut {
    TooLong,
    BrokeOff(String),
}

/// A reqwest error in words, without the URL (which may carry a secret).
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

async fn send(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    call: &ToolCall<'_>,
) -> Result<Exchange, Unfillable> {
    let url = endpoint.url_for(call.args, call.idempotency_key)?;
    let key = HeaderValue::from_str(call.idempotency_key)
        .map_err(|_| Unfillable("the idempotency key is not a valid header value".into()))?;
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
    headers.extend(endpoint.headers.clone());
    headers.insert("idempotency-key", key);
    let mut request = client
        .request(endpoint.method.clone(), url)
        .timeout(endpoint.timeout);
    if has_body(&endpoint.method) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let body = serde_json::to_vec(&call.args.as_value())
            .map_err(|_| Unfillable("the arguments could not be written as JSON".into()))?;
        request = request.body(body);
    }
    let mut response = match request.headers(headers).send().await {
        Ok(response) => response,
        Err(error) if error.is_builder() => return Ok(Exchange::NotSent(describe(error))),
        Err(error) if error.is_connect() => {
            // The host stays out of the result: it may have come from the environment.
            return Ok(Exchange::NotSent(format!(
                "could not connect to the service ({})",
                describe(error)
            )));
        }
        Err(error) if error.is_timeout() => return Ok(Exchange::TimedOut),
        Err(error) => return Ok(Exchange::Lost(describe(error))),
    };
    let status = response.status();
    let limit = endpoint.max_response_bytes;
    let mut body = Vec::new();
    let cut = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    break Some(Cut::TooLong);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break None,
            Err(error) if error.is_timeout() => {
                break Some(Cut::BrokeOff("no more of it came in time".into()));
            }
            Err(error) => break Some(Cut::BrokeOff(describe(error))),
        }
    };
    // Dropping the response here closes a connection whose body was not read to its end.
    drop(response);
    Ok(Exchange::Answered { status, body, cut })
}

/// The longest prefix of `bytes` that is UTF-8 (a cut may split a character), lossily.
fn text_of(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// A 2xx body as a result: its JSON, or its text as a JSON string; a cut body says so.
fn result_of(body: &[u8], cut: Option<&Cut>, limit: usize) -> Value {
    match cut {
        None if body.is_empty() => Value::Null,
        None => serde_json::from_slice(body).unwrap_or_else(|_| Value::String(text_of(body))),
        Some(Cut::TooLong) => json!({
            "body": text_of(body),
            "cut": format!("the response was longer than {limit} bytes; only the first {limit} are kept"),
        }),
        Some(Cut::BrokeOff(why)) => json!({
            "body": text_of(body),
            "cut": format!("the response broke off after {} bytes: {why}", body.len()),
        }),
    }
}

/// The error message of a refusal's body, cut short: a JSON `error`, `error.message`,
/// `message`, `detail` or `title`, or else the body's text.
fn message_of(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(value) => {
            let found = [
                value.get("error").and_then(Value::as_str),
                value.pointer("/error/message").and_then(Value::as_str),
                value.get("message").and_then(Value::as_str),
                value.get("detail").and_then(Value::as_str),
                value.get("title").and_then(Value::as_str),
            ]
            .into_iter()
            .flatten()
            .next()
            .map(str::to_string);
            found.unwrap_or_else(|| value.to_string())
        }
        Err(_) => text_of(body),
    };
    let text = text.trim();
    match text.char_indices().nth(MAX_ERROR_TEXT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn with_message(status: StatusCode, body: &[u8]) -> String {
    let message = message_of(body);
    if message.is_empty() {
        format!("{status}")
    } else {
        format!("{status}: {message}")
    }
}

const NOT_SENT_AGAIN: &str = "the call may have taken effect, so it is not sent again";

/// A tool whose calls are HTTP requests, as its [`ResolvedHttp`] binding says.
pub struct HttpTool {
    spec: ToolSpec,
    binding: ResolvedHttp,
    client: SharedClient,
}

impl HttpTool {
    /// `client` should be built by [`http_client`] (or [`SharedClient`]'s default): it must not
    /// follow redirects.
    pub fn new(spec: ToolSpec, binding: ResolvedHttp, client: SharedClient) -> Self {
        Self {
            spec,
            binding,
            client,
        }
    }

    fn outcome_of_call(&self, exchange: Exchange) -> ToolOutcome {
        let endpoint = &self.binding.call;
        let timeout = humantime::format_duration(endpoint.timeout);
        match exchange {
            Exchange::NotSent(why) => ToolOutcome::Failed {
                error: format!("{why}; nothing was sent, so the call did not take effect"),
            },
            Exchange::Answered { status, body, cut } if status.is_success() => {
                ToolOutcome::Succeeded {
                    result: result_of(&body, cut.as_ref(), endpoint.max_response_bytes),
                }
            }
            Exchange::Answered { status, body, .. }
                if status.is_client_error() && !matches!(status.as_u16(), 408 | 425 | 429) =>
            {
                ToolOutcome::Failed {
                    error: format!(
                        "the service refused the call ({})",
                        with_message(status, &body)
                    ),
                }
            }
            Exchange::Answered { status, .. } if status.is_redirection() => ToolOutcome::Unknown {
                detail: format!(
                    "the service answered with a redirect ({status}), which is never followed; {NOT_SENT_AGAIN}"
                ),
            },
            Exchange::Answered { status, body, .. } => ToolOutcome::Unknown {
                detail: format!(
                    "the service answered {}; {NOT_SENT_AGAIN}",
                    with_message(status, &body)
                ),
            },
            Exchange::TimedOut => ToolOutcome::Unknown {
                detail: format!("no answer within {timeout}; {NOT_SENT_AGAIN}"),
            },
            Exchange::Lost(why) => ToolOutcome::Unknown {
                detail: format!(
                    "the connection broke after the request was sent ({why}); {NOT_SENT_AGAIN}"
                ),
            },
        }
    }

    fn scrubbed(&self, endpoint: &Endpoint, outcome: ToolOutcome) -> ToolOutcome {
        match outcome {
            ToolOutcome::Succeeded { result } => ToolOutcome::Succeeded {
                result: endpoint.scrub_value(result),
            },
            ToolOutcome::Failed { error } => ToolOutcome::Failed {
                error: endpoint.scrub(&error),
            },
            ToolOutcome::Unknown { detail } => ToolOutcome::Unknown {
                detail: endpoint.scrub(&detail),
            },
        }
    }

    fn log(&self, purpose: &str, endpoint: &Endpoint, exchange: &Exchange, started: Instant) {
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let (tool, method, host) = (&self.spec.name, endpoint.method.as_str(), &endpoint.host);
        match exchange {
            Exchange::Answered { status, .. } => {
                tracing::info!(
                    tool,
                    purpose,
                    method,
                    host,
                    status = status.as_u16(),
                    elapsed_ms,
                    "http tool answered"
                );
            }
            Exchange::NotSent(_) | Exchange::TimedOut | Exchange::Lost(_) => {
                let what = match exchange {
                    Exchange::NotSent(_) => "not reached; nothing sent",
                    Exchange::TimedOut => "timed out",
                    _ => "connection lost after sending",
                };
                tracing::warn!(tool, purpose, method, host, elapsed_ms, "http tool {what}");
            }
        }
    }
}

impl fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTool")
            .field("name", &self.spec.name)
            .field("binding", &self.binding)
            .finish()
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        let endpoint = &self.binding.call;
        let started = Instant::now();
        let exchange = match send(self.client.get(), endpoint, &call).await {
            Ok(exchange) => exchange,
            Err(Unfillable(why)) => {
                tracing::warn!(tool = %self.spec.name, "http tool call could not be built; nothing sent");
                return ToolOutcome::Failed {
                    error: format!("{why}; nothing was sent"),
                };
            }
        };
        self.log("call", endpoint, &exchange, started);
        let outcome = self.outcome_of_call(exchange);
        self.scrubbed(endpoint, outcome)
    }

    fn reconciles(&self) -> bool {
        self.binding.reconcile.is_some()
    }

    async fn reconcile(&self, call: ToolCall<'_>) -> Option<ToolOutcome> {
        let endpoint = self.binding.reconcile.as_ref()?;
        let started = Instant::now();
        let exchange = match send(self.client.get(), endpoint, &call).await {
            Ok(exchange) => exchange,
            Err(Unfillable(why)) => {
                tracing::warn!(tool = %self.spec.name, %why, "http tool reconcile could not be built");
                return None;
            }
        };
        self.log("reconcile", endpoint, &exchange, started);
        let outcome = match exchange {
            Exchange::Answered { status, body, cut } if status.is_success() => match cut {
                Some(Cut::BrokeOff(_)) => return None,
                cut => ToolOutcome::Succeeded {
                    result: result_of(&body, cut.as_ref(), endpoint.max_response_bytes),
                },
            },
            Exchange::Answered { status, .. }
                if matches!(status, StatusCode::NOT_FOUND | StatusCode::GONE) =>
            {
                ToolOutcome::Failed {
                    error: format!(
                        "the service has no record of the call with key {} ({status}), so it did not take effect",
                        call.idempotency_key
                    ),
                }
            }
            _ => return None,
        };
        Some(self.scrubbed(endpoint, outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELD: &str = "tools.issue_refund.http";

    fn env(name: &str) -> Option<String> {
        match name {
            "ORDERS_URL" => Some("http://127.0.0.1:8790".into()),
            "ORDERS_TOKEN" => Some("s3cret-token".into()),
            "NOT_A_URL" => Some("ftp://files.example".into()),
            _ => None,
        }
    }

    fn binding(toml_text: &str) -> HttpBinding {
        toml::from_str(toml_text).unwrap()
    }

    fn refund() -> HttpBinding {
        binding(
            r#"
            method = "POST"
            url = "${ORDERS_URL}/orders/{order_id}/refunds"
            headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
            timeout = "10s"
            max_response_bytes = 65536

            [reconcile]
            method = "GET"
            url = "${ORDERS_URL}/refunds/by-key/{idempotency_key}"
            headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
            timeout = "5s"
            "#,
        )
    }

    /// `b` resolved against the test environment.
    fn resolved(b: HttpBinding) -> ResolvedHttp {
        b.resolve(FIELD, &env).unwrap()
    }

    fn error_of(b: &HttpBinding) -> String {
        b.resolve(FIELD, &env).unwrap_err().to_string()
    }

    /// The documented binding with each of `urls`: every one is refused, naming the URL's field
    /// and saying `says`. The errors, for more checks.
    fn refused_urls(urls: &[&str], says: &str) -> Vec<String> {
        let field = "tools.issue_refund.http.url: ";
        let refused = |url: &&str| {
            let error = error_with(|b| b.url = url.to_string());
            assert!(error.starts_with(field), "{url}: {error}");
            assert!(error.contains(says), "{url}: {error}");
            error
        };
        urls.iter().map(refused).collect()
    }

    /// The error the documented binding resolves to after `change`.
    fn error_with(change: impl FnOnce(&mut HttpBinding)) -> String {
        let mut b = refund();
        change(&mut b);
        error_of(&b)
    }

    fn args(value: Value) -> Args {
        Args::new(value).unwrap()
    }

    /// The URL `endpoint` sends a call of `value` to, under the idempotency key `key`.
    fn url_of(endpoint: &Endpoint, value: Value, key: &str) -> Url {
        endpoint.url_for(&args(value), key).unwrap()
    }

    #[test]
    fn the_documented_binding_resolves() {
        let resolved = resolved(refund());
        assert_eq!(resolved.method(), Method::POST);
        assert_eq!(resolved.host(), "127.0.0.1:8790");
        assert_eq!(resolved.timeout(), Duration::from_secs(10));
        assert!(resolved.has_reconcile());
        assert_eq!(
            resolved.reconcile.as_ref().unwrap().timeout,
            Duration::from_secs(5)
        );
        assert_eq!(resolved.path_arguments(), BTreeSet::from(["order_id"]));
    }

    #[test]
    fn defaults_apply_when_timeout_and_size_are_left_out() {
        let resolved = resolved(binding(
            r#"method = "get"
url = "https://orders.example/x""#,
        ));
        assert_eq!(resolved.method(), Method::GET);
        assert_eq!(resolved.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(resolved.call.max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES);
        assert!(!resolved.has_reconcile());
    }

    #[test]
    fn an_unknown_field_is_refused() {
        let error = toml::from_str::<HttpBinding>(
            "method = \"GET\"\nurl = \"https://x.example\"\nretries = 3\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("retries"), "{error}");
    }

    #[test]
    fn a_reconcile_with_a_reconcile_of_its_own_is_refused() {
        let error = toml::from_str::<HttpBinding>(
            "method = \"POST\"\nurl = \"https://x.example\"\n\
             [reconcile]\nmethod = \"GET\"\nurl = \"https://x.example/r\"\n\
             [reconcile.reconcile]\nmethod = \"GET\"\nurl = \"https://x.example/rr\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("a reconcile request has no reconcile of its own"),
            "{error}"
        );
    }

    #[test]
    fn an_unset_variable_names_the_field_and_the_variable() {
        let mut b = refund();
        b.headers
            .0
            .insert("Authorization".into(), "Bearer ${NO_TOKEN}".into());
        assert_eq!(
            error_of(&b),
            "tools.issue_refund.http.headers.Authorization: the environment variable NO_TOKEN is not set"
        );
        let mut b = refund();
        b.reconcile.as_mut().unwrap().url = "${NO_URL}/refunds".into();
        let error = b.resolve(FIELD, &env).unwrap_err();
        assert_eq!(error.field(), "tools.issue_refund.http.reconcile.url");
        assert!(error.to_string().contains("NO_URL"), "{error}");
    }

    #[test]
    fn a_bad_method_names_the_field() {
        let mut b = refund();
        b.method = "FETCH".into();
        assert_eq!(
            error_of(&b),
            "tools.issue_refund.http.method: \"FETCH\" is not one of GET, POST, PUT, PATCH, DELETE"
        );
    }

    #[test]
    fn a_url_that_is_not_http_after_expansion_names_the_field_and_hides_the_value() {
        let urls = [
            "${NOT_A_URL}/x",
            "orders/{order_id}",
            "http://",
            "file:///etc/passwd",
        ];
        for error in refused_urls(&urls, "url: is not an http:// or https://") {
            assert!(!error.contains("files.example"), "{error}");
        }
    }

    #[test]
    fn timeouts_must_parse_and_stay_within_a_minute() {
        for (text, says) in [
            ("soon", "is not a duration"),
            ("61s", "at most 1m"),
            ("0s", "more than 0"),
        ] {
            let error = error_with(|b| b.timeout = Some(text.into()));
            assert!(
                error.starts_with("tools.issue_refund.http.timeout: "),
                "{error}"
            );
            assert!(error.contains(says), "{error}");
        }
        let mut b = refund();
        b.reconcile.as_mut().unwrap().timeout = Some("2m".into());
        assert!(error_of(&b).starts_with("tools.issue_refund.http.reconcile.timeout: "));
    }

    #[test]
    fn the_response_cap_is_at_most_one_mebibyte() {
        let mut b = refund();
        b.max_response_bytes = Some(2 * 1024 * 1024);
        assert!(error_of(&b).starts_with("tools.issue_refund.http.max_response_bytes: "));
        b.max_response_bytes = Some(0);
        assert!(error_of(&b).starts_with("tools.issue_refund.http.max_response_bytes: "));
    }

    #[test]
    fn malformed_placeholders_name_the_field() {
        let urls = [
            "https://x.example/orders/{order_id",
            "https://x.example/orders/order_id}",
            "https://x.example/orders/{}",
            "https://x.example/orders/{order-id}",
            "https://x.example/orders/{1st}",
        ];
        refused_urls(&urls, "placeholder");
    }

    #[test]
    fn placeholders_stand_only_in_the_path() {
        let urls = [
            "https://{host}.example/orders",
            "https://x.example/orders?id={order_id}",
            "https://x.example/orders#{order_id}",
        ];
        refused_urls(&urls, "only in the URL's path");
    }

    #[test]
    fn reserved_and_invalid_headers_are_refused() {
        let mut b = refund();
        b.headers.0.insert("Idempotency-Key".into(), "mine".into());
        assert_eq!(
            error_of(&b),
            "tools.issue_refund.http.headers.Idempotency-Key: Countersign sets this header itself"
        );
        let mut b = refund();
        b.headers.0.insert("authorization".into(), "Basic x".into());
        let error = b.resolve(FIELD, &env).unwrap_err();
        assert!(
            error
                .field()
                .starts_with("tools.issue_refund.http.headers."),
            "{error}"
        );
        assert!(error.to_string().contains("same header"), "{error}");
        let mut b = refund();
        b.headers.0.insert("Bad Name".into(), "x".into());
        assert!(error_of(&b).starts_with("tools.issue_refund.http.headers.Bad Name: "));
        let mut b = refund();
        b.headers.0.insert("X-Note".into(), "line\nbreak".into());
        assert!(error_of(&b).starts_with("tools.issue_refund.http.headers.X-Note: "));
    }

    #[test]
    fn path_arguments_are_encoded_as_one_segment() {
        let resolved = resolved(refund());
        let url = url_of(
            &resolved.call,
            json!({"order_id": "ord/55 ?#é", "amount_cents": 7500}),
            "act-1:2",
        );
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8790/orders/ord%2F55%20%3F%23%C3%A9/refunds"
        );
        let url = url_of(&resolved.call, json!({"order_id": 55}), "act-1:2");
        assert_eq!(url.path(), "/orders/55/refunds");
        let lookup = resolved.reconcile.as_ref().unwrap();
        let url = url_of(lookup, json!({"order_id": "ord_55"}), "act-1:2");
        assert_eq!(url.path(), "/refunds/by-key/act-1%3A2");
        assert_eq!(url.query(), Some("order_id=ord_55"));
    }

    #[test]
    fn a_missing_or_unusable_path_argument_fails_before_sending() {
        let resolved = resolved(refund());
        let url = |value: Value| resolved.call.url_for(&args(value), "act-1:1");
        assert_eq!(
            url(json!({"amount_cents": 1})).unwrap_err(),
            Unfillable("the call has no argument `order_id` to fill the URL with".into())
        );
        assert!(
            url(json!({"order_id": true}))
                .unwrap_err()
                .0
                .contains("string or an integer")
        );
        assert!(
            url(json!({"order_id": 1.5}))
                .unwrap_err()
                .0
                .contains("string or an integer")
        );
        for dots in ["", ".", ".."] {
            assert!(
                url(json!({"order_id": dots}))
                    .unwrap_err()
                    .0
                    .contains("cannot be empty")
            );
        }
    }

    #[test]
    fn get_sends_unused_arguments_as_query_parameters() {
        let resolved = resolved(binding(
            r#"method = "GET"
url = "https://orders.example/orders/{order_id}?v=1""#,
        ));
        let url = url_of(
            &resolved.call,
            json!({"order_id": "ord_55", "q": "a&b", "n": 3, "skip": null}),
            "k:1",
        );
        assert_eq!(url.path(), "/orders/ord_55");
        assert_eq!(url.query(), Some("v=1&n=3&q=a%26b"));
    }

    #[test]
    fn debug_output_never_shows_header_values_or_a_url_from_the_environment() {
        let resolved = resolved(refund());
        let tool = HttpTool::new(
            ToolSpec {
                name: "issue_refund".into(),
                description: "Refund an order.".into(),
                input_schema: json!({"type": "object"}),
            },
            resolved.clone(),
            SharedClient::default(),
        );
        for text in [format!("{resolved:?}"), format!("{tool:?}")] {
            assert!(!text.contains("s3cret"), "{text}");
            assert!(!text.contains("http://127.0.0.1:8790/"), "{text}");
            assert!(
                text.contains("${ORDERS_URL}/orders/{order_id}/refunds"),
                "{text}"
            );
            assert!(
                text.contains("Authorization") || text.contains("authorization"),
                "{text}"
            );
            assert!(text.contains("127.0.0.1:8790"), "{text}");
        }
        let raw = format!("{:?}", refund());
        assert!(!raw.contains("Bearer"), "{raw}");
    }

    #[test]
    fn answers_are_scrubbed_of_the_header_secrets() {
        let resolved = resolved(refund());
        let scrubbed = resolved
            .call
            .scrub_value(json!({"echo": ["Bearer s3cret-token"]}));
        assert_eq!(scrubbed, json!({"echo": ["Bearer [redacted]"]}));
    }

    #[test]
    fn refusal_messages_are_found_and_cut_short() {
        assert_eq!(
            message_of(br#"{"error": "amount too high"}"#),
            "amount too high"
        );
        assert_eq!(
            message_of(br#"{"error": {"message": "no such order"}}"#),
            "no such order"
        );
        assert_eq!(message_of(b"plain words"), "plain words");
        let long = "x".repeat(1000);
        assert_eq!(
            message_of(long.as_bytes()).chars().count(),
            MAX_ERROR_TEXT + 1
        );
    }

    #[test]
    fn a_cut_body_keeps_whole_characters_and_says_it_was_cut() {
        let body = "é".as_bytes();
        assert_eq!(text_of(&body[..1]), "");
        let result = result_of(b"{\"a\":", Some(&Cut::TooLong), 5);
        assert_eq!(result["body"], "{\"a\":");
        assert!(
            result["cut"]
                .as_str()
                .unwrap()
                .contains("longer than 5 bytes")
        );
        assert_eq!(result_of(b"not json", None, 64), json!("not json"));
        assert_eq!(result_of(b"", None, 64), Value::Null);
    }
}
