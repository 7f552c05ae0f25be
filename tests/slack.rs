//! Slack against a real `countersign serve`, configured only by environment as a deployment
//! is: notices posted through a loopback stand-in for Slack's Web API with buttons and a link
//! to the review page, a click signed as Slack signs it deciding as the mapped person, its
//! answer posted to the stand-in `response_url`, and the message updated in place; and Slack
//! answered while the tool the click approved is still running, the run finishing after.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use shared::adapters::slack::{SigningSecret, sign};

mod common;
#[path = "../shared/tests/support/slack_form.rs"]
mod slack_form;
#[path = "../shared/tests/support/slack_post.rs"]
mod slack_post;

use common::server::Server;
use slack_form::interaction_form;
use slack_post::post_interaction;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// What the stand-in for Slack got: the path called and its JSON body.
type Calls = Arc<Mutex<Vec<(String, Value)>>>;

async fn record(
    axum::extract::State(calls): axum::extract::State<Calls>,
    uri: axum::http::Uri,
    body: axum::Json<Value>,
) -> axum::Json<Value> {
    let mut calls = calls.lock().unwrap();
    calls.push((uri.path().to_string(), body.0.clone()));
    let answer = match uri.path() {
        "/api/chat.postMessage" => {
            json!({"ok": true, "channel": "C0REVIEW1", "ts": format!("1700000000.{:06}", calls.len())})
        }
        _ => json!({"ok": true}),
    };
    axum::Json(answer)
}

/// Slack on loopback: the Web API under `/api/`, response URLs under `/actions/`.
async fn slack_stand_in() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let app = axum::Router::new()
        .fallback(axum::routing::post(record))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, calls)
}

/// How long a test waits for what the server does after it answered.
const PATIENCE: Duration = Duration::from_secs(60);

/// What `probe` finds, once it finds something; the test fails if that takes longer than
/// [`PATIENCE`].
async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `countersign serve` needs to post notices through the stand-in `slack` and take its
/// clicks.
fn slack_env(slack: &str) -> Vec<(&'static str, String)> {
    vec![
        ("COUNTERSIGN_SLACK_SIGNING_SECRET", SECRET.into()),
        (
            "COUNTERSIGN_SLACK_BOT_TOKEN",
            "xoxb-countersign-test".into(),
        ),
        ("COUNTERSIGN_SLACK_CHANNEL", "C0REVIEW1".into()),
        ("COUNTERSIGN_SLACK_API_URL", format!("{slack}/api/")),
        ("COUNTERSIGN_SLACK_HOOKS_URL", format!("{slack}/actions/")),
        (
            "COUNTERSIGN_PUBLIC_URL",
            "https://review.acme.example".into(),
        ),
        ("COUNTERSIGN_WEBHOOKS", String::new()),
    ]
}

/// The one notice posted, once it is. A run shows it waits for approval as soon as its pause
/// commits; the notice is posted after that commit.
async fn notice(calls: &Calls) -> Value {
    eventually("the notice posted to Slack", || async {
        let posts = calls_to(calls, "/api/chat.postMessage");
        assert!(posts.len() <= 1, "{posts:?}");
        posts.into_iter().next()
    })
    .await
}

/// The Approve button of the notice.
fn approve_button(notice: &Value) -> Value {
    let actions = notice["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "actions")
        .expect("buttons")
        .clone();
    actions["elements"][0].clone()
}

/// The form Slack posts when `user` clicks `button` on the notice, as its block_actions payload
/// documents.
fn click_body(slack: &str, button: &Value, user: &str) -> String {
    interaction_form(&click_payload(slack, button, user))
}

/// The block_actions payload of `user`'s click on `button`.
fn click_payload(slack: &str, button: &Value, user: &str) -> Value {
    json!({
        "type": "block_actions",
        "user": {"id": user, "team_id": "T0ACME001"},
        "team": {"id": "T0ACME001", "domain": "acme"},
        "container": {"type": "message", "message_ts": "1700000000.000001", "channel_id": "C0REVIEW1"},
        "channel": {"id": "C0REVIEW1"},
        "response_url": format!("{slack}/actions/T0ACME001/1/abc"),
        "actions": [{
            "type": "button",
            "block_id": "countersign.decide",
            "action_id": button["action_id"],
            "value": button["value"],
            "text": button["text"],
            "action_ts": "1700000001.000002",
        }],
    })
}

/// Posts an interaction's `body` to the server with these signature headers: the status and
/// the answer.
async fn post_to(server: &Server, body: &str, timestamp: &str, signature: &str) -> (u16, Value) {
    post_interaction(&server.http, &server.base, body, timestamp, signature).await
}

fn unix_now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string()
}

