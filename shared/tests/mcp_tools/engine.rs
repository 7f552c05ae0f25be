//! The engine over MCP tools: a destructive call gated until a person approves and then run
//! once, never sent again after an unknown outcome; agents defined by files alone.

use super::*;
use shared::domain::approval::Approval;
use shared::domain::run::GateVia;
use shared::engine::{CallStatus, GateCall, RunReport};

const REFUND_POLICY: &str = include_str!("../fixtures/refund-policy.toml");

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

/// Dana, of finance, approves version 1 of `approval`.
async fn dana_approves(h: &harness::Harness, p: &harness::Process, approval: &Approval) {
    p.decide(&h.person("dana"), &approval.id, harness::approve("d-1"))
        .await
        .unwrap();
}

/// The one approval `report` waits on: the refund, after the read ran at once and before
/// anything took effect.
#[track_caller]
fn waiting_refund(report: &RunReport, seen: &Seen) -> Approval {
    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let [approval] = report.approvals.as_slice() else {
        panic!("one approval: {report:?}");
    };
    assert_eq!(approval.tool, "issue_refund");
    assert_eq!(
        seen.tools_called(),
        ["get_order"],
        "the read ran at once, the refund waits"
    );
    assert!(seen.effects().is_empty());
    approval.clone()
}

/// Dana approves the refund: the run finishes, the refund acts once and was sent with its
/// key, after the read. Every call the server saw.
async fn approve_and_finish(
    h: &harness::Harness,
    p: &harness::Process,
    seen: &Seen,
    report: &RunReport,
    approval: &Approval,
) -> Vec<(String, Option<String>, Value)> {
    dana_approves(h, p, approval).await;
    assert_eq!(h.run(p, &report.run_id).await.status, RunStatus::Done);
    assert_effect_once(seen, approval);
    let key = format!("{}:1", approval.action_id);
    let calls = seen.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[1].0.as_str(), calls[1].1.as_deref()),
        ("issue_refund", Some(key.as_str()))
    );
    calls
}

/// An MCP orders server of `flavour` and its record of what it saw; and on a fresh harness, a
/// process of the refunds agent whose tools come from that server.
async fn refunds_over(flavour: Flavour) -> (Arc<Seen>, Server, harness::Harness, harness::Process) {
    let (seen, server) = Server::seeing(flavour).await;
    let orders = connect(server.addr, "5s").await.unwrap();
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let p = refunds_process(&h, &orders).await;
    (seen, server, h, p)
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
        standing: Default::default(),
    }
}

/// The server made the first version of `approval`'s call once.
fn assert_effect_once(seen: &Seen, approval: &Approval) {
    let key = format!("{}:1", approval.action_id);
    assert_eq!(seen.effects(), BTreeMap::from([(key, 1)]));
}

#[tokio::test]
async fn the_engine_gates_a_destructive_mcp_tool_until_a_person_approves_then_runs_it_once() {
    let (seen, _server, h, p) = refunds_over(Flavour::Plain).await;

    let report = p.start(refund_task()).await.unwrap();

    let approval = waiting_refund(&report, &seen);
    approve_and_finish(&h, &p, &seen, &report, &approval).await;
}

#[tokio::test]
async fn an_mcp_calls_stored_outcome_keeps_the_servers_structured_content_and_the_model_reads_its_text()
 {
    let (seen, _server, h, p) = refunds_over(Flavour::Plain).await;
    let report = p.start(refund_task()).await.unwrap();
    let approval = waiting_refund(&report, &seen);

    approve_and_finish(&h, &p, &seen, &report, &approval).await;

    let history = p.history(&harness::acme(), &report.run_id).await.unwrap();
    let refund = history
        .actions
        .iter()
        .find(|action| action.tool == "issue_refund")
        .unwrap();
    let stored = refund.result.clone().unwrap();
    let refunded = json!({
        "refund_id": "rf-1",
        "order_id": "ord_55",
        "amount_cents": 7500,
        "key": format!("{}:1", approval.action_id),
    });
    let mcp = stored.mcp.expect("the server's structured content is kept");
    assert_eq!(mcp.structured_content, Some(refunded.clone()));
    assert_eq!(mcp.content, None, "its one text block is the text itself");
    let told = harness::told_about(&history.run, "issue_refund");
    assert_eq!(told.content, stored.content);
    assert_eq!(
        serde_json::from_str::<Value>(&told.content).unwrap(),
        refunded
    );
}

