//! Each model API's client against a stand-in on loopback that answers with the API's
//! documented JSON shapes: the requests it sends, the replies it reads (a tool call, a refusal,
//! arguments that are not JSON), its retries (429, 500 then success) and its time per turn; then
//! the refunds walkthrough played through each wire format on both stores, its definition changed
//! in its `[model]` table only.

#[macro_use]
#[path = "../harness/mod.rs"]
mod harness;
#[path = "../support/audit_api.rs"]
mod audit_api;
#[path = "../harness/dynamodb.rs"]
mod dynamodb_backend;
#[path = "../support/secret_forms.rs"]
mod secret_forms;
#[path = "../support/mod.rs"]
mod support;

/// Each scenario listed, as a test on the embedded store and one on DynamoDB (moto over HTTP).
macro_rules! on_both_stores {
    ([$($scenario:ident),* $(,)?]) => {
        mod embedded {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(&crate::Embedded::fresh()).await;
                }
            )*
        }
        mod dynamodb {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(&crate::DynamoDb::fresh("model-apis").await).await;
                }
            )*
        }
    };
}

mod bedrock;
mod openai;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::routing::{get, post};
use serde_json::{Value, json};
use shared::agents::{Definition, DefinitionError, Dir, Wiring};
use shared::domain::approval::{Approval, Choice, DecisionRequest};
use shared::domain::audit::AuditEvent;
use shared::domain::conversation::{Block, Message, StopReason, TurnUsage};
use shared::domain::ids::{ActionVersion, AgentName, DecisionId, PersonId};
use shared::domain::money::Amount;
use shared::domain::run::RunStatus;
use shared::engine::{Delivery, Engine, History, RunReport, StartRun};
use shared::example::expense::{default_claims, default_directory};
use shared::ports::clock::{Clock, SystemClock};
use shared::ports::model::{Model, ModelError, ModelReply, ModelRequest, ToolSpec};

use dynamodb_backend::DynamoDb;
use harness::{Backend, Embedded, acme, event_names};

// ---------------------------------------------------------------------------------------------
// A model API that answers from a script
// ---------------------------------------------------------------------------------------------

/// One canned answer: a status, headers and a JSON body.
struct Canned {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Value,
}

/// A model API that answers from a script and remembers what it was sent.
#[derive(Clone, Default)]
struct ScriptedApi {
    replies: Arc<Mutex<VecDeque<Canned>>>,
    seen: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

impl ScriptedApi {
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

    /// Serves it on loopback at `route`; returns its base URL.
    async fn serve(&self, route: &str) -> String {
        let app = Router::new()
            .route(route, post(answer))
            .with_state(self.clone());
        serve(app).await
    }
}

async fn answer(
    State(api): State<ScriptedApi>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> (StatusCode, HeaderMap, axum::Json<Value>) {
    api.seen.lock().unwrap().push((headers, body.0));
    let canned = api.replies.lock().unwrap().pop_front().unwrap_or(Canned {
        status: 500,
        headers: vec![],
        body: json!({"message": "the script ran out"}),
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

fn order_tool() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "get_order".into(),
        description: "Reads an order.".into(),
        input_schema: json!({"type": "object", "properties": {"order_id": {"type": "string"}}}),
    }]
}

/// One turn of `model` on a task with the order tool.
async fn one_turn(model: &dyn Model) -> Result<ModelReply, ModelError> {
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

/// The walkthrough's first turn as the engine reads it: words, then the call `id` of get_order.
fn looking_up_ord_55(id: &str) -> Vec<Block> {
    vec![
        Block::Text {
            text: "I'll look up order ord_55.".into(),
        },
        Block::ToolUse {
            id: id.into(),
            name: "get_order".into(),
            input: json!({"order_id": "ord_55"}),
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// The refunds walkthrough's parts
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
    load_refunds_with_model(table, dir).expect("the changed definition loads")
}

/// [`refunds_definition_with_model`], written to `dir` and loaded, or why it did not load.
fn load_refunds_with_model(table: &str, dir: &Path) -> Result<Definition, DefinitionError> {
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
    Definition::load(&Dir(dir.to_path_buf()))
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        Self(std::env::temp_dir().join(format!(
            "countersign-model-apis-{}-{:016x}",
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

/// A process of the refunds agent on `backend` whose `[model]` table is `table` (its `${VAR}`
/// and the orders service's URL from `env`), played by `model` where one is given.
async fn refunds_engine(
    backend: &dyn Backend,
    table: &str,
    env: &[(&str, &str)],
    model: Option<Arc<dyn Model>>,
    dir: &Path,
) -> Engine {
    let definition = refunds_definition_with_model(table, dir);
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |var: &str| env.get(var).cloned();
    let store = backend.connect().await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let wiring = Wiring {
        env: &lookup,
        drives: true,
        ..Wiring::new(store.clone(), clock.clone(), default_claims())
    };
    let mut agent = wiring.build(&definition).expect("the refunds agent builds");
    if let Some(model) = model {
        agent = agent.with_model(model);
    }
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
        standing: Default::default(),
    }
}

/// The walkthrough's people: sam asks for USD 125; the run pauses on it; mia, a finance
/// manager, lowers it to USD 75, version 2, which policy allows, so it runs at once and the run
/// finishes. Returns the approval and the run's history; the service holds the one refund.
async fn mia_lowers_the_refund_to_75(engine: &Engine, orders: &Orders) -> (Approval, History) {
    let paused = engine.start(refund_task()).await.unwrap();
    assert_eq!(paused.status, RunStatus::AwaitingApproval, "{paused:?}");
    let approval = paused.approvals[0].clone();
    assert_eq!(approval.tool, "issue_refund");
    assert!(
        orders.refunds().is_empty(),
        "nothing refunded before a person decides"
    );

    let mia = default_directory().identify("mia").unwrap();
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

    let refunds = orders.refunds();
    assert_eq!(refunds.len(), 1, "one refund: {refunds:?}");
    assert_eq!(refunds[0].0, format!("{}:2", approval.action_id));
    assert_eq!(refunds[0].1["amount_cents"], 7_500);
    let history = engine.history(&acme(), &paused.run_id).await.unwrap();
    (approval, history)
}

/// A run whose model called with arguments that are not an object, told so in `told` (the text
/// of the result it was sent): the run went on to its end, the call was audited as refused
/// before policy, and nothing was refunded.
async fn told_not_an_object(engine: &Engine, report: &RunReport, orders: &Orders, told: &str) {
    assert_eq!(report.status, RunStatus::Done, "{report:?}");
    assert!(told.contains("must be a JSON object"), "{told}");
    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    assert!(event_names(&history.entries).contains(&"refused"));
    assert!(orders.refunds().is_empty());
}

/// Each `model_turn` of the audit: what the API reported, and why the model stopped.
fn model_turns(history: &History) -> Vec<(TurnUsage, StopReason)> {
    history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            AuditEvent::ModelTurn { usage, stop_reason } => Some((usage.clone(), *stop_reason)),
            _ => None,
        })
        .collect()
}
