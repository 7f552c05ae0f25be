//! HTTP tools against a real HTTP peer on loopback: an orders service of the test's own that
//! counts its effects by idempotency key, and routes that misbehave the ways services do (commit
//! then fail, hang, answer garbage or too much, redirect, refuse). Then the same tool behind the
//! engine: approved, unknown, reconciled by the sweep, and never sent twice.

#[macro_use]
mod harness;
#[path = "support/secret_forms.rs"]
mod secret_forms;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use shared::adapters::http_tool::{HttpBinding, HttpTool, SharedClient};
use shared::domain::action::{ActionStatus, ToolOutcome};
use shared::domain::approval::{Approval, ApprovalKind, Choice, DecisionRequest};
use shared::domain::args::Args;
use shared::domain::conversation::ToolResultText;
use shared::domain::ids::{ActionVersion, DecisionId, Role, RunId, TenantId};
use shared::domain::policy::Policy;
use shared::domain::run::RunStatus;
use shared::engine::{Agent, Delivery, Engine, History, ResumeReport, RunReport};
use shared::example::expense::default_directory;
use shared::ports::clock::ManualClock;
use shared::ports::model::ToolSpec;
use shared::ports::tools::{Tool, ToolCall, Toolbox};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use harness::{
    Backend, Embedded, RecordingQueue, Script, acme, approve, event_names, resume_message,
    scripted_task, start_of_test, told_about,
};

const SECRET: &str = "s3cret-orders-token-4242";
/// A query parameter's secret, which the URL percent-encodes.
const URL_KEY: &str = "uk \"Secret\"/é-456";
/// A token a JSON string escapes.
const QUOTED_TOKEN: &str = "tok\"en\\SECRET-789";
/// The password of a Basic auth header's `user:password`.
const PASSWORD: &str = "pw-secret-321";

/// A POST to the echo route, which answers with what it was sent.
const ECHO_POST: &str = r#"
method = "POST"
url = "${ORDERS_URL}/echo/orders/{order_id}"
headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
"#;

/// A GET of the 10 MB answer, read up to 1 KiB.
const HUGE_CAPPED: &str = r#"
method = "GET"
url = "${ORDERS_URL}/huge"
max_response_bytes = 1024
"#;
const TEN_MB: usize = 10 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// The orders service: a real HTTP peer
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Orders {
    /// The refunds made, by idempotency key.
    refunds: Mutex<HashMap<String, Value>>,
    /// Keys a lookup did not find: they never take effect (so its 404 means "did not").
    void: Mutex<Vec<String>>,
    /// Every request, by route name.
    hits: Mutex<HashMap<&'static str, usize>>,
    /// What the echo route last saw.
    seen: Mutex<Vec<Value>>,
}

impl Orders {
    fn hit(&self, route: &'static str) {
        *self.hits.lock().unwrap().entry(route).or_default() += 1;
    }

    fn hits(&self, route: &'static str) -> usize {
        self.hits.lock().unwrap().get(route).copied().unwrap_or(0)
    }

    fn effects(&self) -> usize {
        self.refunds.lock().unwrap().len()
    }

    /// Makes the refund once per key, whatever the number of requests.
    fn refund(
        &self,
        order_id: &str,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<Value, (StatusCode, &'static str)> {
        let authorized = headers
            .get(header::AUTHORIZATION)
            .is_some_and(|v| v.as_bytes() == format!("Bearer {SECRET}").as_bytes());
        if !authorized {
            return Err((StatusCode::UNAUTHORIZED, "no valid token"));
        }
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .ok_or((StatusCode::BAD_REQUEST, "no Idempotency-Key"))?
            .to_string();
        let args: Value = serde_json::from_slice(body)
            .map_err(|_| (StatusCode::BAD_REQUEST, "the body is not JSON"))?;
        if self.void.lock().unwrap().contains(&key) {
            return Err((StatusCode::CONFLICT, "a lookup voided this key"));
        }
        let mut refunds = self.refunds.lock().unwrap();
        let next = refunds.len() + 1;
        let refund = refunds.entry(key.clone()).or_insert_with(|| {
            json!({
                "refund_id": format!("rf_{next}"),
                "order_id": order_id,
                "amount_cents": args["amount_cents"],
                "idempotency_key": key,
            })
        });
        Ok(refund.clone())
    }
}

type Shared = State<Arc<Orders>>;

/// Makes a refund and answers it; with `THEN_500`, commits it yet answers 500.
async fn refunds<const THEN_500: bool>(
    State(orders): Shared,
    Path(order_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    orders.hit(if THEN_500 {
        "commit_then_500"
    } else {
        "refunds"
    });
    match orders.refund(&order_id, &headers, &body) {
        Ok(_) if THEN_500 => {
            (StatusCode::INTERNAL_SERVER_ERROR, "the database hiccuped").into_response()
        }
        Ok(refund) => (StatusCode::CREATED, axum::Json(refund)).into_response(),
        Err(refused) => refused.into_response(),
    }
}

/// The lookup: a key it does not find is voided first, so its 404 means "never will".
async fn by_key(State(orders): Shared, Path(key): Path<String>) -> Response {
    orders.hit("by_key");
    let refunds = orders.refunds.lock().unwrap();
    match refunds.get(&key) {
        Some(refund) => axum::Json(refund.clone()).into_response(),
        None => {
            orders.void.lock().unwrap().push(key);
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"error": "no refund"})),
            )
                .into_response()
        }
    }
}

