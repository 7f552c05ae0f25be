//! A tool bound to an HTTP endpoint: the `http` binding of an agent definition. What a service
//! must do to be bound this way is docs/services.md.
//!
//! ```toml
//! [tools.issue_refund.http]
//! method = "POST"                     # GET, POST, PUT, PATCH, DELETE
//! url = "${ORDERS_URL}/orders/{order_id}/refunds"
//! headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
//! timeout = "10s"                     # optional, default 10s, at most 60s
//! max_response_bytes = 65536          # optional, default 64 KiB, at most 1 MiB
//!
//! [tools.issue_refund.http.reconcile]  # optional: the lookup
//! method = "GET"
//! url = "${ORDERS_URL}/refunds/by-key/{idempotency_key}"
//! headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
//! timeout = "5s"
//! not_found = "did_not_take_effect"   # optional, default "ask_again"
//! give_up_after = "24h"               # optional, default 24h, 1 minute to 30 days
//! query = ["order_id"]                # optional: arguments sent as query parameters
//! ```
//!
//! The contract:
//! - `${VAR}` in the URL and in header values is filled from the environment when the binding
//!   is resolved, at start-up; an unset variable fails at once, naming the field (a process
//!   that runs no tools binds the tool as one it cannot run instead: `agents/wiring.rs`). A URL
//!   with credentials (`http://user:password@host`) is refused: they belong in a header.
//! - `{name}` in the URL's path is filled from the call's top-level argument `name` (a string or
//!   an integer), percent-encoded as one path segment, `:` left as is (RFC 3986 allows it in a
//!   segment); `{idempotency_key}` is the call's key, `act_…:1` as is. A missing argument fails
//!   the call before anything is sent. Placeholders live in the path only.
//! - POST, PUT and PATCH send the exact approved arguments as the JSON body; GET and DELETE send
//!   no body, and the arguments the path does not use go as query parameters. Every request
//!   carries `Idempotency-Key: <action_id>:<version>`, `Accept: application/json`,
//!   `Content-Type: application/json` when it has a body, and the configured headers.
//! - 2xx: succeeded, with the body as the result (JSON, or a JSON string when it is not JSON,
//!   `null` when empty). At most `max_response_bytes` are kept; a longer body is cut and the
//!   result says so (`{"body": "<the first bytes>", "cut": "<why>"}`), as does a 2xx body that
//!   breaks off (the status already said the call took effect).
//! - 4xx other than 408, 425 and 429: failed, with the status and the body's error message; the
//!   model reads it as a plain result.
//! - 408, 425, 429, 5xx, 3xx (redirects are never followed), a timeout, or a connection lost
//!   after the request was sent: unknown. The call may have taken effect, so it is never sent
//!   again; the sweep asks the reconcile lookup, or a person decides.
//! - No connection at all (refused, DNS failure): failed, saying nothing was sent. A timeout
//!   while still connecting counts as a timeout (unknown): the conservative reading.
//! - The lookup sends no body, whatever its method, and the same `Idempotency-Key` header; the
//!   call's arguments reach it only through its path's placeholders and the ones its `query`
//!   names. 2xx: the call took effect, with that body as its result. 404 or 410: it did not
//!   take effect, only where the binding says `not_found = "did_not_take_effect"` (the
//!   service's promise that a key it answered 404 for never takes effect later). Any other
//!   answer, a timeout or no connection: not known yet. The sweep asks again, and once
//!   `give_up_after` has passed since the outcome became unknown, a person of the agent's
//!   recovery owner role decides (without one, the sweep keeps asking).
//! - Secrets: every header value (and the credentials after its scheme word, as in
//!   `Bearer <token>`) and every value a `${VAR}` filled in, the URL's included, never appear
//!   in a result, an error, a log line or `Debug` output, in any form the wire gives them
//!   ([`Secrets`]). They are redacted from what the service answers before it is cut to size,
//!   so a cut never keeps a secret's first bytes. Logs name only the tool, method, host,
//!   status and time taken.

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
use super::secrets::{REDACTED, Secrets};
use crate::adapters::env_template::Filling;
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
/// How long the sweep keeps asking the lookup before a person decides, unless the binding says:
/// a day covers a service's nightly batch and an outage of a working day.
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 60 * 60);
/// The bounds of `give_up_after`: at least one more ask, at most a month of asking.
pub const MIN_GIVE_UP_AFTER: Duration = Duration::from_secs(60);
pub const MAX_GIVE_UP_AFTER: Duration = Duration::from_secs(30 * 24 * 60 * 60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of a refusal's message the model reads.
const MAX_ERROR_TEXT: usize = 300;
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
    /// How to ask, with the same key, whether a call whose outcome is unknown took effect.
    pub reconcile: Option<Box<ReconcileBinding>>,
}

