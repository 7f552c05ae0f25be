//! Slack against a real `countersign serve`, configured only by environment as a deployment
//! is: notices posted through a loopback stand-in for Slack's Web API with buttons and a link
//! to the review page, a click signed as Slack signs it deciding as the mapped person, its
//! answer posted to the stand-in `response_url`, and the message updated in place.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use shared::adapters::slack::{SigningSecret, sign};

mod common;
#[path = "../shared/tests/support/slack_form.rs"]
mod slack_form;

use common::server::Server;
use slack_form::interaction_form;

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
    let server = Server::start_with_env(
        "slack",
        &["--sweep-every", "0s"],
        &[
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
        ],
    );
    let paused = server.paused_run("ben", "c-102", None).await;

    let posts = calls_to(&calls, "/api/chat.postMessage");
    assert_eq!(posts.len(), 1);
    let notice = &posts[0];
    assert_eq!(notice["channel"], "C0REVIEW1");
    let blocks = notice["blocks"].as_array().unwrap();
    let details = blocks[1]["text"]["text"].as_str().unwrap();
    let link = format!("https://review.acme.example/#approval={}", paused.approval);
    assert!(details.contains(&link), "{details}");
    let actions = blocks
        .iter()
        .find(|b| b["type"] == "actions")
        .expect("buttons");
    let approve = actions["elements"][0].clone();
    assert_eq!(
        approve["action_id"],
        format!("countersign.approve.{}.v1", paused.approval)
    );

    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0DANA001", "username": "dana", "team_id": "T0ACME001"},
        "team": {"id": "T0ACME001", "domain": "acme"},
        "container": {"type": "message", "message_ts": "1700000000.000001", "channel_id": "C0REVIEW1"},
        "channel": {"id": "C0REVIEW1"},
        "response_url": format!("{slack}/actions/T0ACME001/1/abc"),
        "actions": [{
            "type": "button",
            "block_id": "countersign.decide",
            "action_id": approve["action_id"],
            "value": approve["value"],
            "text": approve["text"],
            "action_ts": "1700000001.000002",
        }],
    });
    let body = interaction_form(&payload);
    let url = format!("{}/slack/interactions", server.base);
    let post = |timestamp: String, signature: String| {
        server
            .http
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", timestamp)
            .header("x-slack-signature", signature)
            .body(body.clone())
            .send()
    };

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let unsigned = post(now.clone(), "v0=00".into()).await.unwrap();
    assert_eq!(unsigned.status(), 401);
    assert_eq!(
        server.approval(&paused.approval).await["status"],
        "awaiting_approval"
    );

    let secret = SigningSecret::new(SECRET).unwrap();
    let signature = sign(&secret, &now, body.as_bytes());
    let reply = post(now, signature).await.unwrap();
    assert_eq!(reply.status(), 200);
    let answer: Value = reply.json().await.unwrap();
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

    // The decision and the action's result each update the message in place.
    let updates = calls_to(&calls, "/api/chat.update");
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
