//! MCP tools against a real MCP server (rmcp's server side) over Streamable HTTP on loopback:
//! listing, hints, the key in `_meta`, error results, and the outcomes of a call whose answer
//! never comes back.

mod harness;

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
use shared::agents::{Definition, DefinitionError, Files, Wiring};
use shared::domain::action::ActionStatus;
use shared::domain::action::ToolOutcome;
use shared::domain::args::Args;
use shared::domain::ids::{AgentName, PersonId, RunId, TenantId};
use shared::domain::policy::{Policy, ToolHints};
use shared::domain::run::RunStatus;
use shared::engine::{Agent, Delivery, ErrorKind, ResumeReport, StartRun};
use shared::ports::tools::{Tool, ToolCall, Toolbox};
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

fn schema(properties: Value) -> Arc<serde_json::Map<String, Value>> {
    let schema = json!({"type": "object", "properties": properties});
    Arc::new(schema.as_object().unwrap().clone())
}

fn listing() -> Vec<McpListing> {
    let amount = json!({"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}});
    vec![
        McpListing::new(
            "get_order",
            "Reads an order.",
            schema(json!({"order_id": {"type": "string"}})),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        McpListing::new(
            "issue_refund",
            "Refunds part of an order.",
            schema(amount.clone()),
        )
        .annotate(ToolAnnotations::new().destructive(true)),
        McpListing::new(
            "cancel_order",
            "Cancels an order.",
            schema(json!({"order_id": {"type": "string"}})),
        ),
        // Listed, but the server no longer serves it: calls get a JSON-RPC error.
        McpListing::new(
            "archive_order",
            "Archives an order.",
            schema(json!({"order_id": {"type": "string"}})),
        ),
        McpListing::new(
            "stall_refund",
            "Refunds, then never answers.",
            schema(amount),
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
}

impl Server {
    async fn start(seen: Arc<Seen>) -> Self {
        Self::start_as(seen, Flavour::Plain).await
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
        if flavour == Flavour::FailsAfterCommit {
            router = router.layer(axum::middleware::from_fn(fail_after_commit));
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

/// Lets an `issue_refund` call run to its end (its whole answer read), then answers 500 instead.
async fn fail_after_commit(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let mentions = |text: &[u8]| body.windows(text.len()).any(|w| w == text);
    let is_refund = mentions(b"tools/call") && mentions(b"issue_refund");
    let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(body));
    let response = next.run(request).await;
    if !is_refund {
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

#[tokio::test]
async fn listing_gives_every_page_of_specs_and_their_hints() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
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
        destructive: false,
    };
    let destructive = ToolHints {
        read_only: false,
        destructive: true,
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
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let issue_refund = orders.tool("issue_refund").await.unwrap();

    let outcome = call(&issue_refund, refund(), "act-7q2:2").await;

    assert_eq!(
        outcome,
        ToolOutcome::Succeeded {
            result: json!({
                "refund_id": "rf-1",
                "order_id": "ord_55",
                "amount_cents": 7500,
                "key": "act-7q2:2",
            })
        }
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
async fn a_text_result_is_read_as_json_when_it_is_json() {
    let server = Server::start(Arc::new(Seen::default())).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let get_order = orders.tool("get_order").await.unwrap();

    let outcome = call(&get_order, json!({"order_id": "ord_55"}), "act-r1:1").await;

    assert_eq!(
        outcome,
        ToolOutcome::Succeeded {
            result: json!({"order_id": "ord_55", "total_cents": 12500, "status": "delivered"})
        }
    );
}

#[tokio::test]
async fn an_error_result_is_failed_with_its_text() {
    let server = Server::start(Arc::new(Seen::default())).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let cancel_order = orders.tool("cancel_order").await.unwrap();

    let outcome = call(&cancel_order, json!({"order_id": "ord_55"}), "act-c1:1").await;

    assert_eq!(
        outcome,
        ToolOutcome::Failed {
            error: "order ord_55 has shipped, so it cannot be cancelled".into()
        }
    );
}

#[tokio::test]
async fn a_protocol_error_answering_the_call_is_failed() {
    let server = Server::start(Arc::new(Seen::default())).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let archive_order = orders.tool("archive_order").await.unwrap();

    let outcome = call(&archive_order, json!({"order_id": "ord_55"}), "act-a1:1").await;

    assert_eq!(
        outcome,
        ToolOutcome::Failed {
            error: "the MCP server orders refused the call: no such tool".into()
        }
    );
}

#[tokio::test]
async fn a_call_past_the_timeout_is_unknown_and_sent_once() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let orders = connect(server.addr, "1s").await.unwrap();
    let stall_refund = orders.tool("stall_refund").await.unwrap();

    let outcome = call(&stall_refund, refund(), "act-s1:1").await;

    assert!(
        matches!(&outcome, ToolOutcome::Unknown { detail } if detail.contains("within 1s")),
        "{outcome:?}"
    );
    assert_eq!(
        seen.effects(),
        BTreeMap::from([("act-s1:1".to_string(), 1)])
    );
    assert_eq!(seen.calls.lock().unwrap().len(), 1, "never sent again");
}

#[tokio::test]
async fn a_500_after_the_call_ran_is_unknown_and_sent_once() {
    let seen = Arc::new(Seen::default());
    let server = Server::start_as(seen.clone(), Flavour::FailsAfterCommit).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let issue_refund = orders.tool("issue_refund").await.unwrap();

    let outcome = call(&issue_refund, refund(), "act-f1:1").await;

    assert!(
        matches!(&outcome, ToolOutcome::Unknown { detail } if detail.contains("500")),
        "{outcome:?}"
    );
    assert_eq!(
        seen.effects(),
        BTreeMap::from([("act-f1:1".to_string(), 1)])
    );
    assert_eq!(seen.calls.lock().unwrap().len(), 1, "never sent again");
}

#[tokio::test]
async fn a_server_gone_mid_call_is_unknown_and_the_next_call_is_not_sent() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let relay = Relay::start(server.addr).await;
    let orders = connect(relay.addr, "5s").await.unwrap();
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
    let seen = Arc::new(Seen::default());
    let first = Server::start_as(seen.clone(), Flavour::SessionsOnly).await;
    let relay = Relay::start(first.addr).await;
    let orders = connect(relay.addr, "5s").await.unwrap();
    let issue_refund = orders.tool("issue_refund").await.unwrap();
    assert!(matches!(
        call(&issue_refund, refund(), "act-e1:1").await,
        ToolOutcome::Succeeded { .. }
    ));

    let second = Server::start_as(seen.clone(), Flavour::SessionsOnly).await;
    relay.restart_on(second.addr);
    drop(first);
    let outcome = call(&issue_refund, refund(), "act-e2:1").await;

    assert!(
        matches!(outcome, ToolOutcome::Succeeded { .. }),
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
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
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

const REFUND_POLICY: &str = r#"
name = "refunds"
version = 1
default_ttl = "24h"

[tools.get_order]
decision = "allow"

[tools.issue_refund]
decision = "approve"
approver_role = "finance"
quorum = 1
reason = "Every refund needs a finance approver."
"#;

/// A process running a refunds agent whose script reads the order and then refunds it, over
/// the orders MCP server, under [`REFUND_POLICY`].
async fn refunds_process(h: &harness::Harness, orders: &McpServer) -> harness::Process {
    let tools = Toolbox::new()
        .with(Arc::new(orders.tool("get_order").await.unwrap()))
        .with(Arc::new(orders.tool("issue_refund").await.unwrap()));
    let policy = Arc::new(Policy::from_toml(REFUND_POLICY).unwrap());
    let script = harness::Script::default().then_call(&[
        ("get_order", json!({"order_id": "ord_55"})),
        ("issue_refund", refund()),
    ]);
    let refunds = Agent::new(refunds_agent(), policy)
        .with_model(Arc::new(script.clone()))
        .with_tools(tools);
    h.process_configured(
        Arc::new(script),
        |store| store,
        |engine| engine.agent(refunds),
    )
    .await
}

fn refunds_agent() -> AgentName {
    AgentName::parse("refunds").unwrap()
}

fn refund_task() -> StartRun {
    StartRun {
        tenant: harness::acme(),
        agent: refunds_agent(),
        requested_by: PersonId::parse("ben").unwrap(),
        started_by: None,
        task: "Refund USD 75 for order ord_55.".into(),
        approval_ttl: None,
    }
}

#[tokio::test]
async fn the_engine_gates_a_destructive_mcp_tool_until_a_person_approves_then_runs_it_once() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let p = refunds_process(&h, &orders).await;

    let report = p.start(refund_task()).await.unwrap();

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let [approval] = report.approvals.as_slice() else {
        panic!("one approval: {report:?}");
    };
    assert_eq!(approval.tool, "issue_refund");
    let called: Vec<String> = seen
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.0.clone())
        .collect();
    assert_eq!(called, ["get_order"], "the read ran, the refund waits");
    assert!(seen.effects().is_empty());

    p.decide(&h.person("dana"), &approval.id, harness::approve("d-1"))
        .await
        .unwrap();

    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
    let key = format!("{}:1", approval.action_id);
    assert_eq!(seen.effects(), BTreeMap::from([(key.clone(), 1)]));
    let called: Vec<(String, Option<String>)> = seen
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| (c.0.clone(), c.1.clone()))
        .collect();
    assert_eq!(called[1], ("issue_refund".to_string(), Some(key)));
    assert_eq!(called.len(), 2);
}

#[tokio::test]
async fn the_engine_never_sends_an_mcp_call_again_after_an_unknown_outcome() {
    let seen = Arc::new(Seen::default());
    let server = Server::start_as(seen.clone(), Flavour::FailsAfterCommit).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let p = refunds_process(&h, &orders).await;
    let report = p.start(refund_task()).await.unwrap();
    let approval = report.approvals[0].clone();

    p.decide(&h.person("dana"), &approval.id, harness::approve("d-1"))
        .await
        .unwrap();

    let history = p.history(&harness::acme(), &report.run_id).await.unwrap();
    let refund_action = history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id)
        .unwrap();
    assert_eq!(refund_action.status, ActionStatus::Unknown);
    let key = format!("{}:1", approval.action_id);
    assert_eq!(seen.effects(), BTreeMap::from([(key.clone(), 1)]));

    // The resume message again, then a sweep: an MCP tool cannot reconcile, so neither resends.
    let again = p.resume(&harness::resume_message(&approval)).await.unwrap();
    assert!(matches!(again, ResumeReport::Ignored { .. }), "{again:?}");
    let swept = p.sweep(100).await.unwrap();
    assert!(swept.reconciled.is_empty(), "{swept:?}");
    assert_eq!(swept.unknown, std::slice::from_ref(&key));
    assert_eq!(seen.effects(), BTreeMap::from([(key, 1)]));
    let refunds = seen
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.0 == "issue_refund")
        .count();
    assert_eq!(refunds, 1);
}

// An agent defined by files alone: its MCP server and tools in agent.toml, its policy matching
// the tools' annotations.

/// A definition's files, in memory.
struct Texts(Vec<(&'static str, String)>);

impl Files for Texts {
    fn label(&self, file: &str) -> String {
        format!("agents/orders/{file}")
    }

    fn read(&self, file: &str) -> Result<String, DefinitionError> {
        self.0
            .iter()
            .find(|(name, _)| *name == file)
            .map(|(_, text)| text.clone())
            .ok_or_else(|| DefinitionError {
                file: self.label(file),
                field: String::new(),
                message: "no such file".into(),
            })
    }
}

const ORDERS_AGENT: &str = r#"
name = "orders"
system_prompt = "You look orders up and refund them."

[mcp.orders]
url = "${ORDERS_MCP_URL}"
headers = { Authorization = "Bearer ${ORDERS_MCP_TOKEN}" }
timeout = "5s"
tools = "*"
"#;

/// No tool by name: reads run, destructive calls wait for finance, the rest stay denied.
const BY_HINTS: &str = r#"
name = "orders"
version = 3
default_ttl = "24h"

[hints.read_only]
decision = "allow"

[hints.destructive]
decision = "approve"
approver_role = "finance"
quorum = 1
reason = "The orders server says this tool changes things."
"#;

fn orders_definition(agent: &str, policy: &str) -> Result<Definition, DefinitionError> {
    Definition::load(&Texts(vec![
        ("agent.toml", agent.to_string()),
        ("policy.toml", policy.to_string()),
    ]))
}

fn orders_name() -> AgentName {
    AgentName::parse("orders").unwrap()
}

/// The environment of a process whose orders server listens at `addr`.
fn env_for(addr: SocketAddr) -> impl Fn(&str) -> Option<String> {
    let url = format!("http://{addr}/mcp");
    move |name: &str| match name {
        "ORDERS_MCP_URL" => Some(url.clone()),
        "ORDERS_MCP_TOKEN" => Some(TOKEN.to_string()),
        _ => None,
    }
}

/// Builds `definition` with `env` into a new process of `h`, played by `script`.
async fn defined_process(
    h: &harness::Harness,
    definition: &Definition,
    env: &dyn Fn(&str) -> Option<String>,
    script: harness::Script,
) -> Result<harness::Process, DefinitionError> {
    defined_process_delivering(h, definition, env, script, Delivery::InProcess).await
}

/// [`defined_process`], its resume messages delivered as told.
async fn defined_process_delivering(
    h: &harness::Harness,
    definition: &Definition,
    env: &dyn Fn(&str) -> Option<String>,
    script: harness::Script,
    delivery: Delivery,
) -> Result<harness::Process, DefinitionError> {
    let store = Arc::new(Mutex::new(None));
    let built = Arc::new(Mutex::new(None));
    let p = h
        .process_configured(
            Arc::new(script.clone()),
            |connection| {
                *store.lock().unwrap() = Some(connection.clone());
                connection
            },
            |engine| {
                let wiring = Wiring {
                    env,
                    ..Wiring::new(
                        store.lock().unwrap().clone().unwrap(),
                        h.clock.clone(),
                        h.claims.clone(),
                    )
                };
                match definition.build(&wiring) {
                    Ok(agent) => engine
                        .agent(agent.with_model(Arc::new(script)))
                        .delivery(delivery),
                    Err(error) => {
                        *built.lock().unwrap() = Some(error);
                        engine
                    }
                }
            },
        )
        .await;
    match built.lock().unwrap().take() {
        Some(error) => Err(error),
        None => Ok(p),
    }
}

fn orders_task() -> StartRun {
    StartRun {
        agent: orders_name(),
        ..refund_task()
    }
}

#[tokio::test]
async fn a_defined_agent_runs_a_read_only_tool_at_once_and_a_destructive_one_after_approval() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let script = harness::Script::default().then_call(&[
        ("get_order", json!({"order_id": "ord_55"})),
        ("issue_refund", refund()),
    ]);
    let p = defined_process(&h, &definition, &env_for(server.addr), script)
        .await
        .unwrap();

    shared::agents::prepare(&p, &orders_name()).await.unwrap();
    let report = p.start(orders_task()).await.unwrap();

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let [approval] = report.approvals.as_slice() else {
        panic!("one approval: {report:?}");
    };
    assert_eq!(approval.tool, "issue_refund");
    assert_eq!(
        approval.reason,
        "The orders server says this tool changes things."
    );
    let called: Vec<String> = seen
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.0.clone())
        .collect();
    assert_eq!(
        called,
        ["get_order"],
        "the read ran at once, the refund waits"
    );
    assert!(seen.effects().is_empty());

    p.decide(&h.person("dana"), &approval.id, harness::approve("d-1"))
        .await
        .unwrap();

    assert_eq!(h.run(&p, &report.run_id).await.status, RunStatus::Done);
    let key = format!("{}:1", approval.action_id);
    assert_eq!(seen.effects(), BTreeMap::from([(key.clone(), 1)]));
    let calls = seen.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1], ("issue_refund".to_string(), Some(key), refund()));
    assert_eq!(
        *seen.authorizations.lock().unwrap(),
        [format!("Bearer {TOKEN}"), format!("Bearer {TOKEN}")]
    );
}

#[tokio::test]
async fn a_tool_the_definition_binds_by_name_takes_its_hints_from_the_listing() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let agent = r#"
name = "orders"
system_prompt = "You refund orders."

[mcp.orders]
url = "${ORDERS_MCP_URL}"

[tools.refund]
description = "Refund part of an order, in cents."
mcp = { server = "orders", tool = "issue_refund" }
"#;
    let definition = orders_definition(agent, BY_HINTS).unwrap();
    let script = harness::Script::default().then_call(&[("refund", refund())]);
    let p = defined_process(&h, &definition, &env_for(server.addr), script)
        .await
        .unwrap();

    shared::agents::prepare(&p, &orders_name()).await.unwrap();
    let tools = &p.agent(&orders_name()).unwrap().tools;
    let specs: Vec<String> = tools.specs().into_iter().map(|s| s.name).collect();
    assert_eq!(specs, ["refund"], "only the bound tool, under its own name");
    let refund_tool = tools.get("refund").unwrap();
    assert_eq!(
        refund_tool.spec().description,
        "Refund part of an order, in cents."
    );
    assert_eq!(
        refund_tool.spec().input_schema["properties"]["amount_cents"],
        json!({"type": "integer"})
    );
    let report = p.start(orders_task()).await.unwrap();
    let [approval] = report.approvals.as_slice() else {
        panic!("the destructive refund waits: {report:?}");
    };

    p.decide(&h.person("dana"), &approval.id, harness::approve("d-1"))
        .await
        .unwrap();

    let key = format!("{}:1", approval.action_id);
    assert_eq!(seen.effects(), BTreeMap::from([(key, 1)]));
}

#[tokio::test]
async fn another_process_lists_the_tools_before_it_resumes_and_runs_the_approved_call_once() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let env = env_for(server.addr);
    let script = harness::Script::default().then_call(&[
        ("get_order", json!({"order_id": "ord_55"})),
        ("issue_refund", refund()),
    ]);
    let queue = Arc::new(harness::RecordingQueue::default());
    let starter = defined_process_delivering(
        &h,
        &definition,
        &env,
        script.clone(),
        Delivery::Queue(queue.clone()),
    )
    .await
    .unwrap();
    shared::agents::prepare(&starter, &orders_name())
        .await
        .unwrap();
    let report = starter.start(orders_task()).await.unwrap();
    let approval = report.approvals[0].clone();
    starter
        .decide(&h.person("dana"), &approval.id, harness::approve("d-1"))
        .await
        .unwrap();
    let message = queue
        .published()
        .pop()
        .expect("the decision queued a resume");

    let resumer = defined_process(&h, &definition, &env, script)
        .await
        .unwrap();
    let tools = &resumer.agent(&orders_name()).unwrap().tools;
    assert!(
        tools.get("issue_refund").is_none(),
        "nothing listed yet here"
    );
    shared::agents::prepare_resume(&resumer, &message)
        .await
        .unwrap();
    let resumed = resumer.resume(&message).await.unwrap();

    assert!(
        matches!(resumed, ResumeReport::Continued { .. }),
        "{resumed:?}"
    );
    assert_eq!(
        h.run(&resumer, &report.run_id).await.status,
        RunStatus::Done
    );
    let key = format!("{}:1", approval.action_id);
    assert_eq!(seen.effects(), BTreeMap::from([(key, 1)]));
}

#[tokio::test]
async fn a_run_whose_mcp_server_is_down_is_refused_before_anything_is_written() {
    let seen = Arc::new(Seen::default());
    let server = Server::start(seen.clone()).await;
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = closed.local_addr().unwrap();
    drop(closed);
    // The server is unreachable through the relay until it is pointed at the server.
    let relay = Relay::start(nowhere).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let script =
        harness::Script::default().then_call(&[("get_order", json!({"order_id": "ord_55"}))]);
    let p = defined_process(&h, &definition, &env_for(relay.addr), script)
        .await
        .expect("building never reaches the server");

    let refused = shared::agents::prepare(&p, &orders_name())
        .await
        .unwrap_err();

    assert_eq!(refused.kind(), ErrorKind::Unavailable);
    let said = refused.to_string();
    assert!(
        said.contains("agents/orders/agent.toml")
            && said.contains("mcp.orders")
            && said.contains("unreachable"),
        "{said}"
    );
    assert!(!said.contains(TOKEN), "{said}");
    assert!(p.pending(&harness::acme()).await.unwrap().is_empty());
    assert!(seen.calls.lock().unwrap().is_empty());

    relay.restart_on(server.addr);
    shared::agents::prepare(&p, &orders_name()).await.unwrap();
    let report = p.start(orders_task()).await.unwrap();
    assert_eq!(
        report.status,
        RunStatus::Done,
        "the next start lists and runs"
    );
}

/// Every request comes from one person.
struct SignedIn(shared::domain::identity::Identity);

impl shared::api::Authenticate for SignedIn {
    fn identify(
        &self,
        _: &axum::http::request::Parts,
    ) -> Result<shared::domain::identity::Identity, shared::api::AuthError> {
        Ok(self.0.clone())
    }
}

#[tokio::test]
async fn post_runs_for_an_agent_whose_mcp_server_is_down_is_503_unavailable() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = closed.local_addr().unwrap();
    drop(closed);
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let p = defined_process(
        &h,
        &definition,
        &env_for(nowhere),
        harness::Script::default(),
    )
    .await
    .unwrap();
    let harness::Process { engine, .. } = p;
    let engine = Arc::new(engine);
    let router = shared::api::start_routes(
        engine.clone(),
        Arc::new(SignedIn(h.person("ben"))),
        h.claims.clone(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    let response = reqwest::Client::new()
        .post(format!("http://{api}/runs"))
        .json(&json!({"agent": "orders", "task": "Refund USD 75 for order ord_55."}))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the orders agent cannot reach its tools now; nothing was started"),
        "{body}"
    );
    assert!(engine.pending(&harness::acme()).await.unwrap().is_empty());
    serving.abort();
}

/// Each bad definition, and where its error points.
#[tokio::test]
async fn a_bad_mcp_definition_names_its_file_and_field() {
    let server = Server::start(Arc::new(Seen::default())).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let env = env_for(server.addr);
    let script = harness::Script::default();

    let unknown_server = orders_definition(
        &format!("{ORDERS_AGENT}\n[tools.refund]\nmcp = {{ server = \"billing\", tool = \"issue_refund\" }}\n"),
        BY_HINTS,
    )
    .unwrap_err();
    assert_eq!(
        (unknown_server.file.as_str(), unknown_server.field.as_str()),
        ("agents/orders/agent.toml", "tools.refund.mcp.server")
    );

    let built = |agent: String| {
        let definition = orders_definition(&agent, BY_HINTS).unwrap();
        let script = script.clone();
        let h = &h;
        let env = &env;
        async move {
            defined_process(h, &definition, env, script)
                .await
                .err()
                .unwrap()
        }
    };
    let bad_url = built(ORDERS_AGENT.replace("${ORDERS_MCP_URL}", "ftp://orders/mcp")).await;
    assert_eq!(
        (bad_url.file.as_str(), bad_url.field.as_str()),
        ("agents/orders/agent.toml", "mcp.orders.url")
    );
    let unset = built(ORDERS_AGENT.replace("ORDERS_MCP_TOKEN", "ORDERS_MCP_SECRET")).await;
    assert_eq!(
        (unset.file.as_str(), unset.field.as_str()),
        (
            "agents/orders/agent.toml",
            "mcp.orders.headers.Authorization"
        )
    );
    assert!(
        unset.message.contains("ORDERS_MCP_SECRET is not set"),
        "{unset}"
    );

    // The listing brings a get_order, which the definition already names.
    let collision = format!(
        "{ORDERS_AGENT}\n[tools.get_order]\ndescription = \"Reads an order.\"\ninput_schema = {{ type = \"object\" }}\nhttp = {{ method = \"GET\", url = \"http://127.0.0.1:1/orders\" }}\n"
    );
    let definition = orders_definition(&collision, BY_HINTS).unwrap();
    let p = defined_process(&h, &definition, &env, script.clone())
        .await
        .unwrap();
    let said = shared::agents::prepare(&p, &orders_name())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        said.contains("agents/orders/agent.toml: mcp.orders.tools: mcp.orders lists get_order, which is also the name of tools.get_order"),
        "{said}"
    );

    // A rule for a tool neither defined nor listed shows once the server has listed its tools.
    let policy = format!("{BY_HINTS}\n[tools.refund_everything]\ndecision = \"allow\"\n");
    let definition = orders_definition(ORDERS_AGENT, &policy).unwrap();
    let p = defined_process(&h, &definition, &env, script.clone())
        .await
        .unwrap();
    let said = shared::agents::prepare(&p, &orders_name())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        said.starts_with("agents/orders/policy.toml: tools.refund_everything: the policy has a rule for refund_everything"),
        "{said}"
    );

    // So is an offline script's call of a tool that nothing provides.
    let agent =
        format!("{ORDERS_AGENT}\n[model]\nprovider = \"scripted\"\noffline = \"script.toml\"\n");
    let script_file =
        "[[turns]]\nsay = \"Wiping.\"\ncalls = [{ tool = \"wipe_orders\", args = {} }]\n";
    let definition = Definition::load(&Texts(vec![
        ("agent.toml", agent),
        ("policy.toml", BY_HINTS.to_string()),
        ("script.toml", script_file.to_string()),
    ]))
    .unwrap();
    let p = defined_process(&h, &definition, &env, script.clone())
        .await
        .unwrap();
    let said = shared::agents::prepare(&p, &orders_name())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        said.starts_with("agents/orders/agent.toml: model.offline: the script calls wipe_orders"),
        "{said}"
    );
}
