//! `--mcp-gateway`: the MCP gateway (`/mcp/{agent}` as `countersign serve` routes it, over the
//! embedded store) in front of an upstream MCP server, both on loopback in this process, against
//! calling the same server directly, with one MCP client (rmcp's) for both. Then allowed calls
//! per second through the gateway at two concurrencies, and how long a call that waits on a
//! person takes to answer once the person has decided.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, MetaObject, RequestMetaObject, Tool as Listed, ToolAnnotations,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use shared::adapters::sqlite::SqliteStore;
use shared::agents::{Definition, InMemory, Wiring};
use shared::api::BearerJwt;
use shared::domain::approval::{Choice, DecisionRequest};
use shared::domain::identity::Identity;
use shared::domain::ids::{AgentName, DecisionId, PersonId, Role, TenantId};
use shared::engine::Engine;
use shared::ports::clock::SystemClock;
use shared::ports::store::ItemStore;
use shared::testing::{McpTools, ORDERS_POLICY, object_schema};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::report::Latency;
use crate::{BenchArgs, BenchError, Output};

/// Calls before any is timed, on each path.
const WARM_UP: usize = 20;
/// Gated calls whose decision-to-answer time is taken, decided as soon as they wait.
const DECISIONS: usize = 30;
/// Gated calls decided only after [`LATE`], as a person would: a waiting call reads the store
/// less often the longer it waits.
const LATE_DECISIONS: usize = 10;
const LATE: Duration = Duration::from_millis(1500);

type Client = RunningService<RoleClient, ClientConfig>;

/// The upstream: an MCP server over Streamable HTTP with a read and a refund, and the refunds
/// it made, by order.
fn orders() -> (McpTools, Refunds) {
    let refunds = Refunds::default();
    let made = refunds.clone();
    let listing = vec![
        Listed::new(
            "get_order",
            "Reads an order.",
            object_schema(json!({"order_id": {"type": "string"}})),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        Listed::new(
            "issue_refund",
            "Refunds part of an order.",
            object_schema(
                json!({"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}}),
            ),
        )
        .annotate(ToolAnnotations::new().destructive(true)),
    ];
    let server = McpTools::new(listing, move |request, _| {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let order = args["order_id"].as_str().unwrap_or("?").to_string();
        let answer = match request.name.as_ref() {
            "get_order" => json!({"order_id": order, "refundable_cents": 14_900}),
            _ => {
                let mut refunds = made.lock().expect("refunds lock");
                *refunds.entry(order.clone()).or_default() += 1;
                json!({"refund_id": format!("rf-{order}")})
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(
            answer.to_string(),
        )]))
    });
    (server, refunds)
}

/// The refunds the upstream made, by order.
type Refunds = Arc<Mutex<BTreeMap<String, u32>>>;

/// Serves `router` on a loopback port of its own: its address.
async fn serve(router: axum::Router) -> Result<String, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| BenchError::Setup(format!("cannot listen on loopback: {e}")))?;
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(format!("http://{addr}"))
}

/// An MCP session with `url`, with `token` as its bearer token if given.
async fn client(url: &str, token: Option<&str>) -> Result<Client, BenchError> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(token) = token {
        config = config.auth_header(token.to_string());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("countersign-bench", env!("CARGO_PKG_VERSION")),
    )
    .serve(transport)
    .await
    .map_err(|e| BenchError::Setup(format!("cannot open an MCP session with {url}: {e}")))
}

fn call_params(
    tool: &'static str,
    args: Value,
    wait_seconds: Option<f64>,
) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool);
    params.arguments = args.as_object().cloned();
    if let Some(wait) = wait_seconds {
        let mut meta = MetaObject::new();
        meta.0
            .insert("countersign/wait_seconds".into(), json!(wait));
        params.meta = Some(RequestMetaObject(meta));
    }
    params
}

/// One `tools/call` that must answer without error: its result's text.
async fn call(client: &Client, params: CallToolRequestParams) -> Result<String, BenchError> {
    let result = client
        .call_tool(params)
        .await
        .map_err(|e| BenchError::Run(format!("tools/call failed: {e}")))?;
    let text: String = result
        .content
        .iter()
        .filter_map(ContentBlock::as_text)
        .map(|block| block.text.as_str())
        .collect();
    if result.is_error == Some(true) {
        return Err(BenchError::Run(format!(
            "tools/call answered an error: {text}"
        )));
    }
    Ok(text)
}

/// A read of an order no call has read before (an identical call would attach to the first).
fn read(n: usize) -> CallToolRequestParams {
    call_params("get_order", json!({"order_id": format!("ord_{n}")}), None)
}