async fn hang(State(orders): Shared) -> Response {
    orders.hit("hang");
    tokio::time::sleep(Duration::from_secs(60)).await;
    StatusCode::OK.into_response()
}

async fn invalid_json(State(orders): Shared) -> Response {
    orders.hit("invalid_json");
    (
        [(header::CONTENT_TYPE, "application/json")],
        "{\"refund_id\": rf_1, oops",
    )
        .into_response()
}

async fn huge(State(orders): Shared) -> Response {
    orders.hit("huge");
    (
        [(header::CONTENT_TYPE, "application/json")],
        vec![b'7'; TEN_MB],
    )
        .into_response()
}

async fn redirect(State(orders): Shared) -> Response {
    orders.hit("redirect");
    (StatusCode::FOUND, [(header::LOCATION, "/redirect-target")]).into_response()
}

async fn redirect_target(State(orders): Shared) -> Response {
    orders.hit("redirect_target");
    axum::Json(json!({"followed": true})).into_response()
}

async fn refuse_400(State(orders): Shared) -> Response {
    orders.hit("refuse_400");
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": "amount_cents must be positive"})),
    )
        .into_response()
}

async fn refuse_429(State(orders): Shared) -> Response {
    orders.hit("refuse_429");
    (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response()
}

/// A careless service that quotes the credentials it refuses.
async fn echo_token(State(orders): Shared, headers: HeaderMap) -> Response {
    orders.hit("echo_token");
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"error": format!("{token} may not refund this order")})),
    )
        .into_response()
}

/// A careless service that quotes what it was sent in every form a service may: the URI as
/// sent and with lower-case escapes, the header as is and as a JSON string, Basic auth decoded;
/// in a 200 (`echo`), a 403's JSON error with no message of its own (`refuse`), a 200 too long
/// for the binding, the quoted header across its cut (`cut`), a 500 in plain words (`lost`).
async fn careless(
    State(orders): Shared,
    Path(mode): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    orders.hit("careless");
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let authorization = header("authorization");
    let basic = header("proxy-authorization");
    let decoded = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        basic.trim_start_matches("Basic "),
    )
    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    .unwrap_or_default();
    let uri = uri.to_string();
    let said = json!({
        "uri": uri,
        "uri_lower_case": lower_case_escapes(&uri),
        "authorization": authorization,
        "authorization_as_json": serde_json::to_string(&authorization).unwrap(),
        "basic": decoded,
    });
    match mode.as_str() {
        "echo" => (StatusCode::OK, said.to_string()).into_response(),
        "refuse" => (
            StatusCode::FORBIDDEN,
            json!({"error": {"you_sent": said}}).to_string(),
        )
            .into_response(),
        // The header's JSON form starts at byte 990: a cut at 1000 falls inside it.
        "cut" => (
            StatusCode::OK,
            format!(
                "{}{} and the rest",
                "x".repeat(990),
                said["authorization_as_json"]
            ),
        )
            .into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed while handling {said}"),
        )
            .into_response(),
    }
}

/// `text` with each percent escape's hex digits in lower case.
fn lower_case_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut after_percent = 0;
    for c in text.chars() {
        match c {
            '%' => after_percent = 2,
            c if after_percent > 0 => {
                after_percent -= 1;
                out.push(c.to_ascii_lowercase());
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

/// Answers with what it received, for the tests of the request's shape.
async fn echo(
    State(orders): Shared,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    orders.hit("echo");
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let seen = json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "idempotency_key": header("idempotency-key"),
        "content_type": header("content-type"),
        "accept": header("accept"),
        "authorized": header("authorization") == Some(format!("Bearer {SECRET}").as_str()),
        "body": String::from_utf8_lossy(&body),
    });
    orders.seen.lock().unwrap().push(seen.clone());
    axum::Json(seen).into_response()
}

/// The orders service on 127.0.0.1, on a port of its own.
async fn orders_service() -> (Arc<Orders>, SocketAddr) {
    let orders = Arc::new(Orders::default());
    let app = Router::new()
        .route("/orders/{order_id}/refunds", post(refunds::<false>))
        .route(
            "/commit-then-500/orders/{order_id}/refunds",
            post(refunds::<true>),
        )
        .route("/refunds/by-key/{key}", get(by_key))
        .route("/hang", post(hang))
        .route("/invalid-json", get(invalid_json))
        .route("/huge", get(huge))
        .route("/redirect", post(redirect))
        .route(
            "/redirect-target",
            post(redirect_target).get(redirect_target),
        )
        .route("/refuse-400", post(refuse_400))
        .route("/refuse-429", post(refuse_429))
        .route("/echo-token", post(echo_token))
        .route("/echo/{*rest}", get(echo).post(echo).delete(echo))
        .route("/careless/{mode}", post(careless))
        .with_state(orders.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (orders, addr)
}

/// Reads one request's head off a raw connection.
async fn read_head(socket: &mut tokio::net::TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buf).await.unwrap();
        if n == 0 {
            return;
        }
        head.extend_from_slice(&buf[..n]);
    }
}

