//! The real Anthropic client against a scripted Messages server on loopback: the requests it
//! sends, the replies it reads, its retries, and a whole run driven through it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};
use shared::adapters::anthropic::AnthropicModel;
use shared::adapters::sqlite::SqliteStore;
use shared::agents::{self, Wiring};
use shared::domain::approval::{Choice, DecisionRequest};
use shared::domain::audit::AuditEvent;
use shared::domain::conversation::{Block, Message, StopReason, TurnUsage};
use shared::domain::ids::{ActionVersion, DecisionId, TenantId};
use shared::domain::run::RunStatus;
use shared::engine::{AgentFigures, Engine};
use shared::example::expense::{self, Ledger};
use shared::ports::clock::{Clock, SystemClock};
use shared::ports::counters::{ModelOutcome, TokenKind};
use shared::ports::model::{Model, ModelError, ModelRequest, ToolSpec};

/// A Messages API that answers from a script and remembers what it was sent.
#[derive(Clone, Default)]
struct Script {
    replies: Arc<Mutex<VecDeque<(u16, Value)>>>,
    seen: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

impl Script {
    fn reply(self, status: u16, body: Value) -> Self {
        self.replies.lock().unwrap().push_back((status, body));
        self
    }

    fn requests(&self) -> Vec<(HeaderMap, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

async fn messages(
    State(script): State<Script>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> (StatusCode, axum::Json<Value>) {
    script.seen.lock().unwrap().push((headers, body.0));
    let (status, reply) = script
        .replies
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((500, json!({"error": {"message": "script ran out"}})));
    (StatusCode::from_u16(status).unwrap(), axum::Json(reply))
}

async fn serve(script: Script) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .with_state(script);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

fn turn(text: &str, blocks: Vec<Value>, stop: &str) -> Value {
    let mut content = vec![json!({"type": "text", "text": text})];
    content.extend(blocks);
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test-20250929", "content": content, "stop_reason": stop, "usage": {"input_tokens": 1200, "output_tokens": 80}})
}

fn spec() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "get_claim".into(),
        description: "Reads a claim".into(),
        input_schema: json!({"type": "object"}),
    }]
}

#[tokio::test]
async fn the_client_sends_key_version_model_and_tools_and_reads_tool_use() {
    let script = Script::default().reply(
        200,
        turn(
            "Reading it.",
            vec![tool_use(
                "toolu_1",
                "get_claim",
                json!({"claim_id": "c-102"}),
            )],
            "tool_use",
        ),
    );
    let base = serve(script.clone()).await;
    let model = AnthropicModel::new("sk-test", "claude-test", &base);
    let messages = [Message::user_text("Process expense claim c-102.")];
    let tools = spec();
    let reply = model
        .respond(ModelRequest {
            system: "be careful",
            tools: &tools,
            messages: &messages,
        })
        .await
        .unwrap();

    assert_eq!(reply.stop_reason, StopReason::ToolUse);
    assert_eq!(
        reply.content[1],
        Block::ToolUse {
            id: "toolu_1".into(),
            name: "get_claim".into(),
            input: json!({"claim_id": "c-102"})
        }
    );
    let (headers, body) = &script.requests()[0];
    assert_eq!(headers["x-api-key"], "sk-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["system"], "be careful");
    assert_eq!(body["tools"][0]["name"], "get_claim");
    assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
    assert_eq!(
        body["messages"][0]["content"][0],
        json!({"type": "text", "text": "Process expense claim c-102."})
    );
}

#[tokio::test]
async fn an_overloaded_api_is_retried_and_a_bad_request_is_not() {
    let script = Script::default()
        .reply(529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
        .reply(200, turn("Hello.", vec![], "end_turn"))
        .reply(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "tools: bad schema"}}));
    let base = serve(script.clone()).await;
    let model = AnthropicModel::new("sk-test", "claude-test", &base);
    let messages = [Message::user_text("hi")];
    let request = ModelRequest {
        system: "",
        tools: &[],
        messages: &messages,
    };

    let reply = model.respond(request).await.unwrap();
    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    assert_eq!(script.requests().len(), 2, "one retry after 529");

    let refused = model.respond(request).await.unwrap_err();
    assert_eq!(
        refused,
        ModelError::Refused {
            status: 400,
            message: "tools: bad schema".into()
        }
    );
    assert_eq!(script.requests().len(), 3, "a 400 is not retried");
}

