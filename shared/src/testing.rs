//! Test doubles shared by the test suites and the bench (`countersign-bench`): scripted models,
//! a clock that can be moved forward, scratch directories, and an upstream MCP server. Built
//! only with the `testing` feature, so nothing here ships in the functions or the CLI.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpListing,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::domain::conversation::{Block, StopReason};
use crate::ports::clock::Clock;
use crate::ports::model::{Model, ModelError, ModelReply, ModelRequest};

/// A path in the system's temporary directory that no other process, and no earlier call, has
/// used: `countersign-{name}-{pid}-{nanos}`. Nothing is created.
pub fn scratch_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!("countersign-{name}-{}-{nanos}", std::process::id()))
}

/// Lambda's JSON log ([`crate::logs::lambda_json`]) of what this thread logs, at any level,
/// while it is held: the lines an async test's engine writes on its single-threaded runtime.
pub struct JsonLog {
    written: Written,
    _installed: tracing::subscriber::DefaultGuard,
}

impl JsonLog {
    pub fn capture() -> Self {
        let written = Written::default();
        let into = written.clone();
        let subscriber = crate::logs::lambda_json(move || into.clone())
            .with_max_level(tracing::Level::TRACE)
            .finish();
        Self {
            written,
            _installed: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Everything written so far, as written.
    pub fn text(&self) -> String {
        self.written.text()
    }

    /// Each line written so far, parsed.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.text()
            .lines()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: a JSON line: {line}"))
            })
            .collect()
    }
}

/// What a log wrote, shared between the subscriber that writes it and the test that reads it.
#[derive(Clone, Default)]
pub struct Written(Arc<Mutex<Vec<u8>>>);

impl Written {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).expect("a log writes UTF-8")
    }
}

impl std::io::Write for Written {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the audit holds, in order, of a run whose one call a person approved and that then ran
/// and finished: the history the scenarios and the walkthrough both read.
pub const APPROVED_RUN_EVENTS: [&str; 8] = [
    "started",
    "proposed",
    "paused",
    "decision",
    "executing",
    "executed",
    "resumed",
    "done",
];

/// What [`ScriptedAgent`] proposes to pay: the lodging limit, $250.
pub const PROPOSED_CENTS: i64 = 25_000;

/// What [`ScriptedAgent`] proposes when the task says "small": $50, which the expense policy
/// lets through without a person.
pub const SMALL_CENTS: i64 = 5_000;

/// A model that plays a fixed script: its nth reply is the nth turn, whatever it was told. Past
/// the script it ends the run.
#[derive(Clone, Default)]
pub struct Script {
    turns: Vec<Vec<(String, serde_json::Value)>>,
}

impl Script {
    /// The next turn proposes these calls, named `toolu_<turn>_<n>`.
    pub fn then_call(mut self, calls: &[(&str, serde_json::Value)]) -> Self {
        let calls = calls
            .iter()
            .map(|(name, input)| (name.to_string(), input.clone()))
            .collect();
        self.turns.push(calls);
        self
    }
}

#[async_trait]
impl Model for Script {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let turn = request.turn();
        let Some(calls) = self.turns.get(turn) else {
            return Ok(ModelReply {
                content: vec![Block::Text {
                    text: "The script is over.".into(),
                }],
                stop_reason: StopReason::EndTurn,
                usage: None,
            });
        };
        let mut content = vec![Block::Text {
            text: format!("Turn {turn} of the script."),
        }];
        content.extend(
            calls
                .iter()
                .enumerate()
                .map(|(n, (name, input))| Block::ToolUse {
                    id: format!("toolu_{turn}_{n}"),
                    name: name.clone(),
                    input: input.clone(),
                }),
        );
        Ok(ModelReply {
            content,
            stop_reason: StopReason::ToolUse,
            usage: None,
        })
    }
}

/// A model that proposes `reimburse` of $250 (or [`SMALL_CENTS`] when the task says "small") on
/// the claim (`b-…`) named in the task, then reports what came of it. No network, no reading: the engine's cost, not the model's, is what is measured.
pub struct ScriptedAgent;