/// `user`'s click on `button`, signed now as Slack signs it: the status and the answer.
async fn click(server: &Server, slack: &str, button: &Value, user: &str) -> (u16, Value) {
    post_signed(server, &click_body(slack, button, user)).await
}

/// An interaction's `body`, signed now as Slack signs it: the status and the answer.
async fn post_signed(server: &Server, body: &str) -> (u16, Value) {
    let now = unix_now();
    let signature = sign(&SigningSecret::new(SECRET).unwrap(), &now, body.as_bytes());
    post_to(server, body, &now, &signature).await
}

fn calls_to(calls: &Calls, path: &str) -> Vec<Value> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p == path)
        .map(|(_, body)| body.clone())
        .collect()
}

#[tokio::test]
async fn a_click_in_slack_decides_and_the_message_tells_the_outcome() {
    let (slack, calls) = slack_stand_in().await;
    let server = Server::start_with_env("slack", &["--sweep-every", "0s"], &slack_env(&slack));
    let paused = server.paused_run("ben", "c-102", None).await;

    let notice = notice(&calls).await;
    assert_eq!(notice["channel"], "C0REVIEW1");
    let blocks = notice["blocks"].as_array().unwrap();
    let details = blocks[1]["text"]["text"].as_str().unwrap();
    let link = format!("https://review.acme.example/#approval={}", paused.approval);
    assert!(details.contains(&link), "{details}");
    let approve = approve_button(&notice);
    assert_eq!(
        approve["action_id"],
        format!("countersign.approve.{}.v1", paused.approval)
    );

    let body = click_body(&slack, &approve, "U0DANA001");
    let (status, _) = post_to(&server, &body, &unix_now(), "v0=00").await;
    assert_eq!(status, 401);
    assert_eq!(
        server.approval(&paused.approval).await["status"],
        "awaiting_approval"
    );

    let (status, answer) = click(&server, &slack, &approve, "U0DANA001").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["response_type"], "ephemeral");
    let told = answer["text"].as_str().unwrap();
    assert!(
        told.starts_with("You approved reimburse version 1"),
        "{told}"
    );
    assert_eq!(
        calls_to(&calls, "/actions/T0ACME001/1/abc"),
        std::slice::from_ref(&answer),
        "the answer went to the response_url"
    );

    let stored = server.approval(&paused.approval).await;
    assert_eq!(stored["status"], "approved");
    assert_eq!(stored["decisions"][0]["by"], "dana");

    // The decision and the action's result each update the message in place, once the run
    // resumed after the answer.
    let updates = eventually("the message updated twice", || async {
        let updates = calls_to(&calls, "/api/chat.update");
        (updates.len() >= 2).then_some(updates)
    })
    .await;
    assert_eq!(updates.len(), 2, "{updates:?}");
    let last = &updates[1];
    assert_eq!(last["ts"], "1700000000.000001");
    let text: Vec<&str> = last["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"]["text"].as_str())
        .collect();
    let text = text.join("\n");
    assert!(text.contains("*dana* approved version 1"), "{text}");
    assert!(text.contains("*The call:* succeeded"), "{text}");
    assert!(
        last["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] != "actions"),
        "the buttons are gone"
    );
}

