//! HTTP tools against services written the obvious way: the standard library's TCP listener, a
//! thread per connection, the request line split by hand and the path never decoded. Behind the
//! engine, on both stores: a refund stored before a 500 is found by its lookup and paid once; a
//! lookup's 404 that the binding does not call "did not take effect" is asked again, then handed
//! to the recovery owner; and what the service echoes of the binding's secrets is stored nowhere.

#[macro_use]
mod harness;
#[path = "support/audit_api.rs"]
mod audit_api;
#[path = "harness/dynamodb.rs"]
mod dynamodb_backend;
#[path = "support/secret_forms.rs"]
mod secret_forms;
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::Duration;
use serde_json::{Value, json};
use shared::adapters::http_tool::{HttpBinding, HttpTool, SharedClient};
use shared::domain::action::ActionStatus;
use shared::domain::approval::{Approval, ApprovalKind, Choice, DecisionRequest};
use shared::domain::ids::{ActionVersion, DecisionId, Role};
use shared::domain::policy::Policy;
use shared::domain::run::RunStatus;
use shared::engine::{Agent, Delivery, Engine, RunReport};
use shared::example::expense::default_directory;
use shared::ports::clock::ManualClock;
use shared::ports::model::ToolSpec;
use shared::ports::tools::Toolbox;

use dynamodb_backend::DynamoDb;
use harness::{
    Backend, Embedded, Script, acme, approve, event_names, scripted_task, start_of_test, told_about,
};

// ---------------------------------------------------------------------------------------------
// A service written the obvious way
// ---------------------------------------------------------------------------------------------

/// One request as a plain service sees it: the path and query exactly as they came.
#[derive(Debug, Clone, PartialEq)]
struct Request {
    method: String,
    path: String,
    query: Option<String>,
    /// Names in lower case.
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// What a plain service answers: a status and a body.
type Handler = dyn Fn(&Request) -> (u16, String) + Send + Sync;

/// Serves `handler` on 127.0.0.1: one request per connection, answered and closed.
fn plain_service(handler: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let handler: Arc<Handler> = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handler = handler.clone();
            std::thread::spawn(move || answer(stream, &*handler));
        }
    });
    format!("http://{addr}")
}

fn answer(mut stream: TcpStream, handler: &Handler) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((name, value)) = line.trim_end().split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let length = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path.to_string(), Some(query.to_string())),
        None => (target, None),
    };
    let request = Request {
        method,
        path,
        query,
        headers,
        body,
    };
    let (status, text) = handler(&request);
    let head = format!(
        "HTTP/1.1 {status} Answer\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(text.as_bytes());
}

/// An orders service whose refund endpoint fails with a 500 every time, having stored the
/// refund first or not, and whose lookup finds refunds by the key in its path, undecoded.
#[derive(Default)]
struct PlainOrders {
    stores_before_failing: bool,
    /// Refunds by idempotency key.
    refunds: Mutex<HashMap<String, Value>>,
    calls: AtomicUsize,
    lookups: Mutex<Vec<Request>>,
}

impl PlainOrders {
    /// Serves it; returns it and its base URL.
    fn serve(stores_before_failing: bool) -> (Arc<Self>, String) {
        let orders = Arc::new(Self {
            stores_before_failing,
            ..Self::default()
        });
        let served = orders.clone();
        let url = plain_service(move |request| served.handle(request));
        (orders, url)
    }