#[tokio::test]
async fn the_engine_never_sends_an_mcp_call_again_after_an_unknown_outcome() {
    let (seen, _server, h, p) = refunds_over(Flavour::FailsAfterCommit).await;
    let report = p.start(refund_task()).await.unwrap();
    let approval = report.approvals[0].clone();

    dana_approves(&h, &p, &approval).await;

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
    assert_eq!(
        swept.unowned,
        std::slice::from_ref(&key),
        "nobody can ask the tool, and the agent names no recovery owner"
    );
    assert_eq!(seen.effects(), BTreeMap::from([(key, 1)]));
    let refunds = seen
        .tools_called()
        .iter()
        .filter(|tool| *tool == "issue_refund")
        .count();
    assert_eq!(refunds, 1);
}

/// `get_order` of `order`, asked through the gate of the orders agent by ben, over MCP.
fn read_through_the_gate(order: &str) -> GateCall {
    GateCall {
        tenant: harness::acme(),
        agent: orders_name(),
        requested_by: PersonId::parse("ben").unwrap(),
        tool: "get_order".into(),
        args: json!({"order_id": order}),
        call_id: None,
        conversation: None,
        via: GateVia::Mcp,
        standing: Default::default(),
    }
}

#[tokio::test]
async fn a_read_whose_answer_the_mcp_server_lost_fails_at_once_and_the_same_read_runs_again() {
    let (seen, server) = Server::seeing(Flavour::ReadsFailAfterRunning).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let p = defined_process(
        &h,
        &definition,
        &env_for(server.addr),
        harness::Script::default(),
    )
    .await
    .unwrap();

    let lost = p.gate_call(read_through_the_gate("ord_55")).await.unwrap();

    assert_eq!(lost.status, CallStatus::Failed, "{lost:?}");
    let told = lost.result.unwrap();
    assert!(told.is_error);
    assert!(
        told.content.contains(
            "get_order only reads, so nothing took effect and nothing is left to reconcile"
        ),
        "{}",
        told.content
    );
    h.clock.advance(chrono::Duration::days(2));
    let swept = p.sweep(100).await.unwrap();
    assert!(
        swept.unknown.is_empty() && swept.to_recovery_owner.is_empty(),
        "{swept:?}"
    );
    let again = p.gate_call(read_through_the_gate("ord_55")).await.unwrap();
    assert!(!again.attached, "{again:?}");
    assert_eq!(seen.tools_called(), ["get_order", "get_order"]);
}

#[tokio::test]
async fn a_sweep_in_a_process_that_never_listed_the_tools_settles_a_call_a_dead_process_left_running()
 {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let env = env_for(server.addr);
    let runner = defined_process(&h, &definition, &env, harness::Script::default())
        .await
        .unwrap();
    let stall = GateCall {
        tool: "stall_refund".into(),
        args: refund(),
        ..read_through_the_gate("ord_55")
    };
    let approval = runner.gate_call(stall).await.unwrap().approval.unwrap();
    // Approved, the call runs in this process, which dies once the refund took effect.
    let dana = h.person("dana");
    let id = approval.id.clone();
    let running = tokio::spawn(async move {
        runner
            .decide(&dana, &id, harness::approve("d-1"))
            .await
            .map(|_| ())
    });
    seen.committed.notified().await;
    running.abort();
    h.clock.advance(chrono::Duration::hours(1));
    let sweeper = defined_process(&h, &definition, &env, harness::Script::default())
        .await
        .unwrap();

    let swept = sweeper.sweep(100).await.unwrap();

    let key = format!("{}:1", approval.action_id);
    assert_eq!(
        swept.unowned,
        std::slice::from_ref(&key),
        "unknown, its tool cannot be asked and the agent names no recovery owner: {swept:?}"
    );
    assert_eq!(seen.effects(), BTreeMap::from([(key, 1)]));
}

// An agent defined by files alone: its MCP server and tools in agent.toml, its policy matching
// the tools' annotations.

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
const BY_HINTS: &str = include_str!("../fixtures/policies/orders-by-hints.toml");

fn orders_definition(agent: &str, policy: &str) -> Result<Definition, DefinitionError> {
    Definition::load(&orders_files(&[
        ("agent.toml", agent),
        ("policy.toml", policy),
    ]))
}

