//! The OpenAI-compatible client against a Chat Completions stand-in on loopback that answers
//! with the API's documented JSON shapes: the requests it sends, the replies it reads (a tool
//! call, a refusal, arguments that are not JSON), its retries (429 with `retry-after`, 500 then
//! success) and its time per turn; then the refunds walkthrough played through that wire format
//! on both stores, its definition changed in its `[model]` table only.

#[macro_use]
mod harness;
#[path = "harness/dynamodb.rs"]
mod dynamodb_backend;
mod support;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::routing::{get, post};
use serde_json::{Value, json};
use shared::adapters::openai::{OpenAiEndpoint, OpenAiModel};
use shared::agents::{Definition, Dir, Wiring};
use shared::domain::approval::{Choice, DecisionRequest};
use shared::domain::audit::AuditEvent;
use shared::domain::conversation::{Block, Message, StopReason, TurnUsage};
use shared::domain::ids::{ActionVersion, AgentName, DecisionId, PersonId};
use shared::domain::money::Amount;
use shared::domain::run::RunStatus;
use shared::engine::{Delivery, Engine, StartRun};
use shared::example::expense::{default_claims, default_directory};
use shared::ports::clock::{Clock, SystemClock};
use shared::ports::model::{Model, ModelError, ModelRequest, ToolSpec};

use dynamodb_backend::DynamoDb;
use harness::{Backend, Embedded, acme, event_names};

const KEY: &str = "sk-test-4f9c2a7e";
const ANSWERING_MODEL: &str = "gpt-4o-2024-08-06";

// ---------------------------------------------------------------------------------------------
// A Chat Completions stand-in
// ---------------------------------------------------------------------------------------------

/// One canned answer: a status, headers and a JSON body.
struct Canned {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Value,
}

/// A Chat Completions API that answers from a script and remembers what it was sent.
#[derive(Clone, Default)]
struct Completions {
    replies: Arc<Mutex<VecDeque<Canned>>>,
    seen: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

impl Completions {
    fn reply(self, status: u16, body: Value) -> Self {
        self.reply_with(status, &[], body)
    }

    fn reply_with(self, status: u16, headers: &[(&'static str, &str)], body: Value) -> Self {
        let headers = headers.iter().map(|(n, v)| (*n, v.to_string())).collect();
        self.replies.lock().unwrap().push_back(Canned {
            status,
            headers,
            body,
        });
        self
    }

    fn requests(&self) -> Vec<(HeaderMap, Value)> {
        self.seen.lock().unwrap().clone()
    }

    /// Serves it on loopback; returns its base URL (`…/v1`).
    async fn serve(&self) -> String {
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(self.clone());
        format!("{}/v1", serve(app).await)
    }
}

async fn completions(
    State(api): State<Completions>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> (StatusCode, HeaderMap, axum::Json<Value>) {
    api.seen.lock().unwrap().push((headers, body.0));
    let canned = api.replies.lock().unwrap().pop_front().unwrap_or(Canned {
        status: 500,
        headers: vec![],
        body: json!({"error": {"message": "the script ran out"}}),
    });
    let mut headers = HeaderMap::new();
    for (name, value) in canned.headers {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    (
        StatusCode::from_u16(canned.status).unwrap(),
        headers,
        axum::Json(canned.body),
    )
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A chat completion as the API documents it: one choice, its finish reason, and usage.
fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1_764_600_000,
        "model": ANSWERING_MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 812, "completion_tokens": 64, "total_tokens": 876},
        "system_fingerprint": "fp_6b68a8204b",
    })
}

/// The model's message: its words and its calls, each `(id, name, arguments as text)`.
fn assistant(content: Option<&str>, calls: &[(&str, &str, &str)]) -> Value {
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
    }
    message
}

/// A turn of tool calls, as the API ends one.
fn calls(content: &str, calls: &[(&str, &str, &str)]) -> Value {
    completion(assistant(Some(content), calls), "tool_calls")
}

/// A last turn: words only.
fn words(content: &str) -> Value {
    completion(assistant(Some(content), &[]), "stop")
}

/// The API's error body.
fn api_error(message: &str, kind: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

fn model_at(base_url: &str, turn_timeout: Duration) -> OpenAiModel {
    let endpoint = OpenAiEndpoint {
        base_url,
        key: Some((KEY, "OPENAI_API_KEY")),
        turn_timeout,
    };
    OpenAiModel::new(endpoint, "gpt-4o", 512).unwrap()
}

fn order_tool() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "get_order".into(),
        description: "Reads an order.".into(),
        input_schema: json!({"type": "object", "properties": {"order_id": {"type": "string"}}}),
    }]
}