/// A peer that takes the request and hangs up without a word.
async fn hangs_up() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_head(&mut socket).await;
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (addr, requests)
}

/// A peer whose 200 body never ends: only a reader that stops on its own returns.
async fn endless_body() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                read_head(&mut socket).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'['; 64 * 1024];
                while socket.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    addr
}

/// A port nobody listens on.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Tools bound to it
// ---------------------------------------------------------------------------------------------

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: "Refund part of an order.".into(),
        input_schema: json!({"type": "object"}),
    }
}

/// A tool from a binding's TOML, its `${ORDERS_URL}` at `addr` and its token a secret.
fn tool_at(addr: SocketAddr, binding: &str) -> HttpTool {
    let base = format!("http://{addr}");
    let basic = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("refunder:{PASSWORD}"),
    );
    let env = move |name: &str| match name {
        "ORDERS_URL" => Some(base.clone()),
        "ORDERS_TOKEN" => Some(SECRET.to_string()),
        "URL_KEY" => Some(URL_KEY.to_string()),
        "QUOTED_TOKEN" => Some(QUOTED_TOKEN.to_string()),
        "ORDERS_BASIC" => Some(basic.clone()),
        _ => None,
    };
    let binding: HttpBinding = toml::from_str(binding).expect("the binding parses");
    let resolved = binding
        .resolve("tools.issue_refund.http", &env)
        .expect("the binding resolves");
    HttpTool::new(spec("issue_refund"), resolved, SharedClient::default())
}

/// A POST to `path` with the token, no reconcile, a short timeout.
/// A GET of `path` on the service at `addr`, with no other setting.
fn get_from(addr: SocketAddr, path: &str) -> HttpTool {
    tool_at(
        addr,
        &format!("method = \"GET\"\nurl = \"${{ORDERS_URL}}{path}\""),
    )
}

/// A fresh orders service, and the tool `bind` binds to its address.
async fn orders_and(bind: impl FnOnce(SocketAddr) -> HttpTool) -> (Arc<Orders>, HttpTool) {
    let (orders, addr) = orders_service().await;
    (orders, bind(addr))
}

fn post_to(addr: SocketAddr, path: &str) -> HttpTool {
    posting(
        addr,
        path,
        r#"Authorization = "Bearer ${ORDERS_TOKEN}""#,
        ("500ms", 4096),
    )
}

/// A POST to the service at `addr` under `path`, with `headers` (a TOML table's insides),
/// waiting at most `timeout` and reading at most `max_response_bytes` of an answer.
fn posting(
    addr: SocketAddr,
    path: &str,
    headers: &str,
    (timeout, max_response_bytes): (&str, usize),
) -> HttpTool {
    tool_at(
        addr,
        &format!(
            r#"
            method = "POST"
            url = "${{ORDERS_URL}}{path}"
            headers = {{ {headers} }}
            timeout = "{timeout}"
            max_response_bytes = {max_response_bytes}
            "#
        ),
    )
}

const REFUND: &str = r#"
    method = "POST"
    url = "${ORDERS_URL}/orders/{order_id}/refunds"
    headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
    timeout = "2s"

    [reconcile]
    method = "GET"
    url = "${ORDERS_URL}/refunds/by-key/{idempotency_key}"
    headers = { Authorization = "Bearer ${ORDERS_TOKEN}" }
    timeout = "2s"
    not_found = "did_not_take_effect"
"#;

/// [`REFUND`] whose lookup's 404 says nothing on purpose: the sweep asks again.
fn refund_asking_again() -> String {
    REFUND.replace("not_found = \"did_not_take_effect\"\n", "")
}

/// [`REFUND`] whose lookup is the echo route, with `more` added to its table.
fn refund_looked_up_by_echo(more: &str) -> String {
    REFUND.replace("/refunds/by-key/", "/echo/by-key/") + more
}

struct Call {
    tenant: TenantId,
    run: RunId,
    args: Args,
    key: String,
}

impl Call {
    fn new(args: Value, key: &str) -> Self {
        Self {
            tenant: acme(),
            run: RunId::parse("run-http1").unwrap(),
            args: Args::new(args).unwrap(),
            key: key.into(),
        }
    }

    fn refund_55() -> Self {
        Self::new(
            json!({"order_id": "ord_55", "amount_cents": 7500}),
            "act-h1:2",
        )
    }

    fn as_call(&self) -> ToolCall<'_> {
        ToolCall {
            tenant: &self.tenant,
            run_id: &self.run,
            args: &self.args,
            idempotency_key: &self.key,
        }
    }
}

/// What `tool` answers to the refund of ord_55.
async fn refund_55(tool: &HttpTool) -> ToolOutcome {
    tool.call(Call::refund_55().as_call()).await
}

/// The refund binding, its call made through the route that commits and then answers 500.
fn commit_then_500_at(addr: SocketAddr) -> HttpTool {
    tool_at(
        addr,
        &REFUND.replace("/orders/{order_id}", "/commit-then-500/orders/{order_id}"),
    )
}