/// The files of `agents/orders`, in memory.
fn orders_files<'a>(files: &'a [(&'a str, &'a str)]) -> InMemory<'a> {
    InMemory {
        dir: "agents/orders",
        files,
    }
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
    env: shared::adapters::env_template::Lookup<'_>,
    script: harness::Script,
) -> Result<harness::Process, DefinitionError> {
    defined_process_delivering(h, definition, env, script, Delivery::InProcess).await
}

/// [`defined_process`], its orders agent's tools listed from its servers.
async fn prepared_process(
    h: &harness::Harness,
    definition: &Definition,
    env: shared::adapters::env_template::Lookup<'_>,
    script: harness::Script,
) -> harness::Process {
    let p = defined_process(h, definition, env, script).await.unwrap();
    shared::agents::prepare(&p, &harness::acme(), &orders_name())
        .await
        .unwrap();
    p
}

/// [`defined_process`], its resume messages delivered as told.
async fn defined_process_delivering(
    h: &harness::Harness,
    definition: &Definition,
    env: shared::adapters::env_template::Lookup<'_>,
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
                match wiring.build(definition) {
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
    let (seen, server) = Server::seeing(Flavour::Plain).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let definition = orders_definition(ORDERS_AGENT, BY_HINTS).unwrap();
    let script = harness::Script::default().then_call(&[
        ("get_order", json!({"order_id": "ord_55"})),
        ("issue_refund", refund()),
    ]);
    let p = prepared_process(&h, &definition, &env_for(server.addr), script).await;
    let report = p.start(orders_task()).await.unwrap();

    let approval = waiting_refund(&report, &seen);
    assert_eq!(
        approval.reason,
        "The orders server says this tool changes things."
    );
    let calls = approve_and_finish(&h, &p, &seen, &report, &approval).await;
    assert_eq!(calls[1].2, refund());
    assert_eq!(
        *seen.authorizations.lock().unwrap(),
        [format!("Bearer {TOKEN}"), format!("Bearer {TOKEN}")]
    );
}

#[tokio::test]
async fn a_tool_the_definition_binds_by_name_takes_its_hints_from_the_listing() {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
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
    let p = prepared_process(&h, &definition, &env_for(server.addr), script).await;
    let tools = &p.agent(&harness::acme(), &orders_name()).unwrap().tools;
    let specs: Vec<String> = tools.specs().iter().map(|s| s.name.clone()).collect();
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

    dana_approves(&h, &p, approval).await;

    assert_effect_once(&seen, approval);
}

/// The refunds policy over the orders server's listed tools: a refund waits for finance, who
/// may lower its amount.
const EDITABLE: &str = r#"
name = "orders"
version = 1
default_ttl = "24h"

[tools.get_order]
decision = "allow"

[tools.issue_refund]
decision = "approve"
approver_role = "finance"
amount_field = "amount_cents"
editable = { amount_cents = "lower" }
[[tools.issue_refund.thresholds]]
above = "$0"
quorum = 1
reason = "Every refund needs a finance approver."
"#;

/// A run of the orders agent that waits on its refund, started by a process that leaves its
/// resumes to a queue; and a new process of the same agent, which has listed nothing.
struct WaitingElsewhere {
    h: harness::Harness,
    seen: Arc<Seen>,
    _server: Server,
    report: RunReport,
    approval: Approval,
    starter: harness::Process,
    queue: Arc<harness::RecordingQueue>,
    fresh: harness::Process,
}

/// [`WaitingElsewhere`] under `policy`, on a fresh embedded store and orders server (bind
/// `_server` to keep it serving).
async fn waiting_elsewhere(policy: &str) -> WaitingElsewhere {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
    let h = harness::Harness::new(harness::Embedded::fresh()).await;
    let addr = server.addr;
    let definition = orders_definition(ORDERS_AGENT, policy).unwrap();
    let env = env_for(addr);
    let script = harness::Script::default().then_call(&[
        ("get_order", json!({"order_id": "ord_55"})),
        ("issue_refund", refund()),
    ]);
    let queue = Arc::new(harness::RecordingQueue::default());
    let delivery = Delivery::Queue(queue.clone());
    let starter = defined_process_delivering(&h, &definition, &env, script.clone(), delivery)
        .await
        .unwrap();
    shared::agents::prepare(&starter, &harness::acme(), &orders_name())
        .await
        .unwrap();
    let report = starter.start(orders_task()).await.unwrap();
    let fresh = defined_process(&h, &definition, &env, script)
        .await
        .unwrap();
    let tools = &fresh.agent(&harness::acme(), &orders_name()).unwrap().tools;
    assert!(tools.get("issue_refund").is_none(), "nothing listed yet");
    let approval = waiting_refund(&report, &seen);
    WaitingElsewhere {
        h,
        seen,
        _server: server,
        report,
        approval,
        starter,
        queue,
        fresh,
    }
}

#[tokio::test]
async fn a_process_that_never_listed_the_tools_decides_runs_the_approved_call_once_and_the_model_goes_on()
 {
    let WaitingElsewhere {
        h,
        seen,
        _server,
        report,
        approval,
        fresh: decider,
        ..
    } = waiting_elsewhere(BY_HINTS).await;

    dana_approves(&h, &decider, &approval).await;

    assert_effect_once(&seen, &approval);
    assert_eq!(
        h.run(&decider, &report.run_id).await.status,
        RunStatus::Done
    );
}

#[tokio::test]
async fn a_process_that_never_listed_the_tools_rules_on_an_edit_of_a_call_only_a_listing_gives() {
    let WaitingElsewhere {
        h,
        _server,
        report,
        approval,
        fresh: decider,
        ..
    } = waiting_elsewhere(EDITABLE).await;

    let edited = decider
        .decide(&h.person("dana"), &approval.id, harness::edit("d-1", 50))
        .await;

    assert!(edited.is_ok(), "{edited:?}");
    let history = decider
        .history(&harness::acme(), &report.run_id)
        .await
        .unwrap();
    let lowered = history.actions.last().unwrap();
    assert_eq!(lowered.version.get(), 2);
    assert_eq!(lowered.args.as_value()["amount_cents"], 5000);
}

#[tokio::test]
async fn another_process_lists_the_tools_before_it_resumes_and_runs_the_approved_call_once() {
    let WaitingElsewhere {
        h,
        seen,
        report,
        approval,
        starter,
        queue,
        fresh: resumer,
        _server,
    } = waiting_elsewhere(BY_HINTS).await;
    dana_approves(&h, &starter, &approval).await;
    let message = queue
        .published()
        .pop()
        .expect("the decision queued a resume");

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
    assert_effect_once(&seen, &approval);
}

#[tokio::test]
async fn a_run_whose_mcp_server_is_down_is_refused_before_anything_is_written() {
    let (seen, server) = Server::seeing(Flavour::Plain).await;
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

    let refused = shared::agents::prepare(&p, &harness::acme(), &orders_name())
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
    shared::agents::prepare(&p, &harness::acme(), &orders_name())
        .await
        .unwrap();
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

/// What preparing `definition` (listing its servers' tools) says when it refuses.
async fn prepare_refusal(
    h: &harness::Harness,
    definition: &Definition,
    env: shared::adapters::env_template::Lookup<'_>,
) -> String {
    let p = defined_process(h, definition, env, harness::Script::default())
        .await
        .unwrap();
    shared::agents::prepare(&p, &harness::acme(), &orders_name())
        .await
        .unwrap_err()
        .to_string()
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
    let said = prepare_refusal(&h, &definition, &env).await;
    assert!(
        said.contains("agents/orders/agent.toml: mcp.orders.tools: mcp.orders lists get_order, which is also the name of tools.get_order"),
        "{said}"
    );

    // A rule for a tool neither defined nor listed shows once the server has listed its tools.
    let policy = format!("{BY_HINTS}\n[tools.refund_everything]\ndecision = \"allow\"\n");
    let definition = orders_definition(ORDERS_AGENT, &policy).unwrap();
    let said = prepare_refusal(&h, &definition, &env).await;
    assert!(
        said.starts_with("agents/orders/policy.toml: tools.refund_everything: the policy has a rule for refund_everything"),
        "{said}"
    );

    // So is an offline script's call of a tool that nothing provides.
    let agent =
        format!("{ORDERS_AGENT}\n[model]\nprovider = \"scripted\"\noffline = \"script.toml\"\n");
    let script_file =
        "[[turns]]\nsay = \"Wiping.\"\ncalls = [{ tool = \"wipe_orders\", args = {} }]\n";
    let definition = Definition::load(&orders_files(&[
        ("agent.toml", &agent),
        ("policy.toml", BY_HINTS),
        ("script.toml", script_file),
    ]))
    .unwrap();
    let said = prepare_refusal(&h, &definition, &env).await;
    assert!(
        said.starts_with("agents/orders/agent.toml: model.offline: the script calls wipe_orders"),
        "{said}"
    );
}