    fn handle(&self, request: &Request) -> (u16, String) {
        if request.method == "POST" && request.path.ends_with("/refunds") {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.stores_before_failing {
                let key = request.header("idempotency-key").to_string();
                let refund = json!({"refund_id": "rf_1", "idempotency_key": key});
                self.refunds.lock().unwrap().entry(key).or_insert(refund);
            }
            return (500, r#"{"error": "the database hiccuped"}"#.into());
        }
        if let Some(key) = request.path.strip_prefix("/refunds/by-key/") {
            self.lookups.lock().unwrap().push(request.clone());
            return match self.refunds.lock().unwrap().get(key) {
                Some(refund) => (200, refund.to_string()),
                None => (404, r#"{"error": "no such refund"}"#.into()),
            };
        }
        (404, r#"{"error": "no such route"}"#.into())
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn lookups(&self) -> Vec<Request> {
        self.lookups.lock().unwrap().clone()
    }

    fn effects(&self) -> usize {
        self.refunds.lock().unwrap().len()
    }
}

// ---------------------------------------------------------------------------------------------
// The engine over a store, with tools bound to the service
// ---------------------------------------------------------------------------------------------

/// A tool `name` bound by `binding`, its variables from `env`.
fn http_tool(name: &str, binding: &str, env: &[(&str, &str)]) -> HttpTool {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let binding: HttpBinding = toml::from_str(binding).expect("the binding parses");
    let resolved = binding
        .resolve(&format!("tools.{name}.http"), &|var| env.get(var).cloned())
        .expect("the binding resolves");
    let spec = ToolSpec {
        name: name.into(),
        description: format!("The {name} tool."),
        input_schema: json!({"type": "object"}),
    };
    HttpTool::new(spec, resolved, SharedClient::default())
}

/// An engine over a new connection to `backend`, whose agent makes the calls of `script` with
/// `tools` under `policy`, and names `owner` as its recovery owner.
async fn engine_on(
    backend: &dyn Backend,
    policy: &str,
    script: Script,
    tools: Toolbox,
    owner: Option<&str>,
) -> (Engine, Arc<ManualClock>) {
    let policy = Arc::new(Policy::from_toml(policy).expect("the policy parses"));
    let mut agent = Agent::new(scripted_task("ben").agent, policy)
        .with_model(Arc::new(script))
        .with_tools(tools)
        .with_system_prompt("You refund orders.");
    agent.recovery_owner = owner.map(|role| Role::parse(role).unwrap());
    let clock = Arc::new(ManualClock::new(start_of_test()));
    let engine = Engine::builder(backend.connect().await)
        .agent(agent)
        .clock(clock.clone())
        .delivery(Delivery::InProcess)
        .build();
    (engine, clock)
}

const REFUND_POLICY: &str = include_str!("fixtures/refund-policy.toml");

/// The refund, its lookup at `/refunds/by-key/{idempotency_key}` saying nothing more than a
/// service written from the README would need.
fn refund_binding(base: &str) -> String {
    format!(
        r#"
        method = "POST"
        url = "{base}/orders/{{order_id}}/refunds"
        timeout = "2s"

        [reconcile]
        method = "GET"
        url = "{base}/refunds/by-key/{{idempotency_key}}"
        timeout = "2s"
        "#
    )
}

/// A refund engine for the plain orders service at `base`, paused on the refund's approval.
async fn paused_refund(
    backend: &dyn Backend,
    base: &str,
    owner: Option<&str>,
) -> (Engine, Arc<ManualClock>, RunReport, Approval) {
    let script = Script::default().then_call(&[(
        "issue_refund",
        json!({"order_id": "ord_55", "amount_cents": 12_500}),
    )]);
    let tool = http_tool("issue_refund", &refund_binding(base), &[]);
    let tools = Toolbox::new().with(Arc::new(tool));
    let (engine, clock) = engine_on(backend, REFUND_POLICY, script, tools, owner).await;
    let report = engine.start(scripted_task("ben")).await.unwrap();
    assert_eq!(report.approvals.len(), 1, "{report:?}");
    let approval = report.approvals[0].clone();
    (engine, clock, report, approval)
}

/// dana approves the refund; the call's outcome is unknown.
async fn approved_unknown(engine: &Engine, report: &RunReport, approval: &Approval) {
    let dana = default_directory().identify("dana").unwrap();
    engine
        .decide(&dana, &approval.id, approve("d-refund"))
        .await
        .unwrap();
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Unknown);
}

/// Instantiates each scenario as a test on the embedded store and one on DynamoDB (moto).
macro_rules! on_both_stores {
    ([$($scenario:ident),* $(,)?]) => {
        mod embedded {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(&super::Embedded::fresh()).await;
                }
            )*
        }
        mod dynamodb {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(&super::DynamoDb::fresh("http-services").await).await;
                }
            )*
        }
    };
}

