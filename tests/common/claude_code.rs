//! Claude Code's side of the hook's tests: the shipped claude-code agent over a fresh state, a
//! reviewer who polls for what waits, and a scripted Anthropic Messages API that streams, as
//! the real `claude` CLI asks it to.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::Countersign;

/// The shipped claude-code agent's directory: its definition, policy, rules and people.
pub fn claude_code_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/claude-code").to_string()
}

/// A fresh state with the shipped claude-code agent and its people loaded.
pub fn harness(name: &str) -> Countersign {
    harness_over(name, &claude_code_dir())
}

/// A fresh state with the agent of the directory `agent` and its people loaded.
pub fn harness_over(name: &str, agent: &str) -> Countersign {
    Countersign::fresh(name).with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", agent.to_string()),
        ("COUNTERSIGN_PEOPLE", format!("{agent}/people.toml")),
    ])
}

/// The one approval waiting, once a hook has proposed its call: polled, as a reviewer would.
pub fn waiting_approval(cs: &Countersign) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = cs.ok(&["review", "--as", "lin"]);
        if let Some(approval) = listed["approvals"].as_array().and_then(|a| a.first()) {
            return approval.clone();
        }
        assert!(Instant::now() < deadline, "no approval appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// lin, the lead, approves the approval `id` from another process.
pub fn lead_approves(cs: &Countersign, id: &str) {
    cs.ok(&["review", "approve", id, "--as", "lin"]);
}

/// lin, the lead, rejects the approval `id` from another process, saying `reason`.
pub fn lead_rejects(cs: &Countersign, id: &str, reason: &str) {
    cs.ok(&["review", "reject", id, "--as", "lin", "--reason", reason]);
}

/// An Anthropic Messages API that plays a model asking for one Bash call: its first turn is
/// that `tool_use`, every turn after a tool result is the text "Done.". It answers only
/// streamed requests (`"stream": true`, as Claude Code sends them) with the API's server-sent
/// events, and remembers each request's body.
#[derive(Clone)]
pub struct ScriptedMessages {
    tool_use_id: String,
    command: String,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl ScriptedMessages {
    /// A model that asks to run `command` with Bash, as the call `tool_use_id`.
    pub fn asking_bash(tool_use_id: &str, command: &str) -> Self {
        Self {
            tool_use_id: tool_use_id.into(),
            command: command.into(),
            seen: Arc::default(),
        }
    }

    /// Serves it on loopback: the base URL for `ANTHROPIC_BASE_URL`.
    pub fn serve(&self) -> String {
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .with_state(self.clone());
        super::serve_on_a_thread(app)
    }

    /// The request bodies it was sent, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// Every `tool_result` block it was sent, in order.
    pub fn tool_results(&self) -> Vec<Value> {
        self.requests()
            .iter()
            .filter_map(|body| body["messages"].as_array()?.last().cloned())
            .filter_map(|last| last["content"].as_array().cloned())
            .flatten()
            .filter(|block| block["type"] == "tool_result")
            .collect()
    }

    /// The turn to stream after `body`'s messages, as the API's content blocks.
    fn next_turn(&self, body: &Value) -> (Value, &'static str) {
        let after_a_result = body["messages"]
            .as_array()
            .and_then(|messages| messages.last())
            .and_then(|last| last["content"].as_array())
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
        if after_a_result {
            (json!({"type": "text", "text": "Done."}), "end_turn")
        } else {
            let input = json!({"command": self.command, "description": "Append a line"});
            (
                json!({"type": "tool_use", "id": self.tool_use_id, "name": "Bash", "input": input}),
                "tool_use",
            )
        }
    }
}

async fn messages(State(script): State<ScriptedMessages>, body: axum::Json<Value>) -> Response {
    script.seen.lock().unwrap().push(body.0.clone());
    if body["stream"] != true {
        let refused = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "this script answers streamed requests only"}});
        return (StatusCode::BAD_REQUEST, axum::Json(refused)).into_response();
    }
    let (block, stop_reason) = script.next_turn(&body);
    let (start, delta) = match block["type"].as_str() {
        Some("tool_use") => (
            json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        ),
        _ => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": block["text"]}),
        ),
    };
    let message = json!({
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": body["model"],
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    });
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": message}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": start}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let stream: String = events
        .iter()
        .map(|(event, data)| format!("event: {event}\ndata: {data}\n\n"))
        .collect();
    ([(header::CONTENT_TYPE, "text/event-stream")], stream).into_response()
}
