//! MCP tools against a real MCP server (rmcp's server side) over Streamable HTTP on loopback:
//! listing, hints, the key in `_meta`, error results, and the outcomes of a call whose answer
//! never comes back. The engine over MCP tools, and agents defined by files alone, are in
//! [`engine`]; a server that quotes the binding's secrets back in [`secrets`]; a server started
//! over stdio in [`stdio`]: one test binary.

#[path = "../support/audit_api.rs"]
mod audit_api;
#[path = "../harness/mod.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../support/mcp_servers.rs"]
mod mcp_servers;
#[path = "../support/secret_forms.rs"]
mod secret_forms;

mod engine;
mod secrets;
mod stdio;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool as McpListing, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use shared::adapters::mcp_tool::{McpError, McpServer, McpServerBinding, McpTool, ToolSelection};
use shared::agents::{Definition, DefinitionError, InMemory, Wiring};
use shared::domain::action::ActionStatus;
use shared::domain::action::ToolOutcome;
use shared::domain::args::Args;
use shared::domain::ids::{AgentName, PersonId, RunId, TenantId};
use shared::domain::policy::{Policy, ToolHints};
use shared::domain::run::RunStatus;
use shared::engine::{Agent, Delivery, ErrorKind, ResumeReport, StartRun};
use shared::ports::tools::{Tool, ToolCall, Toolbox};
use shared::testing::object_schema;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

const TOKEN: &str = "tok-9f2c41d7e0";

/// What the orders server saw and did.
#[derive(Default)]
struct Seen {
    /// Refunds made, by idempotency key: how many times each key acted.
    effects: Mutex<BTreeMap<String, u32>>,
    /// Every `tools/call`: the tool, its key, its arguments.
    calls: Mutex<Vec<(String, Option<String>, Value)>>,
    authorizations: Mutex<Vec<String>>,
    /// The Streamable HTTP session of each `tools/call`, when there is one.
    sessions: Mutex<Vec<String>>,
    /// Told when a stalling refund has taken effect.
    committed: Notify,
}

impl Seen {
    fn effects(&self) -> BTreeMap<String, u32> {
        self.effects.lock().unwrap().clone()
    }

    /// The tools called so far, by name, in order.
    fn tools_called(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.0.clone())
            .collect()
    }

    fn act(&self, key: &Option<String>) -> u32 {
        let mut effects = self.effects.lock().unwrap();
        let count = effects
            .entry(key.clone().unwrap_or_else(|| "<no key>".into()))
            .or_default();
        *count += 1;
        effects.len() as u32
    }
}

#[derive(Clone)]
struct OrdersServer {
    seen: Arc<Seen>,
    /// Speaks only 2025-11-25 (see [`Flavour::SessionsOnly`]).
    sessions: bool,
}

const WITH_SESSIONS: &[ProtocolVersion] = &[ProtocolVersion::V_2025_11_25];

