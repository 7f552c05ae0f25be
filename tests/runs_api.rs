//! `POST /runs` for any agent over real processes: `countersign serve` beside the orders service,
//! tokens from `countersign token`. The requester is always the token's person; the body names
//! the agent and its task, never who asks. A run is accepted at once and driven by the server
//! after its answer; `GET /runs/{id}` says where it stands.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::agents::TempDir;
use common::orders::OrdersService;
use common::server::{Reply, Server, approve, assert_refused, assert_refused_naming};
use serde_json::{Value, json};

const TASK: &str = "Refund USD 125 for order ord_55: the blender arrived damaged.";

/// A server whose refunds agent reaches `orders`.
fn server_beside(orders: &OrdersService, name: &str) -> Server {
    Server::start_with_env(name, &["--sweep-every", "0s"], &orders.env())
}

/// What waits for a decision in acme, as a finance manager lists it.
async fn waiting(server: &Server) -> Value {
    let reply = server.get("/approvals", "mia").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    reply.json["approvals"].clone()
}

/// `reply` is a refusal with `status` and `code` whose message names `mention`, and nothing
/// waits for a decision.
async fn refused_starting_nothing(
    server: &Server,
    reply: &Reply,
    status: u16,
    code: &str,
    mention: &str,
) {
    assert_refused_naming(reply, status, code, mention);
    assert_eq!(waiting(server).await, json!([]));
}

#[tokio::test]
async fn a_refund_started_over_http_pauses_for_a_finance_manager_with_the_caller_as_requester() {
    let orders = OrdersService::start("runs-api");
    let server = server_beside(&orders, "runs-refunds");

    let started = server.start_agent("sam", "refunds", TASK).await;

    assert_eq!(started.status, 200, "{}", started.json);
    assert_eq!(
        started.json["status"], "awaiting_approval",
        "{}",
        started.json
    );
    let approvals = started.json["approvals"].as_array().unwrap();
    assert_eq!(approvals.len(), 1, "{}", started.json);
    let approval = &approvals[0];
    assert_eq!(approval["agent"], "refunds");
    assert_eq!(approval["tool"], "issue_refund");
    assert_eq!(approval["args"]["order_id"], "ord_55");
    assert_eq!(approval["args"]["amount_cents"], 12_500);
    assert_eq!(approval["approver_role"], "finance_manager");
    assert_eq!(approval["requested_by"], json!(["sam"]));
    let run = started.json["run_id"].as_str().unwrap();
    let audit = server.get(&format!("/runs/{run}/audit"), "mia").await;
    assert_eq!(audit.json["run"]["requested_by"], "sam", "{}", audit.json);
    assert_eq!(audit.json["entries"][0]["event"], "started");
    assert_eq!(audit.json["entries"][0]["actor"]["id"], "sam");

    let id = approval["id"].as_str().unwrap();
    let own = server.decide("sam", id, approve("sam-1")).await;
    assert_refused(&own, 403, "own_request");
    let decided = server.decided("mia", id, approve("mia-1")).await;
    assert_eq!(decided.json["run"]["status"], "done", "{}", decided.json);
    let key = format!("{}:1", approval["action_id"].as_str().unwrap());
    orders.only_refund("ord_55", 12_500, &key);
}

#[tokio::test]
async fn the_body_cannot_name_the_requester() {
    let orders = OrdersService::start("runs-api-requester");
    let server = server_beside(&orders, "runs-requester");
    for field in ["requested_by", "requester", "tenant"] {
        let mut body = json!({"agent": "refunds", "task": TASK});
        body[field] = json!("mia");
        let reply = server.post("/runs", "sam", body).await;
        refused_starting_nothing(&server, &reply, 400, "unknown_field", "").await;
    }
}

#[tokio::test]
async fn an_unknown_agent_is_404_and_starts_nothing() {
    let server = Server::start("runs-unknown-agent");
    let reply = server
        .start_agent("sam", "payroll", "Pay everyone twice.")
        .await;
    refused_starting_nothing(&server, &reply, 404, "not_found", "payroll").await;
}