/// The lookup of an HTTP binding, as written: "did the call with this key take effect?" Its
/// request's fields are the call's, written again: serde's `flatten` cannot refuse unknown ones.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileBinding {
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Headers,
    pub timeout: Option<String>,
    pub max_response_bytes: Option<u64>,
    /// What a 404 or 410 from the lookup means.
    #[serde(default)]
    pub not_found: NotFound,
    /// How long the sweep keeps asking before a person decides: a duration such as `24h`.
    pub give_up_after: Option<String>,
    /// The call's arguments the lookup sends as query parameters; none unless named.
    #[serde(default)]
    pub query: Vec<String>,
}

/// What a lookup's 404 or 410 says about the call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotFound {
    /// Nothing yet: the service may not have the call's effect recorded yet, or at this path.
    #[default]
    AskAgain,
    /// It did not take effect, and never will: the service voids a key its lookup did not find.
    DidNotTakeEffect,
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

/// What a call and its lookup both write: one request.
struct Request<'a> {
    method: &'a str,
    url: &'a str,
    headers: &'a Headers,
    timeout: Option<&'a str>,
    max_response_bytes: Option<u64>,
}

impl HttpBinding {
    /// Fills `${VAR}` from `env` and checks everything that can be checked before a call.
    /// `field` is where the binding sits in its file, such as `tools.issue_refund.http`.
    pub fn resolve(&self, field: &str, env: Lookup<'_>) -> Result<ResolvedHttp, BindingError> {
        let request = Request {
            method: &self.method,
            url: &self.url,
            headers: &self.headers,
            timeout: self.timeout.as_deref(),
            max_response_bytes: self.max_response_bytes,
        };
        let mut call = Endpoint::resolve(field, &request, env)?;
        let mut reconcile = match &self.reconcile {
            Some(r) => Some(r.resolve(&format!("{field}.reconcile"), env)?),
            None => None,
        };
        // Either request's secrets may come back in the other's answer (a stored request).
        if let Some(lookup) = &mut reconcile {
            let all = call.secrets.merged(&lookup.endpoint.secrets);
            lookup.endpoint.secrets = all.clone();
            call.secrets = all;
        }
        Ok(ResolvedHttp { call, reconcile })
    }
}

impl ReconcileBinding {
    fn resolve(&self, field: &str, env: Lookup<'_>) -> Result<KeyLookup, BindingError> {
        let request = Request {
            method: &self.method,
            url: &self.url,
            headers: &self.headers,
            timeout: self.timeout.as_deref(),
            max_response_bytes: self.max_response_bytes,
        };
        let mut endpoint = Endpoint::resolve(field, &request, env)?;
        let query_field = format!("{field}.query");
        for (at, name) in self.query.iter().enumerate() {
            if !is_argument_name(name) || name == KEY_PLACEHOLDER {
                return Err(BindingError::invalid(
                    &query_field,
                    format!("{name:?} is not an argument name (letters, digits and _)"),
                ));
            }
            if self.query[..at].contains(name) {
                return Err(BindingError::invalid(
                    &query_field,
                    format!("names {name} twice"),
                ));
            }
        }
        endpoint.arguments = Arguments::Query(self.query.clone());
        let give_up_after = match self.give_up_after.as_deref() {
            None => DEFAULT_GIVE_UP_AFTER,
            Some(text) => parse_duration(
                &format!("{field}.give_up_after"),
                text,
                MIN_GIVE_UP_AFTER,
                MAX_GIVE_UP_AFTER,
            )?,
        };
        Ok(KeyLookup {
            endpoint,
            not_found: self.not_found,
            give_up_after,
        })
    }
}