fn listing() -> Vec<McpListing> {
    let amount = json!({"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}});
    vec![
        McpListing::new(
            "get_order",
            "Reads an order.",
            object_schema(json!({"order_id": {"type": "string"}})),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        McpListing::new("issue_refund", "Refunds part of an order.", {
            let mut refund = (*object_schema(amount.clone())).clone();
            refund.insert("required".into(), json!(["order_id", "amount_cents"]));
            Arc::new(refund)
        })
        .annotate(ToolAnnotations::new().destructive(true)),
        McpListing::new(
            "cancel_order",
            "Cancels an order.",
            object_schema(json!({"order_id": {"type": "string"}})),
        ),
        // Listed, but the server no longer serves it: calls get a JSON-RPC error.
        McpListing::new(
            "archive_order",
            "Archives an order.",
            object_schema(json!({"order_id": {"type": "string"}})),
        ),
        McpListing::new(
            "stall_refund",
            "Refunds, then never answers.",
            object_schema(amount),
        )
        .annotate(ToolAnnotations::new().destructive(true)),
    ]
}

impl ServerHandler for OrdersServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.sessions {
            Cow::Borrowed(WITH_SESSIONS)
        } else {
            Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    /// Two pages, so the client must follow the cursor.
    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = listing();
        let second_page = request.and_then(|r| r.cursor).is_some();
        let page = if second_page {
            tools.split_off(2)
        } else {
            tools.truncate(2);
            tools
        };
        let mut result = ListToolsResult::with_all_items(page);
        if !second_page {
            result.next_cursor = Some("page-2".into());
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(parts) = context.extensions.get::<axum::http::request::Parts>() {
            let header = |name: &str| {
                parts
                    .headers
                    .get(name)
                    .map(|value| value.to_str().unwrap_or_default().to_string())
            };
            if let Some(value) = header("authorization") {
                self.seen.authorizations.lock().unwrap().push(value);
            }
            if let Some(value) = header("mcp-session-id") {
                self.seen.sessions.lock().unwrap().push(value);
            }
        }
        let key = request
            .meta
            .as_ref()
            .and_then(|meta| meta.0.0.get("idempotency_key"))
            .or_else(|| context.meta.0.0.get("idempotency_key"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        self.seen
            .calls
            .lock()
            .unwrap()
            .push((request.name.to_string(), key.clone(), args.clone()));
        let result = match request.name.as_ref() {
            "get_order" => CallToolResult::success(vec![ContentBlock::text(
                json!({"order_id": args["order_id"], "total_cents": 12500, "status": "delivered"})
                    .to_string(),
            )]),
            "issue_refund" => {
                let refunds = self.seen.act(&key);
                CallToolResult::structured(json!({
                    "refund_id": format!("rf-{refunds}"),
                    "order_id": args["order_id"],
                    "amount_cents": args["amount_cents"],
                    "key": key,
                }))
            }
            "cancel_order" => CallToolResult::error(vec![ContentBlock::text(
                "order ord_55 has shipped, so it cannot be cancelled",
            )]),
            "stall_refund" => {
                self.seen.act(&key);
                self.seen.committed.notify_one();
                tokio::time::sleep(Duration::from_secs(120)).await;
                CallToolResult::structured(json!({"late": true}))
            }
            _ => return Err(ErrorData::invalid_params("no such tool", None)),
        };
        Ok(result.into())
    }
}

/// One orders server on loopback.
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

/// How a test's orders server behaves beyond its tools.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// rmcp's server as it comes.
    Plain,
    /// Speaks only 2025-11-25, whose Streamable HTTP sessions a restart forgets.
    SessionsOnly,
    /// Runs every `issue_refund` call to the end, then answers it with a 500.
    FailsAfterCommit,
    /// Answers every `get_order` call, a read, with a 500 once it ran.
    ReadsFailAfterRunning,
}

impl Server {
    async fn start(seen: Arc<Seen>) -> Self {
        Self::start_as(seen, Flavour::Plain).await
    }

    /// A server of `flavour`, and a fresh record of what it sees.
    async fn seeing(flavour: Flavour) -> (Arc<Seen>, Self) {
        let seen = Arc::new(Seen::default());
        let server = Self::start_as(seen.clone(), flavour).await;
        (seen, server)
    }

    async fn start_as(seen: Arc<Seen>, flavour: Flavour) -> Self {
        let sessions = flavour == Flavour::SessionsOnly;
        let service: StreamableHttpService<OrdersServer, LocalSessionManager> =
            StreamableHttpService::new(
                move || {
                    Ok(OrdersServer {
                        seen: seen.clone(),
                        sessions,
                    })
                },
                Default::default(),
                StreamableHttpServerConfig::default(),
            );
        let mut router = axum::Router::new().nest_service("/mcp", service);
        let failing = match flavour {
            Flavour::FailsAfterCommit => Some("issue_refund"),
            Flavour::ReadsFailAfterRunning => Some("get_order"),
            Flavour::Plain | Flavour::SessionsOnly => None,
        };
        if let Some(tool) = failing {
            router = router.layer(axum::middleware::from_fn_with_state(
                tool,
                fail_after_commit,
            ));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self { addr, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Lets a call of `tool` run to its end (its whole answer read), then answers 500 instead.
async fn fail_after_commit(
    axum::extract::State(tool): axum::extract::State<&'static str>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let mentions = |text: &[u8]| body.windows(text.len()).any(|w| w == text);
    let is_call = mentions(b"tools/call") && mentions(tool.as_bytes());
    let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(body));
    let response = next.run(request).await;
    if !is_call {
        return response;
    }
    let answer = axum::body::to_bytes(response.into_body(), usize::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(5), answer).await;
    axum::response::IntoResponse::into_response(axum::http::StatusCode::INTERNAL_SERVER_ERROR)
}

/// A TCP relay in front of a server, so a test can cut every connection at once (the server
/// gone mid-call) or send new connections to another server (a restart).
struct Relay {
    addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<JoinSet<()>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// A server of `flavour` and its record of what it saw, a relay in front of it, and a
    /// connection through the relay.
    async fn before(flavour: Flavour) -> (Arc<Seen>, Server, Self, McpServer) {
        let (seen, server) = Server::seeing(flavour).await;
        let relay = Self::start(server.addr).await;
        let orders = connect(relay.addr, "5s").await.unwrap();
        (seen, server, relay, orders)
    }

    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target));
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let accept = tokio::spawn({
            let target = target.clone();
            let connections = connections.clone();
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let to = *target.lock().unwrap();
                    connections.lock().unwrap().spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(to).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                }
            }
        });
        Self {
            addr,
            target,
            connections,
            accept,
        }
    }

    /// Every open connection dropped and no new one accepted: the server is gone.
    fn cut(&self) {
        self.accept.abort();
        self.connections.lock().unwrap().abort_all();
    }

    /// Open connections dropped, new ones go to `target`: the server restarted.
    fn restart_on(&self, target: SocketAddr) {
        *self.target.lock().unwrap() = target;
        self.connections.lock().unwrap().abort_all();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

fn binding(text: &str) -> McpServerBinding {
    #[derive(serde::Deserialize)]
    struct Definition {
        mcp: BTreeMap<String, McpServerBinding>,
    }
    let definition: Definition = toml::from_str(text).unwrap();
    definition.mcp["orders"].clone()
}

/// The orders binding at `addr`, its URL and token from the environment.
async fn connect(addr: SocketAddr, timeout: &str) -> Result<McpServer, McpError> {
    let url = format!("http://{addr}/mcp");
    let env = move |name: &str| match name {
        "ORDERS_MCP_URL" => Some(url.clone()),
        "ORDERS_MCP_TOKEN" => Some(TOKEN.to_string()),
        _ => None,
    };
    let binding = binding(&format!(
        r#"
        [mcp.orders]
        url = "${{ORDERS_MCP_URL}}"
        headers = {{ Authorization = "Bearer ${{ORDERS_MCP_TOKEN}}" }}
        timeout = "{timeout}"
        tools = "*"
        "#
    ));
    let resolved = binding.resolve("mcp.orders", &env).unwrap();
    McpServer::connect(resolved).await
}

async fn call(tool: &McpTool, args: Value, key: &str) -> ToolOutcome {
    let tenant = TenantId::parse("acme").unwrap();
    let run_id = RunId::parse("run-mcp1").unwrap();
    let args = Args::new(args).unwrap();
    tool.call(ToolCall {
        tenant: &tenant,
        run_id: &run_id,
        args: &args,
        idempotency_key: key,
    })
    .await
}

fn refund() -> Value {
    json!({"order_id": "ord_55", "amount_cents": 7500})
}

/// What a call that succeeded got back, as the server gave it: its blocks and structured
/// content, as JSON.
fn answered(outcome: &ToolOutcome) -> Value {
    match outcome {
        ToolOutcome::Mcp {
            content,
            structured_content,
            is_error: false,
        } => json!({"content": content, "structured_content": structured_content}),
        other => panic!("not a result that succeeded: {other:?}"),
    }
}

/// One call of `tool` with key `key` on a fresh orders server of `flavour`, within `timeout`:
/// its outcome, and what the server saw.
async fn one_call(
    flavour: Flavour,
    timeout: &str,
    tool: &str,
    args: Value,
    key: &str,
) -> (ToolOutcome, Arc<Seen>) {
    let (seen, server) = Server::seeing(flavour).await;
    let orders = connect(server.addr, timeout).await.unwrap();
    let tool = orders.tool(tool).await.unwrap();
    (call(&tool, args, key).await, seen)
}

/// The plain server's answer to `tool` on order ord_55, with key `key`.
async fn order_call(tool: &str, key: &str) -> ToolOutcome {
    let args = json!({"order_id": "ord_55"});
    one_call(Flavour::Plain, "5s", tool, args, key).await.0
}

/// Asserts `outcome` is unknown, its detail saying `part`.
#[track_caller]
fn assert_unknown_saying(outcome: &ToolOutcome, part: &str) {
    assert!(
        matches!(outcome, ToolOutcome::Unknown { detail } if detail.contains(part)),
        "{outcome:?}"
    );
}

/// The server ran the call with key `key` once, and was sent nothing else.
fn assert_ran_once(seen: &Seen, key: &str) {
    assert_eq!(seen.effects(), BTreeMap::from([(key.to_string(), 1)]));
    assert_eq!(seen.calls.lock().unwrap().len(), 1, "never sent again");
}

#[tokio::test]
async fn listing_gives_every_page_of_specs_and_their_hints() {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
    let orders = connect(server.addr, "5s").await.unwrap();

    let tools = orders.tools().await.unwrap();

    let by_name: BTreeMap<String, (Value, ToolHints, String)> = tools
        .iter()
        .map(|tool| {
            let spec = tool.spec();
            (
                spec.name,
                (spec.input_schema, tool.hints(), spec.description),
            )
        })
        .collect();
    let names: Vec<&str> = by_name.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "archive_order",
            "cancel_order",
            "get_order",
            "issue_refund",
            "stall_refund"
        ]
    );
    let read_only = ToolHints {
        read_only: true,
        ..ToolHints::default()
    };
    let destructive = ToolHints {
        destructive: true,
        ..ToolHints::default()
    };
    assert_eq!(by_name["get_order"].1, read_only);
    assert_eq!(by_name["issue_refund"].1, destructive);
    assert_eq!(by_name["cancel_order"].1, ToolHints::default());
    assert_eq!(by_name["issue_refund"].2, "Refunds part of an order.");
    assert_eq!(
        by_name["issue_refund"].0["properties"]["amount_cents"],
        json!({"type": "integer"})
    );
    assert!(
        seen.calls.lock().unwrap().is_empty(),
        "listing calls nothing"
    );
}

#[tokio::test]
async fn a_named_tool_must_be_listed() {
    let server = Server::start(Arc::new(Seen::default())).await;
    let orders = connect(server.addr, "5s").await.unwrap();

    assert_eq!(
        orders.tool("get_order").await.unwrap().spec().name,
        "get_order"
    );
    let renamed = orders
        .tool("issue_refund")
        .await
        .unwrap()
        .exposed_as("refund");
    assert_eq!(renamed.spec().name, "refund");
    assert_eq!(renamed.remote_name(), "issue_refund");
    assert_eq!(
        orders.tool("delete_everything").await.unwrap_err(),
        McpError::UnknownTool {
            server: "orders".into(),
            tool: "delete_everything".into()
        }
    );
}

#[tokio::test]
async fn a_selection_of_names_gets_those_tools_or_an_error() {
    let server = Server::start(Arc::new(Seen::default())).await;
    let url = format!("http://{}/mcp", server.addr);
    let env = |name: &str| (name == "URL").then(|| url.clone());
    let pick = |tools: &str| {
        binding(&format!(
            "[mcp.orders]\nurl = \"${{URL}}\"\ntools = {tools}\n"
        ))
        .resolve("mcp.orders", &env)
        .unwrap()
    };

    let resolved = pick(r#"["get_order"]"#);
    assert_eq!(
        resolved.tools(),
        Some(&ToolSelection::Named(vec!["get_order".into()]))
    );
    let orders = McpServer::connect(resolved).await.unwrap();
    let names: Vec<String> = orders
        .selected_tools()
        .await
        .unwrap()
        .iter()
        .map(|tool| tool.spec().name)
        .collect();
    assert_eq!(names, ["get_order"]);

    let orders = McpServer::connect(pick(r#"["get_order", "nope"]"#))
        .await
        .unwrap();
    assert!(matches!(
        orders.selected_tools().await,
        Err(McpError::UnknownTool { tool, .. }) if tool == "nope"
    ));
}

#[tokio::test]
async fn a_call_sends_the_exact_arguments_with_the_key_in_meta() {
    let (outcome, seen) =
        one_call(Flavour::Plain, "5s", "issue_refund", refund(), "act-7q2:2").await;

    assert_eq!(
        answered(&outcome)["structured_content"],
        json!({
            "refund_id": "rf-1",
            "order_id": "ord_55",
            "amount_cents": 7500,
            "key": "act-7q2:2",
        })
    );
    assert_eq!(
        *seen.calls.lock().unwrap(),
        [(
            "issue_refund".to_string(),
            Some("act-7q2:2".to_string()),
            refund()
        )]
    );
    assert_eq!(
        seen.effects(),
        BTreeMap::from([("act-7q2:2".to_string(), 1)])
    );
}

#[tokio::test]
async fn a_text_result_is_kept_as_the_block_the_server_sent() {
    let outcome = order_call("get_order", "act-r1:1").await;

    let order = json!({"order_id": "ord_55", "total_cents": 12500, "status": "delivered"});
    assert_eq!(
        answered(&outcome),
        json!({
            "content": [{"type": "text", "text": order.to_string()}],
            "structured_content": null,
        })
    );
}

#[tokio::test]
async fn an_error_result_is_kept_as_the_server_gave_it_with_its_error_flag() {
    let outcome = order_call("cancel_order", "act-c1:1").await;

    assert_eq!(
        outcome,
        ToolOutcome::Mcp {
            content: vec![json!({
                "type": "text",
                "text": "order ord_55 has shipped, so it cannot be cancelled",
            })],
            structured_content: None,
            is_error: true,
        }
    );
}

#[tokio::test]
async fn a_protocol_error_answering_the_call_is_failed() {
    let outcome = order_call("archive_order", "act-a1:1").await;

    assert_eq!(
        outcome,
        ToolOutcome::Failed {
            error: "the MCP server orders refused the call: no such tool".into()
        }
    );
}

#[tokio::test]
async fn a_call_past_the_timeout_is_unknown_and_sent_once() {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
    let orders = connect(server.addr, "1s").await.unwrap();
    let stall_refund = orders.tool("stall_refund").await.unwrap();

    let outcome = call(&stall_refund, refund(), "act-s1:1").await;

    assert_unknown_saying(&outcome, "within 1s");
    assert_ran_once(&seen, "act-s1:1");
}

#[tokio::test]
async fn a_500_after_the_call_ran_is_unknown_and_sent_once() {
    let (outcome, seen) = one_call(
        Flavour::FailsAfterCommit,
        "5s",
        "issue_refund",
        refund(),
        "act-f1:1",
    )
    .await;

    assert_unknown_saying(&outcome, "500");
    assert_ran_once(&seen, "act-f1:1");
}

#[tokio::test]
async fn a_server_gone_mid_call_is_unknown_and_the_next_call_is_not_sent() {
    let (seen, _server, relay, orders) = Relay::before(Flavour::Plain).await;
    let stall_refund = orders.tool("stall_refund").await.unwrap();
    let issue_refund = orders.tool("issue_refund").await.unwrap();

    let pending = tokio::spawn(async move { call(&stall_refund, refund(), "act-g1:1").await });
    seen.committed.notified().await;
    relay.cut();
    let outcome = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the call gives up")
        .unwrap();

    assert!(
        matches!(outcome, ToolOutcome::Unknown { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        seen.effects(),
        BTreeMap::from([("act-g1:1".to_string(), 1)])
    );

    let next = call(&issue_refund, refund(), "act-g2:1").await;
    assert!(
        matches!(&next, ToolOutcome::Failed { error } if error.contains("was not sent")),
        "{next:?}"
    );
    assert_eq!(
        seen.calls.lock().unwrap().len(),
        1,
        "nothing sent after the cut"
    );
    assert!(matches!(
        orders.tools().await,
        Err(McpError::Unreachable { server, .. }) if server == "orders"
    ));
}

#[tokio::test]
async fn a_session_the_restarted_server_forgot_is_renewed_before_the_call_is_sent() {
    let (seen, first, relay, orders) = Relay::before(Flavour::SessionsOnly).await;
    let issue_refund = orders.tool("issue_refund").await.unwrap();
    assert!(matches!(
        call(&issue_refund, refund(), "act-e1:1").await,
        ToolOutcome::Mcp {
            is_error: false,
            ..
        }
    ));

    let second = Server::start_as(seen.clone(), Flavour::SessionsOnly).await;
    relay.restart_on(second.addr);
    drop(first);
    let outcome = call(&issue_refund, refund(), "act-e2:1").await;

    assert!(
        matches!(
            outcome,
            ToolOutcome::Mcp {
                is_error: false,
                ..
            }
        ),
        "{outcome:?}"
    );
    let sessions = seen.sessions.lock().unwrap().clone();
    assert_eq!(sessions.len(), 2, "both calls ran in a session");
    assert_ne!(sessions[0], sessions[1], "the second in a new one");
    assert_eq!(
        seen.effects(),
        BTreeMap::from([("act-e1:1".to_string(), 1), ("act-e2:1".to_string(), 1)])
    );
}

#[tokio::test]
async fn connecting_to_a_closed_port_is_unreachable_without_the_secret() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let env = |name: &str| (name == "ORDERS_MCP_TOKEN").then(|| TOKEN.to_string());
    let resolved = binding(&format!(
        "[mcp.orders]\nurl = \"http://{addr}/mcp?key=${{ORDERS_MCP_TOKEN}}\"\ntimeout = \"2s\"\n"
    ))
    .resolve("mcp.orders", &env)
    .unwrap();

    let error = McpServer::connect(resolved).await.unwrap_err();

    let McpError::Unreachable { server, detail } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(server, "orders");
    assert!(!error.to_string().contains(TOKEN), "{error}");
    assert!(!detail.is_empty());
}

#[tokio::test]
async fn the_header_secret_reaches_the_server_and_nothing_else() {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let issue_refund = orders.tool("issue_refund").await.unwrap();
    let cancel_order = orders.tool("cancel_order").await.unwrap();

    let outcomes = [
        call(&issue_refund, refund(), "act-h1:1").await,
        call(&cancel_order, json!({"order_id": "ord_55"}), "act-h2:1").await,
    ];

    assert_eq!(
        *seen.authorizations.lock().unwrap(),
        [format!("Bearer {TOKEN}"), format!("Bearer {TOKEN}")]
    );
    let shown = format!("{orders:?} {issue_refund:?} {outcomes:?}");
    assert!(!shown.contains(TOKEN), "{shown}");
}