#[tokio::test]
async fn a_run_driven_by_the_api_pauses_then_sends_the_held_and_decided_results_together() {
    let c102 = json!({"claim_id": "c-102"});
    let script = Script::default()
        .reply(
            200,
            turn(
                "The claim asks $480 for one night; I'll pay the $250 limit.",
                vec![
                    tool_use("toolu_read", "get_claim", c102.clone()),
                    tool_use(
                        "toolu_pay",
                        "reimburse",
                        json!({"claim_id": "c-102", "amount_cents": 25000}),
                    ),
                ],
                "tool_use",
            ),
        )
        .reply(
            200,
            turn("Reimbursed $250.00 for claim c-102.", vec![], "end_turn"),
        );
    let base = serve(script.clone()).await;

    let dir = scratch("countersign-anthropic");
    let store = Arc::new(SqliteStore::open_dir(&dir).unwrap());
    let definition = agents::shipped_one(expense::AGENT).unwrap();
    let engine = played_by_the_api(&store, &base);

    let claims = expense::default_claims();
    let paused = engine
        .start(expense::task_for(&claims, "c-102").unwrap())
        .await
        .unwrap();
    assert_eq!(paused.status, RunStatus::AwaitingApproval);
    assert_eq!(
        script.requests().len(),
        1,
        "the model is not asked again while a person decides"
    );
    assert_eq!(
        script.requests()[0].1["system"],
        definition.system_prompt.as_str()
    );

    let dana = expense::default_directory().identify("dana").unwrap();
    let request = DecisionRequest {
        decision_id: DecisionId::parse("d-1").unwrap(),
        action_version: ActionVersion::FIRST,
        choice: Choice::Approve,
    };
    let decided = engine
        .decide(&dana, &paused.approvals[0].id, request)
        .await
        .unwrap();
    assert_eq!(decided.run.unwrap().status, RunStatus::Done);

    let (_, second) = &script.requests()[1];
    let last = second["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    let ids: Vec<&str> = last["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["toolu_read", "toolu_pay"],
        "both results of the paused turn, in one message, in order"
    );
    assert!(
        last["content"][1]["content"]
            .as_str()
            .unwrap()
            .contains("\"paid_cents\":25000")
    );
    let payments = Ledger::new(store).payments(&paused.tenant).await.unwrap();
    assert_eq!(payments.len(), 1);

    let history = engine
        .history(&paused.tenant, &paused.run_id)
        .await
        .unwrap();
    let turns: Vec<(&TurnUsage, StopReason)> = history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            AuditEvent::ModelTurn { usage, stop_reason } => Some((usage, *stop_reason)),
            _ => None,
        })
        .collect();
    let usage = TurnUsage {
        model: "claude-test-20250929".into(),
        input_tokens: Some(1200),
        output_tokens: Some(80),
    };
    assert_eq!(
        turns,
        [(&usage, StopReason::ToolUse), (&usage, StopReason::EndTurn)],
        "each turn's model and tokens are in the audit"
    );
    // Counted with the turns they were audited with: two requests, their tokens added up.
    let expense = expense_figures(&engine, &paused.tenant).await;
    assert_eq!(expense.model_requests[&ModelOutcome::Ok], 2);
    assert_eq!(expense.model_requests[&ModelOutcome::Error], 0);
    assert_eq!(expense.model_tokens[&TokenKind::Input], 2400);
    assert_eq!(expense.model_tokens[&TokenKind::Output], 160);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_run_whose_model_api_refuses_the_request_fails_and_the_request_is_counted_as_an_error() {
    let script = Script::default().reply(
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "tools: bad schema"}}),
    );
    let base = serve(script.clone()).await;
    let dir = scratch("countersign-anthropic-refused");
    let engine = played_by_the_api(&Arc::new(SqliteStore::open_dir(&dir).unwrap()), &base);

    let claims = expense::default_claims();
    let failed = engine
        .start(expense::task_for(&claims, "c-102").unwrap())
        .await
        .unwrap();

    assert_eq!(failed.status, RunStatus::Failed, "{failed:?}");
    assert_eq!(script.requests().len(), 1, "a bad request is not retried");
    let expense = expense_figures(&engine, &failed.tenant).await;
    assert_eq!(expense.model_requests[&ModelOutcome::Error], 1);
    assert_eq!(expense.model_requests[&ModelOutcome::Ok], 0);
    assert_eq!(expense.model_tokens[&TokenKind::Input], 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// A directory of this test's own under the system's temporary one, named after `name`.
fn scratch(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("{name}-{}-{nanos}", std::process::id()))
}

/// An engine over `store` whose shipped expense agent the real client plays against the
/// Messages API at `base`.
fn played_by_the_api(store: &Arc<SqliteStore>, base: &str) -> Engine {
    let definition = agents::shipped_one(expense::AGENT).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let wiring = Wiring::new(store.clone(), clock, expense::default_claims());
    let agent = wiring
        .build(&definition)
        .unwrap()
        .with_model(Arc::new(AnthropicModel::new(
            "sk-test",
            "claude-test",
            base,
        )));
    Engine::builder(store.clone()).agent(agent).build()
}

/// The expense agent's figures of `tenant`.
async fn expense_figures(engine: &Engine, tenant: &TenantId) -> AgentFigures {
    let figures = engine.figures(Some(tenant)).await.unwrap();
    figures
        .agents
        .into_iter()
        .find(|a| a.agent.as_str() == "expense")
        .expect("the expense agent is shown")
}
