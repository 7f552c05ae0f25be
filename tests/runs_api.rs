//! `POST /runs` for any agent over real processes: `countersign serve` beside the orders service,
//! tokens from `countersign token`. The requester is always the token's person; the body names
//! the agent and its task, never who asks.

mod common;

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

    assert_eq!(started.status, 201, "{}", started.json);
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

#[tokio::test]
async fn a_ttl_beyond_the_policys_longest_is_400_and_nothing_is_written() {
    let orders = OrdersService::start("runs-api-ttl");
    let server = server_beside(&orders, "runs-ttl");

    // The refunds policy gives a finance manager 30 minutes; a caller may ask for less only.
    let refund_within = |ttl: &str| json!({"agent": "refunds", "task": TASK, "ttl": ttl});
    let reply = server.post("/runs", "sam", refund_within("2h")).await;
    refused_starting_nothing(&server, &reply, 400, "bad_input", "30m").await;
    assert!(orders.refunds("ord_55").is_empty());

    let shorter = server.post("/runs", "sam", refund_within("10m")).await;
    assert_eq!(shorter.status, 201, "{}", shorter.json);
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
    assert_eq!(long.status, 201, "{}", long.json);
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
