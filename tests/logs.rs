//! What `countersign` writes to stderr, as a real process whose stderr is a pipe: every field and
//! message it logs escaped on its own line, so what a model API or an upstream MCP server sends
//! (a carriage return, an ANSI sequence) can neither forge a line ("approved by policy") nor
//! colour one; and no colour of its own, as stderr is not a terminal.

mod common;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};

use common::Countersign;
use common::agents::TempDir;

/// What is sent to forge a log line: back to the line's start, the line cleared, then green.
const FORGED: &str = "\r\u{1b}[2K\u{1b}[32mINFO the bonus was approved by policy";
/// [`FORGED`] as the log shows it.
const FORGED_ESCAPED: &str = r"\r\u{1b}[2K\u{1b}[32mINFO the bonus was approved by policy";

const SCRIPT: &str = "[[turns]]\nsay = \"Nothing to pay.\"\n";

type Answers = Arc<Mutex<VecDeque<(u16, Value)>>>;

async fn answer(State(answers): State<Answers>) -> (StatusCode, axum::Json<Value>) {
    let (status, body) = answers.lock().unwrap().pop_front().expect("an answer left");
    (StatusCode::from_u16(status).unwrap(), axum::Json(body))
}

/// A Chat Completions stand-in that gives `answers` in turn: its base URL.
fn chat_completions(answers: Vec<(u16, Value)>) -> String {
    let answers: Answers = Arc::new(Mutex::new(answers.into()));
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(answers);
    format!("{}/v1", common::serve_on_a_thread(app))
}

/// The bonuses agent in `definitions`, its `agent.toml` changed by `change`; a harness whose
/// processes run it, logging at `log`.
fn bonuses(
    definitions: &TempDir,
    name: &str,
    log: &str,
    change: impl FnOnce(String) -> String,
) -> Countersign {
    let dir = definitions.bonuses_agent(SCRIPT);
    let file = Path::new(&dir).join("agent.toml");
    let written = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, change(written)).unwrap();
    Countersign::fresh(name).with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_AGENTS", dir),
        ("COUNTERSIGN_PEOPLE", definitions.people()),
        ("RUST_LOG", log.to_string()),
    ])
}

/// `stderr` holds no carriage return and no escape character, raw: only their escapes.
#[track_caller]
fn assert_escaped(stderr: &str) {
    assert!(!stderr.contains(['\r', '\u{1b}']), "{stderr:?}");
}

#[test]
fn a_model_apis_control_characters_reach_the_warn_log_escaped_and_uncoloured() {
    let api = chat_completions(vec![
        (
            500,
            json!({"error": {"message": format!("overloaded{FORGED}")}}),
        ),
        (
            200,
            json!({"choices": [{"message": {"role": "assistant", "content": "Nothing to pay."}, "finish_reason": "stop"}]}),
        ),
    ]);
    let definitions = TempDir::new("logs-model");
    let openai =
        format!("provider = \"openai\"\nid = \"gpt-4o\"\nbase_url = \"{api}\"\napi_key_env = \"\"");
    let cs = bonuses(&definitions, "logs-model", "warn", |agent| {
        agent.replace(
            "provider = \"scripted\"\noffline = \"script.toml\"",
            &openai,
        )
    });

    let ran = cs.run(&["run", "--agent", "bonuses", "Pay nobody.", "--as", "sam"]);

    assert_eq!(ran.exit, 0, "{}", ran.stderr);
    assert_eq!(ran.json["answer"], "Nothing to pay.", "{}", ran.json);
    let warned = ran
        .stderr
        .lines()
        .find(|line| line.contains("model call failed; trying again"))
        .unwrap_or_else(|| panic!("the retry is logged: {:?}", ran.stderr));
    assert!(
        warned.contains(&format!("overloaded{FORGED_ESCAPED}")),
        "{warned}"
    );
    assert_escaped(&ran.stderr);
}

#[test]
fn an_upstreams_stderr_reaches_the_log_and_the_error_escaped() {
    let definitions = TempDir::new("logs-upstream");
    // The shell's printf turns `\r` and `\033` into the characters themselves.
    let said = FORGED.replace('\r', "\\\\r").replace('\u{1b}', "\\\\033");
    let upstream = format!(
        "\n[mcp.notes]\ncommand = \"sh\"\n\
         args = [\"-c\", \"printf 'None of the specified directories are accessible{said}\\\\n' >&2; exit 1\"]\n\
         tools = \"*\"\n"
    );
    let cs = bonuses(&definitions, "logs-upstream", "info", |agent| {
        agent + &upstream
    });

    let ran = cs.run(&["run", "--agent", "bonuses", "Pay nobody.", "--as", "sam"]);

    assert_ne!(ran.exit, 0, "{}", ran.stderr);
    let logged = ran
        .stderr
        .lines()
        .find(|line| line.contains("INFO") && line.contains("server=notes"))
        .unwrap_or_else(|| panic!("the upstream's stderr is logged: {:?}", ran.stderr));
    let words = format!("None of the specified directories are accessible{FORGED_ESCAPED}");
    assert!(logged.contains(&words), "{logged}");
    // The refusal says why in the server's own words, with no RUST_LOG needed.
    let error = ran
        .stderr
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("the refusal is printed: {:?}", ran.stderr));
    // The transport's reason depends on when the pipe closed: a closed connection or a
    // broken pipe.
    assert!(
        error.contains("the MCP server notes is unreachable: "),
        "{error}"
    );
    assert!(
        error.ends_with(&format!("; its stderr said: {words}")),
        "{error}"
    );
    assert_escaped(&ran.stderr);
}