/// A binding ready to call: the environment filled in, everything checked.
#[derive(Debug, Clone)]
pub struct ResolvedHttp {
    call: Endpoint,
    reconcile: Option<KeyLookup>,
}

/// The lookup, ready to ask.
#[derive(Debug, Clone)]
struct KeyLookup {
    endpoint: Endpoint,
    not_found: NotFound,
    give_up_after: Duration,
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

    /// The arguments the binding names, each with the field naming it (`url`, `reconcile.url`,
    /// `reconcile.query`), without `idempotency_key`: a definition can check each against the
    /// tool's input schema.
    pub fn named_arguments(&self) -> Vec<(&'static str, &str)> {
        let mut named: Vec<(&'static str, &str)> =
            self.call.path_arguments().map(|a| ("url", a)).collect();
        if let Some(lookup) = &self.reconcile {
            named.extend(
                lookup
                    .endpoint
                    .path_arguments()
                    .map(|a| ("reconcile.url", a)),
            );
            if let Arguments::Query(names) = &lookup.endpoint.arguments {
                named.extend(names.iter().map(|n| ("reconcile.query", n.as_str())));
            }
        }
        named
    }
}

/// One part of a URL template: text as is, or a placeholder filled per call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Arg(String),
}

/// Where a request carries the call's arguments, besides its path's placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Arguments {
    /// The exact arguments as the JSON body: a call by POST, PUT or PATCH.
    Body,
    /// Every argument the path does not use, as query parameters: a call by GET or DELETE.
    RestAsQuery,
    /// Only these, as query parameters: a lookup, which names them or sends none.
    Query(Vec<String>),
}