#[async_trait]
impl Model for ScriptedAgent {
    fn name(&self) -> &str {
        "bench-script"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let turn = request.turn();
        if turn == 0 {
            let task = request
                .messages
                .first()
                .map(|m| m.text())
                .unwrap_or_default();
            let claim = task
                .split_whitespace()
                .map(|w| w.trim_end_matches('.'))
                .find(|w| w.starts_with("b-"))
                .ok_or_else(|| ModelError::BadReply(format!("no claim in {task:?}")))?;
            let cents = match task.contains("small") {
                true => SMALL_CENTS,
                false => PROPOSED_CENTS,
            };
            return Ok(ModelReply {
                content: vec![
                    Block::Text {
                        text: format!(
                            "Claim {claim} is one night of lodging at $480; the limit is $250 a night, so I propose paying ${}.",
                            cents / 100
                        ),
                    },
                    Block::ToolUse {
                        id: "toolu_bench_0".into(),
                        name: "reimburse".into(),
                        input: json!({"claim_id": claim, "amount_cents": cents, "note": "Lodging is capped at $250 a night."}),
                    },
                ],
                stop_reason: StopReason::ToolUse,
                usage: None,
            });
        }
        let told = request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                Block::ToolResult { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .next_back()
            .unwrap_or("nothing");
        Ok(ModelReply {
            content: vec![Block::Text {
                text: format!("Reimbursement outcome: {told}"),
            }],
            stop_reason: StopReason::EndTurn,
            usage: None,
        })
    }
}

/// The system clock, moved forward on demand (to put approvals past their deadline).
#[derive(Default)]
pub struct SkewedClock {
    ahead_ms: AtomicI64,
}

impl SkewedClock {
    /// Moves the clock to just past `at`, if it is not there yet.
    pub fn move_past(&self, at: DateTime<Utc>) {
        let needed = (at - Utc::now()).num_milliseconds() + 1_000;
        self.ahead_ms.fetch_max(needed, Ordering::SeqCst);
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.ahead_ms.load(Ordering::SeqCst))
    }
}

/// The orders agent's policy, for the tests and the bench: a tool its MCP server calls read-only
/// runs, a refund waits for one finance approver.
pub const ORDERS_POLICY: &str = include_str!("../tests/fixtures/policies/orders-refunds.toml");

/// How [`McpTools`] answers a call: from the call and its HTTP request's head.
type Answer =
    dyn Fn(CallToolRequestParams, &Parts) -> Result<CallToolResult, ErrorData> + Send + Sync;

/// An upstream MCP server for the tests and the bench: a fixed list of tools over Streamable
/// HTTP, each call answered by one function, which sees the request's headers and URI.
#[derive(Clone)]
pub struct McpTools {
    tools: Arc<Vec<McpListing>>,
    answer: Arc<Answer>,
}

impl McpTools {
    pub fn new(
        tools: Vec<McpListing>,
        answer: impl Fn(CallToolRequestParams, &Parts) -> Result<CallToolResult, ErrorData>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            tools: Arc::new(tools),
            answer: Arc::new(answer),
        }
    }

    /// Serves it at `/mcp` on a loopback port of its own: its address and its serving task.
    pub async fn serve(self) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
        let service: StreamableHttpService<McpTools, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(self.clone()),
                Default::default(),
                StreamableHttpServerConfig::default(),
            );
        let router = axum::Router::new().nest_service("/mcp", service);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok((addr, task))
    }
}

impl ServerHandler for McpTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context
            .extensions
            .get::<Parts>()
            .ok_or_else(|| ErrorData::internal_error("a call without its HTTP request", None))?;
        Ok((self.answer)(request, parts)?.into())
    }
}

/// A tool's input schema: an object of `properties`.
pub fn object_schema(properties: serde_json::Value) -> Arc<JsonObject> {
    let schema = json!({"type": "object", "properties": properties});
    Arc::new(schema.as_object().expect("an object").clone())
}