#[tokio::test]
async fn an_agent_is_not_found_for_a_tenant_its_definition_does_not_name_as_an_unknown_one_is() {
    let orders = OrdersService::start("runs-api-tenants");
    let server = server_beside(&orders, "runs-tenants");

    // zoe is of globex; the refunds agent names acme only.
    let foreign = server.start_agent("zoe", "refunds", TASK).await;
    let unknown = server.start_agent("zoe", "payroll", TASK).await;

    assert_refused_naming(&foreign, 404, "not_found", "agent refunds was not found");
    assert_refused_naming(&unknown, 404, "not_found", "agent payroll was not found");
    assert_eq!(
        foreign.json["error"]["message"]
            .as_str()
            .unwrap()
            .replace("refunds", "payroll"),
        unknown.json["error"]["message"].as_str().unwrap()
    );
    let zoes = server.get("/approvals", "zoe").await;
    assert_eq!(zoes.json["approvals"], json!([]), "{}", zoes.json);
    // acme's own people start it as ever.
    let started = server.start_agent("sam", "refunds", TASK).await;
    assert_eq!(
        started.json["status"], "awaiting_approval",
        "{}",
        started.json
    );
}

#[tokio::test]
async fn an_agent_without_a_task_or_a_task_beside_a_claim_is_400() {
    let server = Server::start("runs-shape");
    for body in [
        json!({"agent": "refunds"}),
        json!({"task": TASK}),
        json!({"claim_id": "c-102", "task": "Process expense claim c-102."}),
        json!({"agent": "expense", "claim_id": "c-102", "task": "Process expense claim c-102."}),
        json!({"agent": "refunds", "claim_id": "c-102"}),
        json!({}),
    ] {
        let reply = server.post("/runs", "ben", body.clone()).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.json);
        assert_eq!(
            reply.json["error"]["code"], "invalid_field",
            "{body}: {}",
            reply.json
        );
    }
    let blank = server.start_agent("ben", "expense", "  ").await;
    refused_starting_nothing(&server, &blank, 400, "bad_input", "").await;
    let bad_name = server.start_agent("ben", "../refunds", TASK).await;
    refused_starting_nothing(&server, &bad_name, 400, "invalid_field", "").await;
}

/// An agent named `name` played by the model API its `[model]` lines give, with no offline
/// script and no tools.
fn keyless_agent(dir: &TempDir, name: &str, model: &str) -> String {
    let agent = format!(
        "name = \"{name}\"\nsystem_prompt = \"You answer questions.\"\n\n[model]\n{model}\n"
    );
    let policy = format!("name = \"{name}\"\nversion = 1\ndefault_ttl = \"1h\"\n");
    dir.agent(name, &[("agent.toml", &agent), ("policy.toml", &policy)])
}

#[tokio::test]
async fn a_run_of_an_agent_whose_model_key_is_unset_is_a_500_naming_the_variable_not_a_503() {
    let dir = TempDir::new("runs-no-key");
    let claude = keyless_agent(&dir, "claude-desk", "provider = \"anthropic\"");
    let oai = keyless_agent(
        &dir,
        "oai",
        "provider = \"openai\"\nid = \"gpt-4o\"\napi_key_env = \"OAI_TEST_KEY\"",
    );
    let env = [("COUNTERSIGN_AGENTS", format!("{claude},{oai}"))];
    let server = Server::start_with_env("runs-no-key", &["--sweep-every", "0s"], &env);

    for (agent, variable) in [
        ("claude-desk", "ANTHROPIC_API_KEY"),
        ("oai", "OAI_TEST_KEY"),
    ] {
        let reply = server
            .post("/runs", "sam", json!({"agent": agent, "task": "Hello?"}))
            .await;

        refused_starting_nothing(&server, &reply, 500, "not_configured", variable).await;
        let message = reply.json["error"]["message"].as_str().unwrap();
        assert!(!message.contains("try again"), "{message}");
    }
}

#[tokio::test]
async fn a_ttl_beyond_the_policys_longest_is_400_and_nothing_is_written() {
    let orders = OrdersService::start("runs-api-ttl");
    let server = server_beside(&orders, "runs-ttl");

    // The refunds policy gives a finance manager 30 minutes; a caller may ask for less only.
    let refund_within = |ttl: &str| json!({"agent": "refunds", "task": TASK, "ttl": ttl});
    let reply = server.post("/runs", "sam", refund_within("2h")).await;
    refused_starting_nothing(&server, &reply, 400, "bad_input", "30m").await;
    assert!(orders.refunds("ord_55").is_empty());

    let shorter = server.start_run("sam", refund_within("10m")).await;
    assert_eq!(shorter.status, 200, "{}", shorter.json);
    let approval = &shorter.json["approvals"][0];
    let granted = chrono::DateTime::parse_from_rfc3339(approval["expires_at"].as_str().unwrap())
        .unwrap()
        - chrono::DateTime::parse_from_rfc3339(approval["created_at"].as_str().unwrap()).unwrap();
    assert_eq!(granted, chrono::TimeDelta::minutes(10));
}