#[tokio::test]
async fn a_click_carrying_the_whole_message_is_read_up_to_the_routes_64_kib() {
    let (slack, calls) = slack_stand_in().await;
    let env = slack_env(&slack);
    let server = Server::start_with_env("slack-large", &["--sweep-every", "0s"], &env);
    let paused = server.paused_run("ben", "c-102", None).await;
    let approve = approve_button(&notice(&calls).await);
    // Slack sends the message clicked on with the click, blocks and all.
    let carrying = |bytes: usize| {
        let mut payload = click_payload(&slack, &approve, "U0DANA001");
        payload["message"] = json!({"type": "message", "text": "x".repeat(bytes)});
        interaction_form(&payload)
    };

    let too_large = carrying(65 * 1024);
    let (status, answer) = post_signed(&server, &too_large).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "body_too_large", "{answer}");
    let waiting = server.approval(&paused.approval).await;
    assert_eq!(waiting["status"], "awaiting_approval");
    assert_eq!(waiting["decisions"], json!([]));

    let large = carrying(40 * 1024);
    assert!(large.len() > 16 * 1024, "more than the API's own limit");
    let (status, answer) = post_signed(&server, &large).await;
    assert_eq!(status, 200, "{answer}");
    let told = answer["text"].as_str().unwrap();
    assert!(told.starts_with("You approved reimburse"), "{told}");
    let decided = server.approval(&paused.approval).await;
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decisions"][0]["by"], "dana");
}

/// A loopback stand-in for the refunds agent's orders service whose refunds wait: each refund
/// request is counted when it arrives, and answered only once the test releases it.
struct HeldOrders {
    url: String,
    arrived: tokio::sync::watch::Receiver<usize>,
    release: tokio::sync::watch::Sender<bool>,
}

#[derive(Clone)]
struct HeldState {
    arrived: Arc<tokio::sync::watch::Sender<usize>>,
    released: tokio::sync::watch::Receiver<bool>,
}

async fn get_order(axum::extract::Path(order): axum::extract::Path<String>) -> axum::Json<Value> {
    axum::Json(json!({
        "order_id": order, "customer": "cus_7", "currency": "USD",
        "paid_cents": 14_900, "refundable_cents": 14_900,
    }))
}

async fn held_refund(
    axum::extract::State(state): axum::extract::State<HeldState>,
    axum::extract::Path(order): axum::extract::Path<String>,
    body: axum::Json<Value>,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    state.arrived.send_modify(|n| *n += 1);
    let mut released = state.released.clone();
    released.wait_for(|r| *r).await.unwrap();
    let refund =
        json!({"refund_id": "rf_1", "order_id": order, "amount_cents": body.0["amount_cents"]});
    (axum::http::StatusCode::CREATED, axum::Json(refund))
}