async fn one_turn(model: &OpenAiModel) -> Result<shared::ports::model::ModelReply, ModelError> {
    let messages = [Message::user_text("Refund USD 125 for order ord_55.")];
    let tools = order_tool();
    model
        .respond(ModelRequest {
            system: "You refund orders.",
            tools: &tools,
            messages: &messages,
        })
        .await
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_client_sends_the_key_the_model_and_the_tools_and_reads_a_tool_call_and_its_usage() {
    let api = Completions::default().reply(
        200,
        calls(
            "I'll look up order ord_55.",
            &[("call_get", "get_order", r#"{"order_id":"ord_55"}"#)],
        ),
    );
    let model = model_at(&api.serve().await, Duration::from_secs(10));

    let reply = one_turn(&model).await.unwrap();

    assert_eq!(reply.stop_reason, StopReason::ToolUse);
    assert_eq!(
        reply.content,
        [
            Block::Text {
                text: "I'll look up order ord_55.".into()
            },
            Block::ToolUse {
                id: "call_get".into(),
                name: "get_order".into(),
                input: json!({"order_id": "ord_55"}),
            },
        ]
    );
    assert_eq!(
        reply.usage,
        Some(TurnUsage {
            model: ANSWERING_MODEL.into(),
            input_tokens: Some(812),
            output_tokens: Some(64),
        })
    );
    let (headers, body) = &api.requests()[0];
    assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["max_completion_tokens"], 512);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You refund orders."},
            {"role": "user", "content": "Refund USD 125 for order ord_55."},
        ])
    );
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {
            "name": "get_order",
            "description": "Reads an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        }})
    );
}

#[tokio::test]
async fn a_refusal_is_the_turns_text_and_ends_it() {
    let refusal = json!({"role": "assistant", "content": null, "refusal": "I can't help with moving that money."});
    let api = Completions::default().reply(200, completion(refusal, "stop"));
    let model = model_at(&api.serve().await, Duration::from_secs(10));

    let reply = one_turn(&model).await.unwrap();

    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    assert_eq!(
        reply.content,
        [Block::Text {
            text: "I can't help with moving that money.".into()
        }]
    );
}

#[tokio::test]
async fn a_429_is_tried_again_after_the_wait_its_retry_after_asks_for() {
    let api = Completions::default()
        .reply_with(
            429,
            &[("retry-after", "1")],
            api_error(
                "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500.",
                "requests",
                "rate_limit_exceeded",
            ),
        )
        .reply(200, words("Done."));
    let model = model_at(&api.serve().await, Duration::from_secs(10));

    let began = Instant::now();
    let reply = one_turn(&model).await.unwrap();

    assert_eq!(
        reply.content,
        [Block::Text {
            text: "Done.".into()
        }]
    );
    assert_eq!(api.requests().len(), 2);
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "waited as asked: {:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_500_is_tried_again_and_a_refused_request_is_not_and_names_no_key() {
    let api = Completions::default()
        .reply(
            500,
            api_error(
                "The server had an error while processing your request.",
                "server_error",
                "",
            ),
        )
        .reply(200, words("Hello."))
        .reply(
            401,
            api_error(
                &format!("Incorrect API key provided: {KEY}. You can find your API key at https://platform.openai.com/account/api-keys."),
                "invalid_request_error",
                "invalid_api_key",
            ),
        );
    let model = model_at(&api.serve().await, Duration::from_secs(10));

    let reply = one_turn(&model).await.unwrap();
    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    assert_eq!(api.requests().len(), 2, "one retry after the 500");

    let refused = one_turn(&model).await.unwrap_err();
    let ModelError::Refused { status, message } = &refused else {
        panic!("refused: {refused:?}");
    };
    assert_eq!(*status, 401);
    assert!(message.starts_with("Incorrect API key provided: [redacted]."));
    assert!(!refused.to_string().contains(KEY), "{refused}");
    assert_eq!(api.requests().len(), 3, "a 401 is not retried");
}