#[tokio::test]
async fn the_expense_short_form_still_starts_a_run_that_neither_caller_nor_claimant_may_approve() {
    let server = Server::start("runs-short-form");
    // erin asks for ben's claim: erin is the requester, ben the claimant the definition names.
    let short = server.paused_run("erin", "c-102", None).await;
    let long = server
        .start_agent("erin", "expense", "Process expense claim c-102.")
        .await;
    assert_eq!(long.status, 200, "{}", long.json);
    let long_approval = long.json["approvals"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();

    for approval in [&short.approval, &long_approval] {
        let before = server.approval(approval).await;
        assert_eq!(before["requested_by"], json!(["erin", "ben"]), "{before}");
        for who in ["erin", "ben"] {
            let reply = server
                .decide(who, approval, approve(&format!("{who}-{approval}")))
                .await;
            assert_refused(&reply, 403, "own_request");
        }
        assert_eq!(server.approval(approval).await, before);
        server
            .decided("dana", approval, approve(&format!("dana-{approval}")))
            .await;
    }
}

/// How a Chat Completions stand-in answers each request in turn.
#[derive(Clone, Copy)]
enum Turn {
    /// Answers after this long.
    After(Duration),
    /// Never answers, as a model whose caller dies first.
    Never,
}

/// An OpenAI-compatible model on loopback that answers every turn with `ANSWER`, each request
/// as `turns` says (the last for any later one): its base URL and how many requests it got.
async fn model_stand_in(turns: Vec<Turn>) -> (String, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let turn = turns[n.min(turns.len() - 1)];
            async move {
                match turn {
                    Turn::After(wait) => tokio::time::sleep(wait).await,
                    Turn::Never => std::future::pending::<()>().await,
                }
                axum::Json(json!({
                    "id": "chatcmpl-slow-1",
                    "object": "chat.completion",
                    "created": 1_764_600_000,
                    "model": "gpt-4o-2024-08-06",
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": ANSWER, "refusal": null},
                        "logprobs": null,
                        "finish_reason": "stop",
                    }],
                    "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, asked)
}

const ANSWER: &str = "Order ord_55 needs no refund: it was delivered intact.";

/// An agent played by the model at `base_url` (no key), with one read tool it never calls.
fn slow_agent(dir: &TempDir, base_url: &str) -> String {
    let agent = format!(
        r#"name = "orders-desk"
system_prompt = "You answer questions about orders."

[model]
provider = "openai"
id = "gpt-4o"
base_url = "{base_url}"
api_key_env = ""

[tools.get_order]
description = "Reads an order."
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }} }}, required = ["order_id"], additionalProperties = false }}

[tools.get_order.http]
method = "GET"
url = "http://127.0.0.1:9/orders/{{order_id}}"
timeout = "1s"
"#
    );
    let policy = "name = \"orders-desk\"\nversion = 1\ndefault_ttl = \"1h\"\n\n[tools.get_order]\ndecision = \"allow\"\n";
    dir.agent(
        "orders-desk",
        &[("agent.toml", &agent), ("policy.toml", policy)],
    )
}

/// `POST /runs` as sam: the orders desk asked about ord_55.
async fn sam_asks_the_orders_desk(server: &Server) -> Reply {
    let task = json!({"agent": "orders-desk", "task": "Is ord_55 due a refund?"});
    server.post("/runs", "sam", task).await
}