fn assert_no_secret(what: impl std::fmt::Debug) {
    let text = format!("{what:?}");
    assert!(!text.contains(SECRET), "the secret leaked: {text}");
}

fn unknown_detail(outcome: &ToolOutcome) -> &str {
    match outcome {
        ToolOutcome::Unknown { detail } => detail,
        other => panic!("expected unknown, got {other:?}"),
    }
}

fn failed_error(outcome: &ToolOutcome) -> &str {
    match outcome {
        ToolOutcome::Failed { error } => error,
        other => panic!("expected failed, got {other:?}"),
    }
}

fn succeeded_result(outcome: &ToolOutcome) -> &Value {
    match outcome {
        ToolOutcome::Succeeded { result } => result,
        other => panic!("expected succeeded, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The tool on its own
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn given_a_refund_when_it_is_called_then_it_succeeds_with_the_body_and_the_key_acts_once() {
    let (orders, tool) = orders_and(|addr| tool_at(addr, REFUND)).await;
    let call = Call::refund_55();

    let outcome = tool.call(call.as_call()).await;

    let result = succeeded_result(&outcome);
    assert_eq!(result["order_id"], "ord_55");
    assert_eq!(result["amount_cents"], 7500);
    assert_eq!(result["idempotency_key"], "act-h1:2");
    // The service is idempotent on the key: a second send (which Countersign never makes)
    // would not refund twice. What Countersign guarantees is the key it sends.
    assert_eq!(orders.effects(), 1);
    assert_no_secret(&outcome);
}

#[tokio::test]
async fn given_a_post_binding_when_it_calls_then_it_sends_the_exact_arguments_as_json_with_the_key()
{
    let (orders, tool) = orders_and(|addr| tool_at(addr, ECHO_POST)).await;
    let call = Call::new(
        json!({"order_id": "ord 55/a", "amount_cents": 7500, "note": "é"}),
        "act-h2:1",
    );

    let outcome = tool.call(call.as_call()).await;

    let seen = succeeded_result(&outcome);
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["path"], "/echo/orders/ord%2055%2Fa");
    assert_eq!(seen["query"], Value::Null);
    assert_eq!(seen["idempotency_key"], "act-h2:1");
    assert_eq!(seen["content_type"], "application/json");
    assert_eq!(seen["accept"], "application/json");
    assert_eq!(seen["authorized"], true);
    let body: Value = serde_json::from_str(seen["body"].as_str().unwrap()).unwrap();
    assert_eq!(body, call.args.as_value());
    assert_eq!(orders.hits("echo"), 1);
}

#[tokio::test]
async fn given_a_get_binding_when_it_calls_then_it_sends_no_body_and_the_other_arguments_as_query()
{
    let (_orders, tool) = orders_and(|addr| get_from(addr, "/echo/orders/{order_id}")).await;
    let call = Call::new(json!({"order_id": "ord_55", "fields": "a&b"}), "act-h3:1");

    let seen = succeeded_result(&tool.call(call.as_call()).await).clone();

    assert_eq!(seen["method"], "GET");
    assert_eq!(seen["path"], "/echo/orders/ord_55");
    assert_eq!(seen["query"], "fields=a%26b");
    assert_eq!(seen["body"], "");
    assert_eq!(seen["content_type"], Value::Null);
    assert_eq!(seen["idempotency_key"], "act-h3:1");
}

#[tokio::test]
async fn given_a_call_without_its_path_argument_when_it_runs_then_it_fails_and_nothing_is_sent() {
    let (orders, tool) = orders_and(|addr| tool_at(addr, REFUND)).await;
    let call = Call::new(json!({"amount_cents": 7500}), "act-h4:1");

    let outcome = tool.call(call.as_call()).await;

    let error = failed_error(&outcome);
    assert!(error.contains("`order_id`"), "{error}");
    assert!(error.contains("nothing was sent"), "{error}");
    assert_eq!(orders.hits("refunds"), 0);
}

#[tokio::test]
async fn given_an_endpoint_that_commits_then_answers_500_when_called_then_the_outcome_is_unknown_and_reconcile_finds_it()
 {
    let (orders, tool) = orders_and(commit_then_500_at).await;
    let call = Call::refund_55();

    let outcome = tool.call(call.as_call()).await;

    let detail = unknown_detail(&outcome);
    assert!(detail.contains("500"), "{detail}");
    assert!(detail.contains("not sent again"), "{detail}");
    assert_eq!(orders.effects(), 1);
    assert!(tool.reconciles());
    let settled = tool
        .reconcile(call.as_call())
        .await
        .expect("reconcile knows");
    assert_eq!(succeeded_result(&settled)["idempotency_key"], "act-h1:2");
    assert_eq!(orders.hits("commit_then_500"), 1);
    assert_eq!(orders.hits("by_key"), 1);
}

#[tokio::test]
async fn given_a_lookup_whose_404_means_did_not_when_the_key_was_never_seen_then_it_did_not_take_effect_and_never_will()
 {
    let (orders, tool) = orders_and(|addr| tool_at(addr, REFUND)).await;
    let call = Call::new(
        json!({"order_id": "ord_55", "amount_cents": 7500}),
        "act-never:1",
    );

    let settled = tool
        .reconcile(call.as_call())
        .await
        .expect("a 404 is an answer where the binding says so");

    let error = failed_error(&settled);
    assert!(error.contains("did not take effect"), "{error}");
    assert!(error.contains("act-never:1"), "{error}");
    // The service voided the key: the request arriving late is refused, so it never will.
    let late = tool.call(call.as_call()).await;
    assert!(failed_error(&late).contains("409"), "{late:?}");
    assert_eq!(orders.effects(), 0);
}

#[tokio::test]
async fn given_a_lookup_whose_404_says_nothing_on_purpose_when_the_key_is_not_found_then_it_cannot_tell_yet()
 {
    let (orders, tool) = orders_and(|addr| tool_at(addr, &refund_asking_again())).await;
    let call = Call::new(json!({"order_id": "ord_55"}), "act-never:1");

    assert_eq!(tool.reconcile(call.as_call()).await, None);
    assert_eq!(tool.reconcile(call.as_call()).await, None);

    assert_eq!(orders.hits("by_key"), 2);
    assert_eq!(
        tool.gives_up_after(),
        Some(Duration::from_secs(24 * 60 * 60))
    );
}

#[tokio::test]
async fn given_a_lookup_when_it_asks_then_the_key_is_in_its_path_as_is_and_its_header_and_no_argument_goes_unasked()
 {
    let (_orders, tool) = orders_and(|addr| tool_at(addr, &refund_looked_up_by_echo(""))).await;

    let seen = tool.reconcile(Call::refund_55().as_call()).await.unwrap();

    let seen = succeeded_result(&seen);
    assert_eq!(seen["method"], "GET");
    assert_eq!(seen["path"], "/echo/by-key/act-h1:2");
    assert_eq!(seen["query"], Value::Null);
    assert_eq!(seen["idempotency_key"], "act-h1:2");
    assert_eq!(seen["body"], "");
    assert_eq!(seen["authorized"], true);
}

#[tokio::test]
async fn given_a_lookup_that_names_query_arguments_when_it_asks_then_it_sends_only_those() {
    let more = "    query = [\"order_id\"]\n    give_up_after = \"2h\"\n";
    let (_orders, tool) = orders_and(|addr| tool_at(addr, &refund_looked_up_by_echo(more))).await;

    let seen = tool.reconcile(Call::refund_55().as_call()).await.unwrap();

    assert_eq!(succeeded_result(&seen)["query"], "order_id=ord_55");
    assert_eq!(
        tool.gives_up_after(),
        Some(Duration::from_secs(2 * 60 * 60))
    );
}

#[tokio::test]
async fn given_a_reconcile_service_that_is_down_when_asked_then_it_cannot_tell_yet() {
    let addr = closed_port().await;
    let tool = tool_at(addr, REFUND);
    assert_eq!(tool.reconcile(Call::refund_55().as_call()).await, None);

    let (hung_up, _) = hangs_up().await;
    let tool = tool_at(hung_up, REFUND);
    assert_eq!(tool.reconcile(Call::refund_55().as_call()).await, None);
}

#[tokio::test]
async fn given_a_binding_without_reconcile_then_it_does_not_reconcile() {
    let (_orders, tool) = orders_and(|addr| post_to(addr, "/hang")).await;
    assert!(!tool.reconciles());
    assert_eq!(tool.reconcile(Call::refund_55().as_call()).await, None);
}

#[tokio::test]
async fn given_an_endpoint_that_hangs_when_called_then_it_times_out_as_unknown() {
    let (orders, tool) = orders_and(|addr| post_to(addr, "/hang")).await;

    let started = std::time::Instant::now();
    let outcome = refund_55(&tool).await;

    assert!(started.elapsed() < Duration::from_secs(5));
    let detail = unknown_detail(&outcome);
    assert!(detail.contains("no answer within 500ms"), "{detail}");
    assert_eq!(orders.hits("hang"), 1);
}

#[tokio::test]
async fn given_an_endpoint_that_answers_invalid_json_when_called_then_the_result_is_its_text() {
    let (_orders, tool) = orders_and(|addr| get_from(addr, "/invalid-json")).await;

    let outcome = tool.call(Call::new(json!({}), "act-h5:1").as_call()).await;

    assert_eq!(
        succeeded_result(&outcome),
        &json!("{\"refund_id\": rf_1, oops")
    );
}

#[tokio::test]
async fn given_an_endpoint_that_answers_10_mb_when_called_then_the_result_is_cut_at_the_cap() {
    let (orders, tool) = orders_and(|addr| tool_at(addr, HUGE_CAPPED)).await;

    let outcome = tool.call(Call::new(json!({}), "act-h6:1").as_call()).await;

    let result = succeeded_result(&outcome);
    assert_eq!(result["body"].as_str().unwrap(), "7".repeat(1024));
    let cut = result["cut"].as_str().unwrap();
    assert!(cut.contains("longer than 1024 bytes"), "{cut}");
    assert_eq!(orders.hits("huge"), 1);
}

#[tokio::test]
async fn given_a_body_that_never_ends_when_called_then_reading_stops_at_the_cap() {
    let addr = endless_body().await;
    let tool = get_from(addr, "/forever");

    // A reader that held the whole body would never return.
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        tool.call(Call::new(json!({}), "act-h7:1").as_call()),
    )
    .await
    .expect("the call returns although the body never ends");

    let result = succeeded_result(&outcome);
    assert_eq!(result["body"].as_str().unwrap().len(), 64 * 1024);
    assert!(
        result["cut"]
            .as_str()
            .unwrap()
            .contains("longer than 65536")
    );
}

#[tokio::test]
async fn given_an_endpoint_that_redirects_when_called_then_it_is_not_followed_and_unknown() {
    let (orders, tool) = orders_and(|addr| post_to(addr, "/redirect")).await;

    let outcome = refund_55(&tool).await;

    let detail = unknown_detail(&outcome);
    assert!(detail.contains("302"), "{detail}");
    assert!(detail.contains("never followed"), "{detail}");
    assert_eq!(orders.hits("redirect"), 1);
    assert_eq!(orders.hits("redirect_target"), 0);
}

#[tokio::test]
async fn given_an_endpoint_that_refuses_with_400_when_called_then_it_fails_with_the_message() {
    let (_orders, tool) = orders_and(|addr| post_to(addr, "/refuse-400")).await;

    let outcome = refund_55(&tool).await;

    assert_eq!(
        failed_error(&outcome),
        "the service refused the call (400 Bad Request: amount_cents must be positive)"
    );
}

#[tokio::test]
async fn given_an_endpoint_that_answers_429_when_called_then_it_is_unknown_not_failed() {
    let (_orders, tool) = orders_and(|addr| post_to(addr, "/refuse-429")).await;

    let outcome = refund_55(&tool).await;

    let detail = unknown_detail(&outcome);
    assert!(
        detail.contains("429 Too Many Requests: slow down"),
        "{detail}"
    );
}

#[tokio::test]
async fn given_nothing_listening_when_called_then_it_fails_saying_nothing_was_sent() {
    let addr = closed_port().await;
    let tool = post_to(addr, "/orders/ord_55/refunds");

    let outcome = refund_55(&tool).await;

    let error = failed_error(&outcome);
    assert!(error.contains("could not connect"), "{error}");
    assert!(error.contains("nothing was sent"), "{error}");
}

#[tokio::test]
async fn given_a_peer_that_hangs_up_after_the_request_when_called_then_it_is_unknown() {
    let (addr, requests) = hangs_up().await;
    let tool = post_to(addr, "/orders/ord_55/refunds");

    let outcome = refund_55(&tool).await;

    let detail = unknown_detail(&outcome);
    assert!(detail.contains("connection broke"), "{detail}");
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn given_a_secret_token_from_the_environment_then_no_outcome_or_debug_text_shows_it() {
    let (_orders, addr) = orders_service().await;
    let mut outcomes = Vec::new();
    for path in [
        "/echo-token",
        "/refuse-400",
        "/refuse-429",
        "/redirect",
        "/hang",
        "/echo/x",
    ] {
        let tool = post_to(addr, path);
        assert_no_secret(&tool);
        outcomes.push(refund_55(&tool).await);
    }
    let tool = tool_at(addr, REFUND);
    assert_no_secret(&tool);
    outcomes.push(refund_55(&tool).await);
    outcomes.push(tool.reconcile(Call::refund_55().as_call()).await.unwrap());

    // The careless service quoted the header: it reaches the model redacted, scheme and all.
    let quoted = failed_error(&outcomes[0]);
    assert!(
        quoted.contains("403 Forbidden: [redacted] may not refund"),
        "{quoted}"
    );
    for outcome in &outcomes {
        assert_no_secret(outcome);
        assert!(!serde_json::to_string(outcome).unwrap().contains(SECRET));
    }
    let binding: HttpBinding = toml::from_str(REFUND).unwrap();
    assert_no_secret(&binding);
}

/// A POST to the careless service's `mode`, with a secret in its query, one in a header that
/// JSON escapes and one inside Basic auth, reading at most 1000 bytes of an answer.
fn careless_at(addr: SocketAddr, mode: &str) -> HttpTool {
    posting(
        addr,
        &format!("/careless/{mode}?k=${{URL_KEY}}"),
        r#"Authorization = "Bearer ${QUOTED_TOKEN}", Proxy-Authorization = "Basic ${ORDERS_BASIC}""#,
        ("2s", 1000),
    )
}

#[tokio::test]
async fn given_a_service_that_echoes_secrets_in_every_form_then_no_outcome_holds_any_form_of_them()
{
    let (orders, addr) = orders_service().await;
    let mut outcomes = Vec::new();
    for mode in ["echo", "refuse", "cut", "lost"] {
        outcomes.push(refund_55(&careless_at(addr, mode)).await);
    }
    assert_eq!(orders.hits("careless"), 4);

    let [echo, refused, cut, lost] = outcomes.as_slice() else {
        unreachable!()
    };
    // What the service said is there, each secret in the place it was: the test is not vacuous.
    let echoed = succeeded_result(echo);
    assert_eq!(echoed["authorization"], "[redacted]", "{echoed}");
    assert_eq!(
        echoed["authorization_as_json"], "\"[redacted]\"",
        "{echoed}"
    );
    assert_eq!(echoed["basic"], "[redacted]", "{echoed}");
    for uri in ["uri", "uri_lower_case"] {
        assert_eq!(
            echoed[uri], "/careless/echo?k=${URL_KEY}",
            "{uri}: {echoed}"
        );
    }
    let refused = failed_error(refused);
    assert!(refused.contains("403 Forbidden: {"), "{refused}");
    assert!(refused.contains("[redacted]"), "{refused}");
    let cut = succeeded_result(cut);
    // The header, JSON-escaped twice, redacted whole before the cut through what stands for it.
    assert_eq!(
        cut["body"],
        format!("{}\"\\\"[redac", "x".repeat(990)),
        "{cut}"
    );
    assert!(unknown_detail(lost).contains("${URL_KEY}"), "{lost:?}");

    for outcome in &outcomes {
        let shown = format!("{outcome:?} {}", serde_json::to_string(outcome).unwrap());
        secret_forms::assert_no_secret_in(
            "an outcome",
            shown.as_bytes(),
            &[URL_KEY, QUOTED_TOKEN, PASSWORD],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Behind the engine
// ---------------------------------------------------------------------------------------------

const REFUND_POLICY: &str = include_str!("fixtures/refund-policy.toml");

/// An engine over a fresh embedded store whose model proposes one refund of order ord_55.
async fn refund_engine(tool: HttpTool, delivery: Delivery) -> (Engine, Embedded) {
    refund_engine_recovering(tool, delivery, None).await
}

/// [`refund_engine`], whose agent names `owner` as its recovery owner.
async fn refund_engine_recovering(
    tool: HttpTool,
    delivery: Delivery,
    owner: Option<&str>,
) -> (Engine, Embedded) {
    let backend = Embedded::fresh();
    let store = backend.connect().await;
    let policy = Arc::new(Policy::from_toml(REFUND_POLICY).expect("the policy parses"));
    let script = Script::default().then_call(&[(
        "issue_refund",
        json!({"order_id": "ord_55", "amount_cents": 12_500}),
    )]);
    // Named as harness::scripted_task names the agent it starts.
    let agent = Agent::new(scripted_task("ben").agent, policy)
        .with_model(Arc::new(script))
        .with_tools(Toolbox::new().with(Arc::new(tool)))
        .with_system_prompt("You refund orders.");
    let mut agent = agent;
    agent.recovery_owner = owner.map(|role| Role::parse(role).unwrap());
    let engine = Engine::builder(store)
        .agent(agent)
        .clock(Arc::new(ManualClock::new(start_of_test())))
        .delivery(delivery)
        .build();
    (engine, backend)
}

/// Starts the refund on `engine`: the run, paused on its one approval.
async fn paused_refund(engine: &Engine) -> (RunReport, Approval) {
    let report = engine.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.approvals.len(), 1, "{report:?}");
    let approval = report.approvals[0].clone();
    (report, approval)
}

/// The refund's run is done, its refund `status`: the run's history, and what the model was
/// told of the refund.
async fn refund_done(
    engine: &Engine,
    report: &RunReport,
    status: ActionStatus,
) -> (History, ToolResultText) {
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(history.actions[0].status, status);
    let told = told_about(&history.run, "issue_refund");
    (history, told)
}

/// dana approves the refund.
async fn approve_refund(engine: &Engine, approval: &Approval) {
    let dana = default_directory().identify("dana").unwrap();
    engine
        .decide(&dana, &approval.id, approve("d-refund"))
        .await
        .unwrap();
}

#[tokio::test]
async fn given_an_approved_refund_whose_endpoint_commits_then_answers_500_when_the_sweep_reconciles_then_it_took_effect_once_and_the_run_finishes()
 {
    let (orders, tool) = orders_and(commit_then_500_at).await;
    let (engine, _store) = refund_engine(tool, Delivery::InProcess).await;

    let (report, approval) = paused_refund(&engine).await;
    assert_eq!(orders.hits("commit_then_500"), 0);

    approve_refund(&engine, &approval).await;

    // One effect, and an outcome nobody knows yet.
    assert_eq!(orders.hits("commit_then_500"), 1);
    assert_eq!(orders.effects(), 1);
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Unknown);
    assert_eq!(history.run.status, RunStatus::AwaitingApproval);

    // The resume message comes again: the call may have committed, so it is never resent.
    let again = engine.resume(&resume_message(&approval)).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    assert_eq!(orders.hits("commit_then_500"), 1);

    // The sweep asks the service by key and settles it.
    let key = format!("{}:1", approval.action_id);
    let swept = engine.sweep(100).await.unwrap();
    assert_eq!(swept.reconciled, std::slice::from_ref(&key));
    assert_eq!(orders.hits("by_key"), 1);

    let (history, told) = refund_done(&engine, &report, ActionStatus::Succeeded).await;
    let names = event_names(&history.entries);
    let unknown = names.iter().position(|n| *n == "unknown").expect("unknown");
    let reconciled = names
        .iter()
        .position(|n| *n == "reconciled")
        .expect("reconciled");
    assert!(unknown < reconciled, "{names:?}");
    assert!(told.content.contains(&key), "{told:?}");
    assert!(!told.is_error, "{told:?}");

    // Delivered once more after the end: still one call, one effect.
    let late = engine.resume(&resume_message(&approval)).await.unwrap();
    assert!(matches!(late, ResumeReport::Ignored { .. }), "{late:?}");
    assert!(engine.sweep(100).await.unwrap().reconciled.is_empty());
    assert_eq!(orders.hits("commit_then_500"), 1);
    assert_eq!(orders.effects(), 1);
    for entry in &history.entries {
        assert_no_secret(entry);
    }
}

#[tokio::test]
async fn given_a_refund_without_a_reconcile_request_whose_endpoint_commits_then_answers_500_when_the_recovery_owner_says_it_took_effect_then_the_run_finishes_with_one_effect()
 {
    let (orders, addr) = orders_service().await;
    let no_reconcile = REFUND[..REFUND.find("[reconcile]").unwrap()]
        .replace("/orders/{order_id}", "/commit-then-500/orders/{order_id}");
    let tool = tool_at(addr, &no_reconcile);
    assert!(!tool.reconciles());
    let (engine, _store) =
        refund_engine_recovering(tool, Delivery::InProcess, Some("finance")).await;
    let erin = default_directory().identify("erin").unwrap();
    let (report, approval) = paused_refund(&engine).await;
    approve_refund(&engine, &approval).await;
    assert_eq!(orders.effects(), 1);

    // Nothing can ask the service, so a person of the recovery owner's role is asked.
    let pending = engine.pending(&acme()).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let recovery = &pending[0];
    assert_eq!(recovery.kind, ApprovalKind::Recovery);
    assert_eq!(recovery.action_id, approval.action_id);
    assert!(engine.sweep(100).await.unwrap().unknown.is_empty());

    let answer = DecisionRequest {
        decision_id: DecisionId::parse("erin-1").unwrap(),
        action_version: ActionVersion::FIRST,
        choice: Choice::TookEffect {
            note: Some("The orders service shows the refund.".into()),
        },
    };
    let answered = engine.decide(&erin, &recovery.id, answer).await.unwrap();
    assert_eq!(answered.run.expect("resumed here").status, RunStatus::Done);
    assert_eq!(orders.hits("commit_then_500"), 1);
    assert_eq!(orders.effects(), 1);
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    let names = event_names(&history.entries);
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("unknown") < at("recovery_requested"), "{names:?}");
    assert!(at("recovery_requested") < at("reconciled"), "{names:?}");
    assert_eq!(history.entries[at("reconciled")].actor.to_string(), "erin");
}

#[tokio::test]
async fn given_an_approved_refund_when_its_resume_message_is_delivered_twice_then_the_endpoint_is_called_once()
 {
    let (orders, addr) = orders_service().await;
    let queue = Arc::new(RecordingQueue::default());
    let (engine, _store) =
        refund_engine(tool_at(addr, REFUND), Delivery::Queue(queue.clone())).await;
    let (report, approval) = paused_refund(&engine).await;
    approve_refund(&engine, &approval).await;
    assert_eq!(
        orders.hits("refunds"),
        0,
        "the consumer calls, not the decision"
    );
    let published = queue.published();
    assert_eq!(published.len(), 1, "{published:?}");

    let first = engine.resume(&published[0]).await.unwrap();
    let second = engine.resume(&published[0]).await.unwrap();

    assert!(matches!(first, ResumeReport::Continued { .. }), "{first:?}");
    assert!(matches!(second, ResumeReport::Ignored { .. }), "{second:?}");
    assert_eq!(orders.hits("refunds"), 1);
    assert_eq!(orders.effects(), 1);
    let (_, told) = refund_done(&engine, &report, ActionStatus::Succeeded).await;
    assert!(told.content.contains("ord_55"), "{told:?}");
    assert!(
        told.content.contains(&format!("{}:1", approval.action_id)),
        "{told:?}"
    );
}

#[tokio::test]
async fn given_an_approved_refund_whose_endpoint_times_out_without_effect_when_the_sweep_reconciles_then_it_did_not_take_effect_and_the_model_is_told()
 {
    let (orders, addr) = orders_service().await;
    let tool = tool_at(
        addr,
        &REFUND
            .replace("/orders/{order_id}/refunds", "/hang")
            .replacen("timeout = \"2s\"", "timeout = \"300ms\"", 1),
    );
    let (engine, _store) = refund_engine(tool, Delivery::InProcess).await;
    let (report, approval) = paused_refund(&engine).await;

    approve_refund(&engine, &approval).await;
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Unknown);

    let swept = engine.sweep(100).await.unwrap();

    let key = format!("{}:1", approval.action_id);
    assert_eq!(swept.reconciled, std::slice::from_ref(&key));
    assert_eq!(orders.hits("hang"), 1);
    assert_eq!(orders.effects(), 0);
    let (_, told) = refund_done(&engine, &report, ActionStatus::Failed).await;
    assert!(told.content.contains("did not take effect"), "{told:?}");
}