#[tokio::test]
async fn a_wait_past_the_turns_time_ends_the_turn_at_once() {
    let api = Completions::default().reply_with(
        429,
        &[("retry-after", "30")],
        api_error(
            "You exceeded your current quota.",
            "insufficient_quota",
            "insufficient_quota",
        ),
    );
    let model = model_at(&api.serve().await, Duration::from_secs(3));

    let began = Instant::now();
    let error = one_turn(&model).await.unwrap_err();

    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    assert!(error.to_string().contains("no time left"), "{error}");
    assert_eq!(api.requests().len(), 1);
}

#[tokio::test]
async fn a_model_slower_than_the_turns_time_is_cut_off() {
    async fn slow() -> axum::Json<Value> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        axum::Json(words("Too late."))
    }
    let base = serve(Router::new().route("/v1/chat/completions", post(slow))).await;
    let model = model_at(&format!("{base}/v1"), Duration::from_secs(2));

    let began = Instant::now();
    let error = one_turn(&model).await.unwrap_err();

    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert!(matches!(error, ModelError::Unavailable(_)), "{error:?}");
}

// ---------------------------------------------------------------------------------------------
// The refunds walkthrough through the Chat Completions wire format, on both stores
// ---------------------------------------------------------------------------------------------

/// The orders service's part in the walkthrough: one order, and the refunds it was asked for
/// with their keys.
#[derive(Clone, Default)]
struct Orders {
    refunds: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Orders {
    async fn serve(&self) -> String {
        async fn order() -> axum::Json<Value> {
            axum::Json(json!({
                "id": "ord_55", "customer": "cus_18", "currency": "USD",
                "paid_cents": 14_900, "refundable_cents": 14_900,
                "items": [{"sku": "BLD-200", "name": "Countertop blender", "price_cents": 14_900, "quantity": 1}],
                "note": "The blender arrived with a cracked jug.",
            }))
        }
        async fn refund(
            State(orders): State<Orders>,
            headers: HeaderMap,
            body: axum::Json<Value>,
        ) -> axum::Json<Value> {
            let key = headers["idempotency-key"].to_str().unwrap().to_string();
            orders
                .refunds
                .lock()
                .unwrap()
                .push((key.clone(), body.0.clone()));
            axum::Json(json!({
                "refund_id": "re_1", "order_id": "ord_55", "amount_cents": body["amount_cents"],
                "currency": "USD", "idempotency_key": key,
            }))
        }
        let app = Router::new()
            .route("/orders/{id}", get(order))
            .route("/orders/{id}/refunds", post(refund))
            .with_state(self.clone());
        serve(app).await
    }

    fn refunds(&self) -> Vec<(String, Value)> {
        self.refunds.lock().unwrap().clone()
    }
}

/// The shipped refunds definition with its `[model]` table, and nothing else, replaced.
fn refunds_definition_with_model(table: &str, dir: &Path) -> Definition {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agents/refunds");
    std::fs::create_dir_all(dir).unwrap();
    for file in ["policy.toml", "script.toml"] {
        std::fs::copy(shipped.join(file), dir.join(file)).unwrap();
    }
    let agent = std::fs::read_to_string(shipped.join("agent.toml")).unwrap();
    let start = agent.find("[model]\n").expect("a [model] table");
    let end = start + agent[start..].find("\n[tools.").expect("tools after it");
    let agent = format!("{}{table}\n{}", &agent[..start], &agent[end..]);
    std::fs::write(dir.join("agent.toml"), agent).unwrap();
    Definition::load(&Dir(dir.to_path_buf())).expect("the changed definition loads")
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        Self(std::env::temp_dir().join(format!(
            "countersign-openai-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        )))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A process of the refunds agent on `backend`, its model the Chat Completions API at `api`, its
/// orders service at `orders`.
async fn refunds_engine(backend: &dyn Backend, api: &str, orders: &str, dir: &Path) -> Engine {
    let definition = refunds_definition_with_model(
        r#"[model]
provider = "openai"
id = "gpt-4o"
base_url = "${LLM_BASE_URL}"
api_key_env = "LLM_API_KEY"
max_turns = 8
offline = "script.toml""#,
        dir,
    );
    let env: HashMap<&str, String> = HashMap::from([
        ("LLM_BASE_URL", api.to_string()),
        ("LLM_API_KEY", KEY.to_string()),
        ("ORDERS_URL", orders.to_string()),
    ]);
    let lookup = move |var: &str| env.get(var).cloned();
    let store = backend.connect().await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let wiring = Wiring {
        env: &lookup,
        drives: true,
        ..Wiring::new(store.clone(), clock.clone(), default_claims())
    };
    let agent = definition.build(&wiring).expect("the refunds agent builds");
    Engine::builder(store)
        .agent(agent)
        .clock(clock)
        .delivery(Delivery::InProcess)
        .build()
}

fn refund_task() -> StartRun {
    StartRun {
        tenant: acme(),
        agent: AgentName::parse("refunds").unwrap(),
        requested_by: PersonId::parse("sam").unwrap(),
        started_by: None,
        task: "Refund USD 125 for order ord_55: the blender arrived damaged.".into(),
        approval_ttl: None,
    }
}

/// The messages of the `n`th request the API was sent.
fn sent_messages(api: &Completions, n: usize) -> Vec<Value> {
    api.requests()[n].1["messages"].as_array().unwrap().clone()
}

async fn given_the_refunds_agent_on_an_openai_compatible_api_when_mia_lowers_the_refund_then_version_2_runs_once_and_every_result_goes_back_as_a_tool_message(
    backend: &dyn Backend,
) {
    let api = Completions::default()
        .reply(
            200,
            calls(
                "I'll look up order ord_55.",
                &[("call_get", "get_order", r#"{"order_id":"ord_55"}"#)],
            ),
        )
        .reply(
            200,
            calls(
                "Order ord_55's blender arrived damaged and the customer paid USD 149.00, so I propose refunding USD 125.00.",
                &[(
                    "call_refund",
                    "issue_refund",
                    r#"{"order_id":"ord_55","amount_cents":12500,"currency":"USD","reason":"damaged_item"}"#,
                )],
            ),
        )
        .reply(200, words("Refunded USD 75.00 for ord_55 (re_1)."));
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = refunds_engine(
        backend,
        &api.serve().await,
        &orders.serve().await,
        &scratch.0,
    )
    .await;

    let paused = engine.start(refund_task()).await.unwrap();
    assert_eq!(paused.status, RunStatus::AwaitingApproval, "{paused:?}");
    let approval = paused.approvals[0].clone();
    assert_eq!(approval.tool, "issue_refund");
    assert_eq!(api.requests().len(), 2, "no turn while a person decides");
    let second = sent_messages(&api, 1);
    assert_eq!(
        second[2],
        json!({"role": "assistant", "content": "I'll look up order ord_55.", "tool_calls": [
            {"id": "call_get", "type": "function", "function": {"name": "get_order", "arguments": "{\"order_id\":\"ord_55\"}"}},
        ]})
    );
    assert_eq!(second[3]["role"], "tool");
    assert_eq!(second[3]["tool_call_id"], "call_get");
    assert!(
        second[3]["content"]
            .as_str()
            .unwrap()
            .contains("cracked jug")
    );

    let people = default_directory();
    let mia = people.identify("mia").unwrap();
    let lowered = DecisionRequest {
        decision_id: DecisionId::parse("d-mia").unwrap(),
        action_version: ActionVersion::FIRST,
        choice: Choice::Edit {
            amount: Amount::from_dollars(75),
            note: Some("Damage covers the jug only; USD 75 per the repair quote.".into()),
        },
    };
    let decided = engine.decide(&mia, &approval.id, lowered).await.unwrap();
    assert_eq!(decided.run.unwrap().status, RunStatus::Done);

    let key = format!("{}:2", approval.action_id);
    let refunds = orders.refunds();
    assert_eq!(refunds.len(), 1, "one refund: {refunds:?}");
    assert_eq!(refunds[0].0, key);
    assert_eq!(refunds[0].1["amount_cents"], 7_500);

    let third = sent_messages(&api, 2);
    let last = third.last().unwrap();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "call_refund");
    assert!(last["content"].as_str().unwrap().contains(&key), "{last}");
    for (headers, _) in api.requests() {
        assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
    }

    let history = engine.history(&acme(), &paused.run_id).await.unwrap();
    assert_eq!(
        history.run.answer.as_deref(),
        Some("Refunded USD 75.00 for ord_55 (re_1).")
    );
    let turns: Vec<(&TurnUsage, StopReason)> = history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            AuditEvent::ModelTurn { usage, stop_reason } => Some((usage, *stop_reason)),
            _ => None,
        })
        .collect();
    let expected = TurnUsage {
        model: ANSWERING_MODEL.into(),
        input_tokens: Some(812),
        output_tokens: Some(64),
    };
    assert_eq!(
        turns,
        [
            (&expected, StopReason::ToolUse),
            (&expected, StopReason::ToolUse),
            (&expected, StopReason::EndTurn)
        ]
    );
    let names = event_names(&history.entries);
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("model_turn") < at("proposed"), "{names:?}");
    let logged = serde_json::to_string(&history).unwrap();
    assert!(!logged.contains(KEY), "the key is in no record");
}

async fn given_a_tool_call_whose_arguments_are_not_json_then_the_model_is_told_so_and_the_run_goes_on(
    backend: &dyn Backend,
) {
    let api = Completions::default()
        .reply(
            200,
            calls(
                "I'll look up order ord_55.",
                &[("call_bad", "get_order", r#"{"order_id": "ord_55""#)],
            ),
        )
        .reply(
            200,
            words("I could not read the order; nothing was refunded."),
        );
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = refunds_engine(
        backend,
        &api.serve().await,
        &orders.serve().await,
        &scratch.0,
    )
    .await;

    let report = engine.start(refund_task()).await.unwrap();

    assert_eq!(report.status, RunStatus::Done, "{report:?}");
    let second = sent_messages(&api, 1);
    assert_eq!(
        second[2]["tool_calls"][0]["function"]["arguments"], r#"{"order_id": "ord_55""#,
        "the model's own text goes back as it wrote it"
    );
    let told = second.last().unwrap();
    assert_eq!(told["role"], "tool");
    assert_eq!(told["tool_call_id"], "call_bad");
    assert!(
        told["content"]
            .as_str()
            .unwrap()
            .contains("must be a JSON object"),
        "{told}"
    );
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert!(event_names(&history.entries).contains(&"refused"));
    assert!(orders.refunds().is_empty());
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
                    super::$scenario(&super::DynamoDb::fresh("openai").await).await;
                }
            )*
        }
    };
}

on_both_stores!([
    given_the_refunds_agent_on_an_openai_compatible_api_when_mia_lowers_the_refund_then_version_2_runs_once_and_every_result_goes_back_as_a_tool_message,
    given_a_tool_call_whose_arguments_are_not_json_then_the_model_is_told_so_and_the_run_goes_on,
]);