/// Waits until the stand-in got `n` requests.
async fn until_asked(asked: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while asked.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "the model was not asked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_run_whose_model_takes_longer_than_api_gateways_30_s_is_accepted_at_once_and_completes() {
    let (base_url, asked) = model_stand_in(vec![Turn::After(Duration::from_secs(31))]).await;
    let dir = TempDir::new("runs-slow-model");
    let env = [("COUNTERSIGN_AGENTS", slow_agent(&dir, &base_url))];
    let server = Server::start_with_env("runs-slow-model", &["--sweep-every", "0s"], &env);

    let asking = Instant::now();
    let accepted = sam_asks_the_orders_desk(&server).await;

    assert!(
        asking.elapsed() < Duration::from_secs(2),
        "{:?}",
        asking.elapsed()
    );
    assert_eq!(accepted.status, 202, "{}", accepted.json);
    assert_eq!(accepted.json["status"], "running", "{}", accepted.json);
    let run = accepted.json["run_id"].as_str().unwrap().to_string();
    until_asked(&asked, 1).await;
    let reading = server.get(&format!("/runs/{run}"), "sam").await;
    assert_eq!(reading.status, 200, "{}", reading.json);
    assert_eq!(reading.json["status"], "running", "{}", reading.json);
    assert_eq!(
        reading.json["waiting_on"],
        json!([{"kind": "model_turn"}]),
        "{}",
        reading.json
    );

    let done = server
        .settled_within("sam", &run, Duration::from_secs(60))
        .await;
    assert_eq!(done.json["status"], "done", "{}", done.json);
    assert_eq!(done.json["answer"], ANSWER);
    assert_eq!(done.json["waiting_on"], json!([]));
    assert_eq!(asked.load(Ordering::SeqCst), 1, "one model turn");
}

#[tokio::test]
async fn a_server_killed_during_a_model_turn_leaves_a_run_the_sweep_drives_again_once_its_lease_runs_out()
 {
    let (base_url, asked) = model_stand_in(vec![Turn::Never, Turn::After(Duration::ZERO)]).await;
    let dir = TempDir::new("runs-killed");
    let env = [("COUNTERSIGN_AGENTS", slow_agent(&dir, &base_url))];
    let mut server = Server::start_with_env("runs-killed", &["--sweep-every", "0s"], &env);
    let accepted = sam_asks_the_orders_desk(&server).await;
    assert_eq!(accepted.status, 202, "{}", accepted.json);
    let run = accepted.json["run_id"].as_str().unwrap().to_string();
    until_asked(&asked, 1).await;

    // Killed mid-turn; started again past the run's 15-minute lease, sweeping every second.
    let later = [
        env[0].clone(),
        ("COUNTERSIGN_CLOCK_OFFSET", "16m".to_string()),
    ];
    server.crash_and_restart(&["--sweep-every", "1s"], &later);

    let done = server.settled("sam", &run).await;
    assert_eq!(done.json["status"], "done", "{}", done.json);
    assert_eq!(done.json["answer"], ANSWER);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "the turn was asked again once"
    );
    let audit = server.audit(&run).await;
    let events: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["started", "resumed", "model_turn", "done"],
        "{audit}"
    );
    let resumed = &audit["entries"][1];
    assert_eq!(resumed["actor"]["component"], "sweep", "{resumed}");
    assert_eq!(
        resumed["why"],
        "the process driving this run stopped during a model turn: driven again from its \
         stored conversation (1 of 3)"
    );
}

#[tokio::test]
async fn a_run_is_read_by_its_tenant_with_what_it_waits_on_and_is_404_to_another_tenant() {
    let (server, c102) = Server::with_paused_run("runs-read", "ben", "c-102").await;

    let reading = server.get(&format!("/runs/{}", c102.run), "dana").await;

    assert_eq!(reading.status, 200, "{}", reading.json);
    assert_eq!(
        reading.json["status"], "awaiting_approval",
        "{}",
        reading.json
    );
    let waiting = &reading.json["waiting_on"];
    assert_eq!(waiting.as_array().unwrap().len(), 1, "{waiting}");
    assert_eq!(waiting[0]["kind"], "approval");
    assert_eq!(waiting[0]["approval_id"], c102.approval.as_str());
    assert_eq!(waiting[0]["approver_role"], "finance");
    assert_eq!(waiting[0]["link"], format!("/approvals/{}", c102.approval));
    assert!(waiting[0]["expires_at"].is_string(), "{waiting}");
    assert_eq!(
        reading.json["links"]["audit"],
        format!("/runs/{}/audit", c102.run)
    );

    let other = server.get(&format!("/runs/{}", c102.run), "zoe").await;
    assert_refused(&other, 404, "not_found");
    let bad = server.get("/runs/not%20a%20run", "dana").await;
    assert_eq!(bad.status, 400, "{}", bad.json);
    let unknown = server.get("/runs/run-0000000000000000", "dana").await;
    assert_refused(&unknown, 404, "not_found");
}