/// `calls` reads through `client`, one after the other, numbered from `first`: each one's time.
async fn timed_reads(
    client: &Client,
    first: usize,
    calls: usize,
) -> Result<Vec<Duration>, BenchError> {
    let mut samples = Vec::with_capacity(calls);
    for n in first..first + calls {
        let began = Instant::now();
        call(client, read(n)).await?;
        samples.push(began.elapsed());
    }
    Ok(samples)
}

/// Allowed calls per second through the gateway, `workers` clients at once, `calls` in all.
async fn throughput(
    gateway: &str,
    token: &str,
    workers: usize,
    calls: usize,
    first: usize,
) -> Result<f64, BenchError> {
    let mut clients = Vec::with_capacity(workers);
    for _ in 0..workers {
        clients.push(client(gateway, Some(token)).await?);
    }
    let next = Arc::new(AtomicUsize::new(first));
    let began = Instant::now();
    let mut running = JoinSet::new();
    for client in clients {
        let next = next.clone();
        running.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= first + calls {
                    return Ok::<_, BenchError>(());
                }
                call(&client, read(n)).await?;
            }
        });
    }
    while let Some(done) = running.join_next().await {
        done.map_err(|e| BenchError::Run(e.to_string()))??;
    }
    Ok(calls as f64 / began.elapsed().as_secs_f64())
}

