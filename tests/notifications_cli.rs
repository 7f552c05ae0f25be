//! `countersign` with `COUNTERSIGN_WEBHOOKS` set, as real processes: a pause posts its notice to
//! the receiver, and `countersign audit` shows it with the rest of the run, as text and as JSON.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::Value;

mod common;

use common::{fresh_path, item_where, stdout_of};

type Seen = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

async fn receive(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> StatusCode {
    seen.lock().unwrap().push((headers, body.0));
    StatusCode::OK
}

/// A webhook receiver on loopback, on a runtime of its own: its URL and what it was sent.
fn receiver() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(seen.clone());
    let url = format!("{}/hook", common::serve_on_a_thread(app));
    (url, seen)
}

struct StateDir(PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `countersign ARGS` over `state`, posting its notices to `webhook`: what it printed, once it
/// succeeded.
fn countersign(state: &Path, webhook: &str, args: &[&str]) -> String {
    let mut command = common::countersign(state);
    command
        .args(args)
        .env("COUNTERSIGN_STORE", "embedded")
        .env("COUNTERSIGN_WEBHOOKS", webhook);
    String::from_utf8(stdout_of(&mut command, &format!("{args:?}"))).unwrap()
}

#[test]
fn given_a_webhook_when_the_agent_pauses_then_the_notice_is_posted_and_the_audit_shows_it() {
    let (url, seen) = receiver();
    let state = StateDir(fresh_path("countersign-notices"));

    let run: Value =
        serde_json::from_str(&countersign(&state.0, &url, &["agent", "c-102", "--json"])).unwrap();

    assert_eq!(run["status"], "awaiting_approval");
    let approval = run["approvals"][0]["id"].as_str().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one notice");
    let (headers, body) = &seen[0];
    assert!(
        headers["idempotency-key"]
            .to_str()
            .unwrap()
            .starts_with("ob-")
    );
    assert_eq!(body["countersign"]["approval_id"], approval);
    assert!(body["text"].as_str().unwrap().contains("reimburse"));

    let run_id = run["run_id"].as_str().unwrap();
    let host = url.trim_start_matches("http://").trim_end_matches("/hook");
    let text = countersign(&state.0, &url, &["audit", run_id]);
    let line = text
        .lines()
        .find(|l| l.contains(" notified "))
        .unwrap_or_else(|| panic!("no notified line in:\n{text}"));
    assert!(
        line.contains(&format!("approval_requested for {approval} sent to {host}")),
        "{line}"
    );
    let paused = text.lines().position(|l| l.contains(" paused ")).unwrap();
    let notified = text.lines().position(|l| l.contains(" notified ")).unwrap();
    assert_eq!(notified, paused + 1, "in order with the rest:\n{text}");

    let history: Value =
        serde_json::from_str(&countersign(&state.0, &url, &["audit", run_id, "--json"])).unwrap();
    let notified = item_where(&history["entries"], "event", "notified");
    assert_eq!(notified["approval_id"], approval);
    assert_eq!(notified["notice"], "approval_requested");
    assert_eq!(notified["destination"], host);
    assert_eq!(notified["actor"]["component"], "notifier");
}