on_both_stores!([
    given_a_plain_service_that_stores_the_refund_then_answers_500_when_the_sweep_looks_it_up_then_it_took_effect_once,
    given_a_lookup_that_answers_404_without_the_binding_saying_what_it_means_then_it_is_asked_again_and_then_handed_to_the_recovery_owner,
    given_no_recovery_owner_when_the_lookup_never_tells_then_the_sweep_keeps_asking,
    given_a_binding_with_secrets_in_every_form_when_the_service_echoes_them_then_the_audit_and_api_show_none,
]);

// ---------------------------------------------------------------------------------------------
// Reconciled as it happened
// ---------------------------------------------------------------------------------------------

async fn given_a_plain_service_that_stores_the_refund_then_answers_500_when_the_sweep_looks_it_up_then_it_took_effect_once(
    backend: &dyn Backend,
) {
    let (orders, base) = PlainOrders::serve(true);
    let (engine, _clock, report, approval) = paused_refund(backend, &base, None).await;
    approved_unknown(&engine, &report, &approval).await;
    assert_eq!(orders.effects(), 1);

    let swept = engine.sweep(100).await.unwrap();

    let key = format!("{}:1", approval.action_id);
    assert_eq!(swept.reconciled, std::slice::from_ref(&key));
    // The key as it was sent in the header, undecoded in the path, and nothing else asked.
    let [lookup] = orders.lookups().try_into().expect("one lookup");
    assert_eq!(lookup.path, format!("/refunds/by-key/{key}"));
    assert_eq!(lookup.header("idempotency-key"), key);
    assert_eq!(lookup.query, None);
    assert!(lookup.body.is_empty());

    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(history.actions[0].status, ActionStatus::Succeeded);
    let told = told_about(&history.run, "issue_refund");
    assert!(told.content.contains("rf_1"), "{told:?}");
    assert!(!told.is_error, "{told:?}");
    assert!(event_names(&history.entries).contains(&"reconciled"));
    // Paid once: the call was never sent again.
    assert_eq!(orders.calls(), 1);
    assert_eq!(orders.effects(), 1);
}

// ---------------------------------------------------------------------------------------------
// "Did not take effect" only on purpose
// ---------------------------------------------------------------------------------------------