impl HeldOrders {
    async fn start() -> Self {
        let (arrived_tx, arrived) = tokio::sync::watch::channel(0);
        let (release, released) = tokio::sync::watch::channel(false);
        let app = axum::Router::new()
            .route("/orders/{order}", axum::routing::get(get_order))
            .route("/orders/{order}/refunds", axum::routing::post(held_refund))
            .with_state(HeldState {
                arrived: Arc::new(arrived_tx),
                released,
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url,
            arrived,
            release,
        }
    }
}

/// The shipped people, with mia (a finance manager) mapped to a Slack user.
fn people_with_mia_in_slack() -> std::path::PathBuf {
    let shipped = include_str!("../shared/example/people.toml");
    let mia = r#"roles = ["employee", "finance_manager"]"#;
    assert_eq!(
        shipped.matches(mia).count(),
        1,
        "mia is the one finance manager"
    );
    let dir = common::fresh_path("countersign-slack-people");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("people.toml");
    std::fs::write(
        &path,
        shipped.replace(mia, &format!("{mia}\nslack = \"U0MIA0001\"")),
    )
    .unwrap();
    path
}

/// A server with the refunds agent and a Slack app, whose orders service holds refunds; sam's
/// refund of ord_55 waits for a finance manager, and mia approves it in Slack. What the test
/// needs once Slack has its answer.
struct ApprovedInSlack {
    server: Server,
    orders: HeldOrders,
    calls: Calls,
    run: String,
    /// The refund's action id.
    refund: Value,
    answer: Value,
    people: std::path::PathBuf,
}

impl ApprovedInSlack {
    async fn click(name: &str) -> Self {
        let (slack, calls) = slack_stand_in().await;
        let orders = HeldOrders::start().await;
        let people = people_with_mia_in_slack();
        let mut env = slack_env(&slack);
        env.push(("ORDERS_URL", orders.url.clone()));
        let server = Server::start_with_env(
            name,
            &["--sweep-every", "0s", "--people", people.to_str().unwrap()],
            &env,
        );
        let started = server
            .start_agent(
                "sam",
                "refunds",
                "Refund ord_55: the blender arrived damaged.",
            )
            .await;
        assert_eq!(started.status, 200, "{}", started.json);
        assert_eq!(
            started.json["status"], "awaiting_approval",
            "{}",
            started.json
        );
        let run = started.json["run_id"].as_str().unwrap().to_string();
        let refund = started.json["approvals"][0]["action_id"].clone();

        let (status, answer) = click(
            &server,
            &slack,
            &approve_button(&notice(&calls).await),
            "U0MIA0001",
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let told = answer["text"].as_str().unwrap();
        assert!(
            told.starts_with("You approved issue_refund version 1"),
            "{told}"
        );
        Self {
            server,
            orders,
            calls,
            run,
            refund,
            answer,
            people,
        }
    }

    /// Returns once the refund reached the orders service, where it waits.
    async fn until_refund_held(&mut self) {
        tokio::time::timeout(PATIENCE, self.orders.arrived.wait_for(|n| *n == 1))
            .await
            .expect("the refund reaches the orders service")
            .unwrap();
    }
}

impl Drop for ApprovedInSlack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.people.parent().unwrap());
    }
}

#[tokio::test]
async fn slack_is_answered_while_the_approved_tool_still_runs_and_the_run_finishes_after() {
    // The refund cannot come back before the test lets it: an answer to the click is one given
    // before the tool's call ended.
    let mut s = ApprovedInSlack::click("slack-later").await;
    s.until_refund_held().await;
    // The call is under way and has not come back: the answer did not wait for it.
    let events = s.server.events_of_action(&s.run, &s.refund).await;
    assert_eq!(
        events.last().map(String::as_str),
        Some("executing"),
        "{events:?}"
    );
    assert_eq!(
        calls_to(&s.calls, "/actions/T0ACME001/1/abc"),
        std::slice::from_ref(&s.answer),
        "one answer went to the response_url"
    );

    // Released, the refund comes back and the run finishes.
    s.orders.release.send(true).unwrap();
    let audit = eventually("the run is done", || async {
        let audit = s.server.audit(&s.run).await;
        (audit["run"]["status"] == "done").then_some(audit)
    })
    .await;
    let events = s.server.events_of_action(&s.run, &s.refund).await;
    assert_eq!(
        events.iter().filter(|e| *e == "executed").count(),
        1,
        "{events:?}"
    );
    assert_eq!(*s.orders.arrived.borrow(), 1, "one refund: {audit}");
}

#[tokio::test]
async fn a_server_told_to_stop_finishes_the_run_a_slack_click_resumed_before_it_exits() {
    let mut s = ApprovedInSlack::click("slack-stop").await;
    s.until_refund_held().await;
    s.server.terminate();
    // It stopped taking requests while the refund is still held.
    s.server.until_not_listening(PATIENCE).await;

    s.orders.release.send(true).unwrap();
    let status = s.server.exited(PATIENCE).await;
    assert!(status.success(), "{status}");
    let history = s.server.history(&s.run);
    assert_eq!(history["run"]["status"], "done", "{}", history["entries"]);
    assert_eq!(*s.orders.arrived.borrow(), 1);
}