/// `count` gated refunds, numbered from `first`, each waiting through the gateway while a
/// finance approver approves it `after` it opened: the time from the start of the decision to
/// the waiting call's answer, and the decision's own.
async fn decision_to_answer(
    engine: &Engine,
    gateway: &str,
    token: &str,
    approver: &Identity,
    (first, count): (usize, usize),
    after: Duration,
) -> Result<(Vec<Duration>, Vec<Duration>), BenchError> {
    let mut answered = Vec::with_capacity(count);
    let mut decided = Vec::with_capacity(count);
    for n in first..first + count {
        let client = client(gateway, Some(token)).await?;
        let refund = call_params(
            "issue_refund",
            json!({"order_id": format!("ord_r{n}"), "amount_cents": 12_500}),
            Some(30.0),
        );
        let waiting = tokio::spawn(async move {
            let text = call(&client, refund).await;
            (text, Instant::now())
        });
        let approval = loop {
            let pending = engine
                .pending(&approver.tenant)
                .await
                .map_err(|e| BenchError::Run(format!("pending approvals: {e}")))?;
            if let Some(approval) = pending.into_iter().next() {
                break approval;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        tokio::time::sleep(after).await;
        let request = DecisionRequest {
            decision_id: DecisionId::parse(&format!("bench-gate-{n}")).expect("a decision id"),
            action_version: approval.action_version,
            choice: Choice::Approve,
        };
        let began = Instant::now();
        engine
            .decide(approver, &approval.id, request)
            .await
            .map_err(|e| BenchError::Run(format!("approve {}: {e}", approval.id)))?;
        decided.push(began.elapsed());
        let (text, at) = waiting.await.map_err(|e| BenchError::Run(e.to_string()))?;
        let text = text?;
        if !text.contains("rf-ord_r") {
            return Err(BenchError::Run(format!(
                "the waiting call did not answer the refund: {text}"
            )));
        }
        answered.push(at.duration_since(began));
    }
    Ok((answered, decided))
}

pub async fn run(args: &BenchArgs) -> Result<Output, BenchError> {
    let calls = args.runs;
    let (orders, refunds) = orders();
    let (upstream, _serving) = orders
        .serve()
        .await
        .map_err(|e| BenchError::Setup(format!("the upstream MCP server: {e}")))?;
    let upstream_url = format!("http://{upstream}/mcp");

    let dir = shared::testing::scratch_dir("bench-gateway");
    let store: Arc<dyn ItemStore> = Arc::new(
        SqliteStore::open_dir(&dir).map_err(|e| BenchError::Setup(format!("the store: {e}")))?,
    );
    let agent_toml = format!(
        "name = \"orders\"\nsystem_prompt = \"You look orders up and refund them.\"\n\n\
         [mcp.orders]\nurl = \"{upstream_url}\"\ntools = \"*\"\n"
    );
    let definition = Definition::load(&InMemory {
        dir: "bench",
        files: &[("agent.toml", &agent_toml), ("policy.toml", ORDERS_POLICY)],
    })
    .map_err(|e| BenchError::Setup(e.to_string()))?;
    let agent = Wiring::new(
        store.clone(),
        Arc::new(SystemClock),
        shared::example::expense::default_claims(),
    )
    .build(&definition)
    .map_err(|e| BenchError::Setup(e.to_string()))?;
    let engine = Arc::new(
        Engine::builder(store)
            .agents([agent])
            .clock(Arc::new(SystemClock))
            .build(),
    );
    let name = AgentName::parse("orders").expect("a well-formed name");
    let tenant = TenantId::parse("acme").expect("a tenant");
    shared::agents::prepare(&engine, &tenant, &name)
        .await
        .map_err(|e| BenchError::Setup(e.to_string()))?;

    let key = rand::random::<[u8; 32]>();
    let auth = BearerJwt::hs256(&key).map_err(|e| BenchError::Setup(e.to_string()))?;
    let person = |name: &str, roles: &[&str]| Identity {
        tenant: tenant.clone(),
        person: PersonId::parse(name).expect("a person"),
        roles: roles
            .iter()
            .map(|r| Role::parse(r).expect("a role"))
            .collect::<BTreeSet<_>>(),
        claims: Default::default(),
    };
    let caller = person("sam", &["employee"]);
    let approver = person("dana", &["employee", "finance"]);
    let token = auth
        .issue(&caller, chrono::Utc::now(), Duration::from_secs(3600))
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let gateway = serve(shared::api::mcp::routes(
        engine.clone(),
        Arc::new(auth),
        shared::api::mcp::Settings::default(),
    ))
    .await?;
    let gateway_url = format!("{gateway}/mcp/orders");

    let direct_client = client(&upstream_url, None).await?;
    let gateway_client = client(&gateway_url, Some(&token)).await?;
    timed_reads(&direct_client, 0, WARM_UP).await?;
    timed_reads(&gateway_client, 0, WARM_UP).await?;
    // Alternating blocks, so both paths see the same machine.
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    let block = 50.min(calls);
    let mut n = WARM_UP;
    while direct.len() < calls {
        let size = block.min(calls - direct.len());
        direct.extend(timed_reads(&direct_client, n, size).await?);
        through.extend(timed_reads(&gateway_client, n, size).await?);
        n += size;
    }
    let per_second_1 = throughput(&gateway_url, &token, 1, calls, n).await?;
    let per_second_8 = throughput(&gateway_url, &token, 8, calls, n + calls).await?;
    let (answered, decided) = decision_to_answer(
        &engine,
        &gateway_url,
        &token,
        &approver,
        (0, DECISIONS),
        Duration::ZERO,
    )
    .await?;
    let (answered_late, _) = decision_to_answer(
        &engine,
        &gateway_url,
        &token,
        &approver,
        (DECISIONS, LATE_DECISIONS),
        LATE,
    )
    .await?;
    std::fs::remove_dir_all(&dir).ok();
    let refunds = refunds.lock().expect("refunds lock").clone();
    let approved = DECISIONS + LATE_DECISIONS;
    if refunds.len() != approved || refunds.values().any(|&made| made != 1) {
        return Err(BenchError::Ledger(format!(
            "the upstream should have made each of {approved} approved refunds once: {refunds:?}"
        )));
    }

    let direct = Latency::of(&direct).expect("samples");
    let through = Latency::of(&through).expect("samples");
    let answered = Latency::of(&answered).expect("samples");
    let answered_late = Latency::of(&answered_late).expect("samples");
    let decided = Latency::of(&decided).expect("samples");
    let json = json!({
        "bench": "mcp_gateway",
        "store": "embedded",
        "calls": calls,
        "direct": direct,
        "through_gateway": through,
        "added_p50_ms": through.p50_ms - direct.p50_ms,
        "allowed_calls_per_second": {"concurrency_1": per_second_1, "concurrency_8": per_second_8},
        "decision_to_answer": answered,
        "decision_to_answer_after_1500_ms": answered_late,
        "decision": decided,
        "refunds_once": true,
    });
    let text = format!(
        "countersign-bench --mcp-gateway: {calls} allowed calls each way on the embedded store, an upstream MCP server on loopback\n\
         \x20 direct     {}\n\
         \x20 gateway    {}\n\
         \x20            the gateway adds {:.2} ms at p50 (schema, policy, one run and action written, the upstream called, the outcome written)\n\
         \x20 throughput {per_second_1:.1} allowed calls/s through the gateway at concurrency 1, {per_second_8:.1} at concurrency 8\n\
         \x20 answer     {}   ({DECISIONS} gated calls decided as soon as they waited: from the start of the decision to the waiting call's answer)\n\
         \x20 answer     {}   ({LATE_DECISIONS} decided after {} ms of waiting)\n\
         \x20 decision   {}   (the decision itself, which runs the approved call in this process)\n\
         \x20 upstream   each of the {approved} approved refunds made once\n",
        direct.line(),
        through.line(),
        through.p50_ms - direct.p50_ms,
        answered.line(),
        answered_late.line(),
        LATE.as_millis(),
        decided.line(),
    );
    Ok(Output { text, json })
}