async fn given_a_lookup_that_answers_404_without_the_binding_saying_what_it_means_then_it_is_asked_again_and_then_handed_to_the_recovery_owner(
    backend: &dyn Backend,
) {
    let (orders, base) = PlainOrders::serve(false);
    let (engine, clock, report, approval) = paused_refund(backend, &base, Some("finance")).await;
    approved_unknown(&engine, &report, &approval).await;
    let key = format!("{}:1", approval.action_id);

    // A 404 is not an answer: still unknown, asked again at the next sweep due.
    let swept = engine.sweep(100).await.unwrap();
    assert_eq!(swept.unknown, std::slice::from_ref(&key));
    assert!(swept.reconciled.is_empty() && swept.to_recovery_owner.is_empty());
    clock.advance(Duration::minutes(6));
    let swept = engine.sweep(100).await.unwrap();
    assert_eq!(swept.unknown, std::slice::from_ref(&key));
    assert_eq!(orders.lookups().len(), 2);
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Unknown);
    assert_eq!(history.run.status, RunStatus::AwaitingApproval);
    assert!(engine.pending(&acme()).await.unwrap().is_empty());

    // A day after it became unknown (the default patience), asked once more, then a person.
    clock.set(start_of_test() + Duration::hours(24));
    let swept = engine.sweep(100).await.unwrap();
    assert_eq!(swept.to_recovery_owner, std::slice::from_ref(&key));
    assert_eq!(orders.lookups().len(), 3);
    let pending = engine.pending(&acme()).await.unwrap();
    let [recovery] = pending.as_slice() else {
        panic!("one recovery: {pending:?}");
    };
    assert_eq!(recovery.kind, ApprovalKind::Recovery);
    assert_eq!(recovery.approver_role.as_str(), "finance");
    assert_eq!(recovery.action_id, approval.action_id);
    assert!(
        recovery.reason.contains("could not tell within 1day"),
        "{}",
        recovery.reason
    );

    // The sweep no longer asks; the owner's answer settles it.
    clock.advance(Duration::hours(1));
    let swept = engine.sweep(100).await.unwrap();
    assert!(swept.unknown.is_empty() && swept.to_recovery_owner.is_empty());
    assert_eq!(orders.lookups().len(), 3);
    let erin = default_directory().identify("erin").unwrap();
    let answer = DecisionRequest {
        decision_id: DecisionId::parse("erin-1").unwrap(),
        action_version: ActionVersion::FIRST,
        choice: Choice::DidNotTakeEffect {
            note: Some("No refund in the orders service.".into()),
        },
    };
    engine.decide(&erin, &recovery.id, answer).await.unwrap();

    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.run.status, RunStatus::Done);
    assert_eq!(history.actions[0].status, ActionStatus::Failed);
    let names = event_names(&history.entries);
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("unknown") < at("recovery_requested"), "{names:?}");
    assert!(at("recovery_requested") < at("reconciled"), "{names:?}");
    assert_eq!(
        history.entries[at("recovery_requested")].actor.to_string(),
        "sweep"
    );
    assert_eq!(orders.calls(), 1);
    assert_eq!(orders.effects(), 0);
}

async fn given_no_recovery_owner_when_the_lookup_never_tells_then_the_sweep_keeps_asking(
    backend: &dyn Backend,
) {
    let (orders, base) = PlainOrders::serve(false);
    let (engine, clock, report, approval) = paused_refund(backend, &base, None).await;
    approved_unknown(&engine, &report, &approval).await;
    let key = format!("{}:1", approval.action_id);

    for days in [1, 2] {
        clock.set(start_of_test() + Duration::days(days));
        let swept = engine.sweep(100).await.unwrap();
        assert_eq!(swept.unknown, std::slice::from_ref(&key));
        assert!(swept.to_recovery_owner.is_empty());
    }

    assert_eq!(orders.lookups().len(), 2);
    assert!(engine.pending(&acme()).await.unwrap().is_empty());
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(history.actions[0].status, ActionStatus::Unknown);
}

// ---------------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------------

/// A token a JSON string escapes, a query parameter the URL percent-encodes, a literal.
const TOKEN: &str = "tok\"SECRET\\abcdef123";
const URL_KEY: &str = "url key/\"secret\"-456";
const LITERAL: &str = "literal-secret-value-123";

#[track_caller]
fn assert_no_secret_in(what: &str, bytes: &[u8]) {
    secret_forms::assert_no_secret_in(what, bytes, &[TOKEN, URL_KEY, LITERAL]);
}

/// A careless service that quotes what it was sent: the URL, every header; `/cut` quotes the
/// token where a cut at 100 bytes splits it, `/refuse` in a 403, `/lost` in a 500.
fn careless_service(request: &Request) -> (u16, String) {
    let echoed = json!({
        "uri": format!("{}?{}", request.path, request.query.clone().unwrap_or_default()),
        "authorization": request.header("authorization"),
        "x_literal": request.header("x-literal"),
    });
    match request.path.as_str() {
        "/echo" => (200, echoed.to_string()),
        // 81 bytes, then `Bearer tok"SECRET\abcdef123`: a cut at 100 kept `Bearer tok"SECRET\a`.
        "/cut" => (
            200,
            format!(
                "{}{} and the rest of a long answer",
                "x".repeat(81),
                request.header("authorization")
            ),
        ),
        "/refuse" => (
            403,
            json!({"error": format!("{echoed} may not refund")}).to_string(),
        ),
        "/lost" => (500, format!("failed while handling {echoed}")),
        _ => (404, "{}".into()),
    }
}