#[derive(Clone)]
struct Endpoint {
    method: Method,
    pieces: Vec<Piece>,
    arguments: Arguments,
    /// The URL as the file writes it, `${VAR}` unfilled: what `Debug` shows.
    written: String,
    headers: HeaderMap,
    timeout: Duration,
    max_response_bytes: usize,
    host: String,
    secrets: Secrets,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers = redacted(self.headers.keys().map(HeaderName::as_str));
        f.debug_struct("Endpoint")
            .field("method", &self.method)
            .field("url", &self.written)
            .field("host", &self.host)
            .field("headers", &headers)
            .field("arguments", &self.arguments)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Endpoint {
    /// The arguments its URL's path names, without `idempotency_key`.
    fn path_arguments(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Arg(name) if name != KEY_PLACEHOLDER => Some(name.as_str()),
            _ => None,
        })
    }

    fn resolve(field: &str, request: &Request<'_>, env: Lookup<'_>) -> Result<Self, BindingError> {
        let method = parse_method(&format!("{field}.method"), request.method)?;

        let url_field = format!("{field}.url");
        let url_from_env = env_template::mentions_env(request.url);
        let mut secrets = Secrets::default();
        let url =
            env_template::expand_into(request.url, &url_field, env, &mut secrets, Filling::Text)?;
        let pieces = parse_template(&url, &url_field, !url_from_env)?;
        let host = check_url(&pieces, &url_field)?;

        let mut headers = HeaderMap::new();
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
            let text = env_template::expand_into(
                value,
                &header_field,
                env,
                &mut secrets,
                Filling::Credential,
            )?;
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                BindingError::invalid(
                    &header_field,
                    "its value is not a valid HTTP header value (control characters or non-ASCII)",
                )
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
            secrets.add_header(&text);
        }

        let timeout = match request.timeout {
            None => DEFAULT_TIMEOUT,
            Some(text) => parse_duration(
                &format!("{field}.timeout"),
                text,
                Duration::ZERO,
                MAX_TIMEOUT,
            )?,
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
        let arguments = match has_body(&method) {
            true => Arguments::Body,
            false => Arguments::RestAsQuery,
        };
        Ok(Self {
            method,
            pieces,
            arguments,
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

/// A duration such as `10s`, more than zero, at least `shortest` and at most `longest`.
pub(crate) fn parse_duration(
    field: &str,
    text: &str,
    shortest: Duration,
    longest: Duration,
) -> Result<Duration, BindingError> {
    let duration = humantime::parse_duration(text).map_err(|e| {
        BindingError::invalid(
            field,
            format!("{text:?} is not a duration such as \"10s\" or \"500ms\": {e}"),
        )
    })?;
    if duration.is_zero() || duration < shortest || duration > longest {
        let lower = match shortest.is_zero() {
            true => "more than 0".to_string(),
            false => format!("at least {}", humantime::format_duration(shortest)),
        };
        return Err(BindingError::invalid(
            field,
            format!(
                "{text:?} must be {lower} and at most {}",
                humantime::format_duration(longest)
            ),
        ));
    }
    Ok(duration)
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
        if !is_argument_name(name) {
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

/// Whether `name` can name a top-level argument: a letter or `_`, then letters, digits, `_`.
fn is_argument_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
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
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BindingError::invalid(
            field,
            "carries credentials (user:password@ before the host), which would be sent as \
             Basic auth where nothing can keep them out of what is stored; send them in a \
             header instead, such as headers = { Authorization = \"Basic ${ORDERS_BASIC_AUTH}\" }",
        ));
    }
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

/// Percent-encodes `value` as one path segment: everything but RFC 3986's unreserved bytes and
/// `:`, which a segment may hold as is. A key `act_…:1` then reaches a service that does not
/// decode its path as the key it was sent in the header.
fn encode_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
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
    /// The URL of one call: placeholders filled, and the query parameters its arguments say.
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
        // A value that is not a string goes as its canonical JSON, keys sorted.
        let as_text = |value: &Value| match value {
            Value::String(s) => s.clone(),
            other => crate::domain::args::canonical(other),
        };
        let query: Vec<(String, String)> = match &self.arguments {
            Arguments::Body => Vec::new(),
            // By name, so the same arguments always make the same URL.
            Arguments::RestAsQuery => {
                let mut rest: Vec<(String, String)> = args
                    .fields()
                    .iter()
                    .filter(|(name, value)| !used.contains(name.as_str()) && !value.is_null())
                    .map(|(name, value)| (name.clone(), as_text(value)))
                    .collect();
                rest.sort();
                rest
            }
            Arguments::Query(names) => names
                .iter()
                .filter_map(|name| {
                    let value = args.get(name).filter(|v| !v.is_null())?;
                    Some((name.clone(), as_text(value)))
                })
                .collect(),
        };
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
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
    if endpoint.arguments == Arguments::Body {
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
    // Past the limit by a secret's longest form, so one crossing the cut is redacted before it.
    let read = limit + endpoint.secrets.reach();
    let mut body = Vec::new();
    let cut = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = read - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    break Some(Cut::TooLong);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) if body.len() > limit => break Some(Cut::TooLong),
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

/// A 2xx body as a result: its JSON, or its text as a JSON string; a cut body says so. Secrets
/// are scrubbed before the cut to `limit` bytes.
fn result_of(body: &[u8], cut: Option<&Cut>, limit: usize, secrets: &Secrets) -> Value {
    match cut {
        None if body.is_empty() => Value::Null,
        None => match serde_json::from_slice(body) {
            Ok(value) => secrets.redact_value(value),
            Err(_) => Value::String(secrets.redact(&text_of(body))),
        },
        Some(Cut::TooLong) => json!({
            "body": secrets.redact_then_cut(&text_of(body), limit),
            "cut": format!("the response was longer than {limit} bytes; only the first {limit} are kept"),
        }),
        Some(Cut::BrokeOff(why)) => json!({
            "body": secrets.redact_then_cut(&text_of(body), limit),
            "cut": format!("the response broke off after {} bytes: {why}", body.len()),
        }),
    }
}

/// The error message of a refusal's body, scrubbed and then cut short: a JSON `error`,
/// `error.message`, `message`, `detail` or `title`, or else the body's text (a cut body's, cut
/// at `limit` bytes after scrubbing).
fn message_of(body: &[u8], cut: Option<&Cut>, limit: usize, secrets: &Secrets) -> String {
    let text = match (cut, serde_json::from_slice::<Value>(body)) {
        (Some(_), _) => secrets.redact_then_cut(&text_of(body), limit),
        (None, Ok(value)) => {
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
            secrets.redact(&found.unwrap_or_else(|| value.to_string()))
        }
        (None, Err(_)) => secrets.redact(&text_of(body)),
    };
    let text = text.trim();
    match text.char_indices().nth(MAX_ERROR_TEXT) {
        Some((at, _)) => format!("{}…", secrets.without_partial_tail(&text[..at])),
        None => text.to_string(),
    }
}

/// `status: message` of an answer that is not a success, as the model and the audit read it.
fn with_message(status: StatusCode, body: &[u8], cut: Option<&Cut>, endpoint: &Endpoint) -> String {
    let message = message_of(body, cut, endpoint.max_response_bytes, &endpoint.secrets);
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
                    result: result_of(
                        &body,
                        cut.as_ref(),
                        endpoint.max_response_bytes,
                        &endpoint.secrets,
                    ),
                }
            }
            Exchange::Answered { status, body, cut }
                if status.is_client_error() && !matches!(status.as_u16(), 408 | 425 | 429) =>
            {
                ToolOutcome::Failed {
                    error: format!(
                        "the service refused the call ({})",
                        with_message(status, &body, cut.as_ref(), endpoint)
                    ),
                }
            }
            Exchange::Answered { status, .. } if status.is_redirection() => ToolOutcome::Unknown {
                detail: format!(
                    "the service answered with a redirect ({status}), which is never followed; {NOT_SENT_AGAIN}"
                ),
            },
            Exchange::Answered { status, body, cut } => ToolOutcome::Unknown {
                detail: format!(
                    "the service answered {}; {NOT_SENT_AGAIN}",
                    with_message(status, &body, cut.as_ref(), endpoint)
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
        endpoint.secrets.redact_outcome(outcome)
    }

    fn reconciles(&self) -> bool {
        self.binding.reconcile.is_some()
    }

    /// A GET changes nothing at the service, as HTTP means it.
    fn reads_only(&self) -> bool {
        self.binding.call.method == Method::GET
    }

    fn gives_up_after(&self) -> Option<Duration> {
        self.binding.reconcile.as_ref().map(|l| l.give_up_after)
    }

    async fn reconcile(&self, call: ToolCall<'_>) -> Option<ToolOutcome> {
        let lookup = self.binding.reconcile.as_ref()?;
        let endpoint = &lookup.endpoint;
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
                    result: result_of(
                        &body,
                        cut.as_ref(),
                        endpoint.max_response_bytes,
                        &endpoint.secrets,
                    ),
                },
            },
            Exchange::Answered { status, .. }
                if matches!(status, StatusCode::NOT_FOUND | StatusCode::GONE) =>
            {
                match lookup.not_found {
                    NotFound::DidNotTakeEffect => ToolOutcome::Failed {
                        error: format!(
                            "the service has no record of the call with key {} ({status}) and says it never will, so it did not take effect",
                            call.idempotency_key
                        ),
                    },
                    // Said on purpose only: a lookup at the wrong path answers 404 too.
                    NotFound::AskAgain => {
                        tracing::info!(tool = %self.spec.name, %status, "the lookup has no record of the key yet; asking again later");
                        return None;
                    }
                }
            }
            _ => return None,
        };
        Some(endpoint.secrets.redact_outcome(outcome))
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

    /// Why `text` does not parse as a `T`.
    fn parse_error<T: serde::de::DeserializeOwned + fmt::Debug>(text: &str) -> String {
        toml::from_str::<T>(text).unwrap_err().to_string()
    }

    /// The documented binding after each `change` is refused at `field`, saying `says`.
    fn refused_at<C: FnOnce(&mut HttpBinding)>(
        field: &str,
        changes: impl IntoIterator<Item = (C, &'static str)>,
    ) {
        for (change, says) in changes {
            let error = error_with(change);
            assert!(error.starts_with(&format!("{FIELD}.{field}: ")), "{error}");
            assert!(error.contains(says), "{error}");
        }
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

    /// The path and the query `endpoint` fills in from the arguments `value` and `key`.
    fn filled(endpoint: &Endpoint, value: Value, key: &str) -> (String, Option<String>) {
        let url = url_of(endpoint, value, key);
        (url.path().to_string(), url.query().map(str::to_string))
    }

    #[test]
    fn the_documented_binding_resolves() {
        let resolved = resolved(refund());
        assert_eq!(resolved.method(), Method::POST);
        assert_eq!(resolved.host(), "127.0.0.1:8790");
        assert_eq!(resolved.timeout(), Duration::from_secs(10));
        assert!(resolved.has_reconcile());
        let lookup = resolved.reconcile.as_ref().unwrap();
        assert_eq!(lookup.endpoint.timeout, Duration::from_secs(5));
        assert_eq!(lookup.not_found, NotFound::AskAgain);
        assert_eq!(lookup.give_up_after, DEFAULT_GIVE_UP_AFTER);
        assert_eq!(lookup.endpoint.arguments, Arguments::Query(Vec::new()));
        assert_eq!(resolved.named_arguments(), [("url", "order_id")]);
    }

    #[test]
    fn a_lookup_says_what_404_means_how_long_to_ask_and_which_arguments_it_sends() {
        let mut b = refund();
        let lookup = b.reconcile.as_mut().unwrap();
        lookup.not_found = NotFound::DidNotTakeEffect;
        lookup.give_up_after = Some("2h".into());
        lookup.query = vec!["order_id".into()];
        let resolved = resolved(b);
        let lookup = resolved.reconcile.as_ref().unwrap();
        assert_eq!(lookup.not_found, NotFound::DidNotTakeEffect);
        assert_eq!(lookup.give_up_after, Duration::from_secs(2 * 3600));
        assert_eq!(
            resolved.named_arguments(),
            [("url", "order_id"), ("reconcile.query", "order_id")]
        );

        let written: ReconcileBinding = toml::from_str(
            "method = \"GET\"\nurl = \"https://x.example/k/{idempotency_key}\"\n\
             not_found = \"did_not_take_effect\"\ngive_up_after = \"3d\"\nquery = [\"a\"]\n",
        )
        .unwrap();
        assert_eq!(written.not_found, NotFound::DidNotTakeEffect);
        let error = parse_error::<ReconcileBinding>(
            "method = \"GET\"\nurl = \"https://x.example\"\nnot_found = \"failed\"\n",
        );
        assert!(error.contains("did_not_take_effect"), "{error}");
    }

    #[test]
    fn a_bad_give_up_after_or_query_names_the_field() {
        let patience = |text: &'static str| {
            move |b: &mut HttpBinding| {
                b.reconcile.as_mut().unwrap().give_up_after = Some(text.into())
            }
        };
        refused_at(
            "reconcile.give_up_after",
            [
                (patience("soon"), "is not a duration"),
                (patience("30s"), "at least 1m"),
                (patience("31days"), "at most 30days"),
            ],
        );
        let query = |names: &'static [&'static str]| {
            move |b: &mut HttpBinding| {
                b.reconcile.as_mut().unwrap().query = names.iter().map(|n| n.to_string()).collect()
            }
        };
        refused_at(
            "reconcile.query",
            [
                (query(&["order-id"]), "is not an argument name"),
                (query(&["idempotency_key"]), "is not an argument name"),
                (query(&["a", "a"]), "names a twice"),
            ],
        );
    }

    #[test]
    fn an_unknown_field_a_reconcile_only_field_on_the_call_or_a_nested_reconcile_is_refused() {
        let cases = [
            (
                "method = \"GET\"\nurl = \"https://x.example\"\nretries = 3\n",
                "retries",
            ),
            (
                "method = \"POST\"\nurl = \"https://x.example\"\nnot_found = \"did_not_take_effect\"\n",
                "not_found",
            ),
            (
                "method = \"POST\"\nurl = \"https://x.example\"\n\
                 [reconcile]\nmethod = \"GET\"\nurl = \"https://x.example/r\"\n\
                 [reconcile.reconcile]\nmethod = \"GET\"\nurl = \"https://x.example/rr\"\n",
                "unknown field `reconcile`",
            ),
        ];
        each_says(cases, |binding| parse_error::<HttpBinding>(binding));
    }

    /// Each case's refusal says what the case pairs it with.
    #[track_caller]
    fn each_says<T: std::fmt::Display>(
        cases: impl IntoIterator<Item = (T, &'static str)>,
        refusal: impl Fn(&T) -> String,
    ) {
        for (case, says) in cases {
            let said = refusal(&case);
            assert!(said.contains(says), "{case}: {said}");
        }
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
        let timeout = |text: &'static str| move |b: &mut HttpBinding| b.timeout = Some(text.into());
        refused_at(
            "timeout",
            [
                (timeout("soon"), "is not a duration"),
                (timeout("61s"), "at most 1m"),
                (timeout("0s"), "more than 0"),
            ],
        );
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
        for (order_id, path) in [
            (json!(55), "/orders/55/refunds"),
            (json!("ord:55"), "/orders/ord:55/refunds"),
        ] {
            let (filled, _) = filled(&resolved.call, json!({ "order_id": order_id }), "act-1:2");
            assert_eq!(filled, path);
        }
    }

    #[test]
    fn the_lookup_puts_the_key_in_its_path_as_is_and_sends_only_the_arguments_it_names() {
        let lookup = &resolved(refund()).reconcile.unwrap().endpoint;
        let args = json!({"order_id": "ord 55", "amount_cents": 1});
        assert_eq!(
            filled(lookup, args.clone(), "act-1:2"),
            ("/refunds/by-key/act-1:2".into(), None)
        );

        let mut b = refund();
        b.reconcile.as_mut().unwrap().query = vec!["order_id".into(), "note".into()];
        let lookup = &resolved(b).reconcile.unwrap().endpoint;
        assert_eq!(
            filled(lookup, args, "act-1:2"),
            (
                "/refunds/by-key/act-1:2".into(),
                Some("order_id=ord+55".into())
            )
        );
    }

    #[test]
    fn a_missing_or_unusable_path_argument_fails_before_sending() {
        let resolved = resolved(refund());
        let url = |value: Value| resolved.call.url_for(&args(value), "act-1:1");
        assert_eq!(
            url(json!({"amount_cents": 1})).unwrap_err(),
            Unfillable("the call has no argument `order_id` to fill the URL with".into())
        );
        let cases = [
            (json!(true), "string or an integer"),
            (json!(1.5), "string or an integer"),
            (json!(""), "cannot be empty"),
            (json!("."), "cannot be empty"),
            (json!(".."), "cannot be empty"),
        ];
        each_says(cases, |order_id| {
            url(json!({ "order_id": order_id })).unwrap_err().0
        });
    }

    #[test]
    fn get_sends_unused_arguments_as_query_parameters() {
        let resolved = resolved(binding(
            r#"method = "GET"
url = "https://orders.example/orders/{order_id}?v=1""#,
        ));
        let args = json!({"order_id": "ord_55", "q": "a&b", "n": 3, "skip": null});
        assert_eq!(
            filled(&resolved.call, args, "k:1"),
            ("/orders/ord_55".into(), Some("v=1&n=3&q=a%26b".into()))
        );
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
    fn answers_are_redacted_of_the_header_secrets() {
        let resolved = resolved(refund());
        let redacted = resolved
            .call
            .secrets
            .redact_value(json!({"echo": ["Bearer s3cret-token", "s3cret-token"]}));
        assert_eq!(redacted, json!({"echo": ["[redacted]", "${ORDERS_TOKEN}"]}));
    }

    #[test]
    fn every_header_value_and_every_filled_variable_is_a_secret() {
        let resolved = resolved(binding(
            r#"
            method = "GET"
            url = "${ORDERS_URL}/x?k=${ORDERS_TOKEN}"
            headers = { X-Literal = "literal-secret-value-123", Authorization = "Basic dXNlcjpwdw==" }
            "#,
        ));
        let secrets = &resolved.call.secrets;
        for (secret, shown) in [
            ("http://127.0.0.1:8790", "${ORDERS_URL}"),
            ("s3cret-token", "${ORDERS_TOKEN}"),
            ("literal-secret-value-123", REDACTED),
            ("Basic dXNlcjpwdw==", REDACTED),
            ("dXNlcjpwdw==", REDACTED),
            // The Basic credentials decoded: `user:pw`.
            ("user:pw", REDACTED),
        ] {
            assert_eq!(secrets.redact(secret), shown, "{secret}");
        }
    }

    #[test]
    fn the_call_and_its_lookup_redact_each_others_secrets() {
        let mut b = refund();
        b.headers
            .0
            .insert("X-Call-Only".into(), "call-only-secret".into());
        let resolved = resolved(b);
        let lookup = &resolved.reconcile.as_ref().unwrap().endpoint.secrets;
        assert_eq!(lookup.redact("call-only-secret"), REDACTED);
    }

    #[test]
    fn url_credentials_are_refused_without_showing_them() {
        let errors = refused_urls(
            &[
                "http://user:pw-123@orders.example/x",
                "https://only-user@orders.example/x",
            ],
            "carries credentials",
        );
        for error in errors {
            assert!(
                !error.contains("pw-123") && !error.contains("only-user"),
                "{error}"
            );
            assert!(error.contains("header"), "{error}");
        }
        let mut b = refund();
        b.reconcile.as_mut().unwrap().url = "http://u:p@orders.example/{idempotency_key}".into();
        let error = b.resolve(FIELD, &env).unwrap_err();
        assert_eq!(error.field(), "tools.issue_refund.http.reconcile.url");
    }

    #[test]
    fn a_cut_is_made_after_redacting_so_it_keeps_none_of_a_secrets_bytes() {
        let mut secrets = Secrets::default();
        secrets.add("Bearer tok-SECRET-abcdef");
        let body = format!("{}Bearer tok-SECRET-abcdef and more", "x".repeat(90));
        let cut = secrets.redact_then_cut(&body, 100);
        assert_eq!(cut, format!("{}[redacted]", "x".repeat(90)));
        // A body that broke off inside a secret keeps none of it either.
        let broken = format!("{}Bearer tok-SEC", "x".repeat(10));
        assert_eq!(secrets.redact_then_cut(&broken, 100), "x".repeat(10));
        let message = message_of(
            format!("{}Bearer tok-SECRET-abcdef", "y".repeat(295)).as_bytes(),
            None,
            4096,
            &secrets,
        );
        assert!(!message.contains("Bearer tok"), "{message}");
        assert!(message.ends_with("[reda…"), "{message}");
        // A refusal cut at the limit, its message shorter than the model's share.
        let cut = format!("{}Bearer tok-SECRET-abcdef and more", "z".repeat(40));
        let message = message_of(cut.as_bytes(), Some(&Cut::TooLong), 50, &secrets);
        assert_eq!(message, "z".repeat(40) + "[redacted]");
    }

    #[test]
    fn refusal_messages_are_found_and_cut_short() {
        let none = Secrets::default();
        assert_eq!(
            message_of(br#"{"error": "amount too high"}"#, None, 64, &none),
            "amount too high"
        );
        assert_eq!(
            message_of(
                br#"{"error": {"message": "no such order"}}"#,
                None,
                64,
                &none
            ),
            "no such order"
        );
        assert_eq!(message_of(b"plain words", None, 64, &none), "plain words");
        let long = "x".repeat(1000);
        assert_eq!(
            message_of(long.as_bytes(), None, 4096, &none)
                .chars()
                .count(),
            MAX_ERROR_TEXT + 1
        );
    }

    #[test]
    fn a_cut_body_keeps_whole_characters_and_says_it_was_cut() {
        let body = "é".as_bytes();
        assert_eq!(text_of(&body[..1]), "");
        let none = Secrets::default();
        let result = result_of(b"{\"a\":", Some(&Cut::TooLong), 5, &none);
        assert_eq!(result["body"], "{\"a\":");
        assert!(
            result["cut"]
                .as_str()
                .unwrap()
                .contains("longer than 5 bytes")
        );
        assert_eq!(result_of(b"not json", None, 64, &none), json!("not json"));
        assert_eq!(result_of(b"", None, 64, &none), Value::Null);
    }
}