/// A tool of the careless service at `path`, with a secret in every form a binding can hold,
/// reading at most `max` bytes of an answer.
fn careless_tool(name: &str, method: &str, path: &str, base: &str, max: usize) -> HttpTool {
    let binding = format!(
        r#"
        method = "{method}"
        url = "${{SERVICE_URL}}{path}?k=${{URL_KEY}}"
        headers = {{ Authorization = "Bearer ${{TOKEN}}", X-Literal = "{LITERAL}" }}
        timeout = "2s"
        max_response_bytes = {max}
        "#
    );
    let env = [
        ("SERVICE_URL", base),
        ("URL_KEY", URL_KEY),
        ("TOKEN", TOKEN),
    ];
    http_tool(name, &binding, &env)
}

async fn given_a_binding_with_secrets_in_every_form_when_the_service_echoes_them_then_the_audit_and_api_show_none(
    backend: &dyn Backend,
) {
    let base = plain_service(careless_service);
    // The echo whole; the others cut at 100 bytes, a secret across each cut.
    let careless = [
        ("read_echo", "GET", "/echo", 4096),
        ("read_cut", "GET", "/cut", 100),
        ("refund_refused", "POST", "/refuse", 100),
        ("refund_lost", "POST", "/lost", 100),
    ];
    let mut tools = Toolbox::new();
    for (name, method, path, max) in careless {
        tools = tools.with(Arc::new(careless_tool(name, method, path, &base, max)));
    }
    let names = careless.map(|(name, ..)| name);
    let order = json!({"order_id": "ord_55"});
    let calls = names.map(|name| (name, order.clone()));
    let script = Script::default().then_call(&calls);
    let policy = harness::allowing("careless", &names);
    let (engine, _clock) = engine_on(backend, &policy, script, tools, None).await;

    let report = engine.start(scripted_task("ben")).await.unwrap();

    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        harness::statuses(&history),
        [
            ActionStatus::Succeeded,
            ActionStatus::Succeeded,
            ActionStatus::Failed,
            ActionStatus::Unknown
        ]
    );
    // Scrubbed before the cut: the token across byte 100 is redacted whole, then cut after.
    let cut = &history.actions[1].result.as_ref().unwrap().content;
    let kept = format!("{}[redacted] and the ", "x".repeat(81));
    assert!(cut.contains(&kept), "{cut}");
    let audit = audit_api::audit_over_http(engine, &report.run_id).await;
    // What the service said is there, its secrets redacted: the test is not vacuous.
    assert!(audit.contains("[redacted]"), "{audit}");
    assert!(audit.contains("only the first 100 are kept"), "{audit}");
    assert!(
        audit.contains("the service refused the call (403"),
        "{audit}"
    );
    assert!(audit.contains("failed while handling"), "{audit}");
    assert_no_secret_in("GET /runs/{id}/audit", audit.as_bytes());

    // Credentials in the URL never get that far: the binding is refused, naming its field.
    let with_credentials: HttpBinding = toml::from_str(
        "method = \"GET\"\nurl = \"http://refunder:pw-secret-789@orders.example/x\"\n",
    )
    .unwrap();
    let refused = with_credentials
        .resolve("tools.read_echo.http", &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        refused.starts_with("tools.read_echo.http.url: "),
        "{refused}"
    );
    assert!(!refused.contains("pw-secret-789"), "{refused}");
}

#[tokio::test]
async fn given_a_binding_with_secrets_in_every_form_when_the_service_echoes_them_then_the_state_file_holds_none()
 {
    let state = Embedded::fresh();
    given_a_binding_with_secrets_in_every_form_when_the_service_echoes_them_then_the_audit_and_api_show_none(&state).await;

    let bytes = state.bytes();
    assert!(
        bytes.windows(10).any(|w| w == b"[redacted]"),
        "the results are in the file"
    );
    assert_no_secret_in("the state directory", &bytes);
}
