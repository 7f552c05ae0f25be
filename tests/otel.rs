//! OpenTelemetry traces from real `countersign` processes to a real OTLP/HTTP receiver on
//! loopback (tests/otlp_receiver.py, decoding with PyPI's `opentelemetry-proto`, pinned in
//! tests/otlp-receiver.requirements.txt): what arrives when an endpoint is set, nothing when
//! none is, and a collector that cannot be reached changes no command's output.
//!
//! The receiver is installed once under `${XDG_CACHE_HOME:-~/.cache}/countersign`
//! (`otlp-receiver-venv`), as scripts/test-all installs it.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::server::{Server, approve};
use common::{Countersign, fresh_path, listening_url};
use serde_json::Value;

const RECEIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp_receiver.py");
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/otlp-receiver.requirements.txt"
);
/// Where the SDK sends traces when no endpoint is set.
const SDK_DEFAULT_PORT: &str = "4318";

fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        common::pinned_python("otlp-receiver-venv", REQUIREMENTS, "opentelemetry-proto")
    })
}

/// The receiver, running; stopped when dropped.
struct Receiver {
    child: Child,
    base: String,
    received: PathBuf,
}

impl Receiver {
    /// On a free port.
    fn start() -> Self {
        Self::start_on(&[])
    }

    /// On the port the SDK sends to by default.
    fn start_on_the_sdk_default() -> Self {
        Self::start_on(&[SDK_DEFAULT_PORT])
    }

    fn start_on(port: &[&str]) -> Self {
        let received = fresh_path("otlp-received");
        let mut child = Command::new(python())
            .arg(RECEIVER)
            .arg(&received)
            .args(port)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the receiver starts");
        let what = format!("the OTLP receiver (on port {port:?}, which must be free)");
        let base = listening_url(&mut child, &what, Duration::from_secs(30));
        Self {
            child,
            base,
            received,
        }
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.received).unwrap_or_default();
        let spans: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        for span in &spans {
            assert!(span.get("undecodable").is_none(), "{span}");
        }
        spans
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.received);
    }
}

/// The one request span for `method path`.
#[track_caller]
fn request_span<'a>(spans: &'a [Value], method: &str, path: &str) -> &'a Value {
    let found: Vec<&Value> = spans
        .iter()
        .filter(|s| s["attributes"]["method"] == method && s["attributes"]["path"] == path)
        .collect();
    assert_eq!(found.len(), 1, "one {method} {path} span in {spans:#?}");
    found[0]
}

/// `countersign serve` on a free port, not sweeping, with the variables `env`.
fn serve(name: &str, env: &[(&str, String)]) -> Server {
    Server::start_with_env(name, &["--sweep-every", "0s"], env)
}

/// Stops `server` as a service manager does (SIGTERM); it must exit cleanly.
async fn stop(mut server: Server) {
    server.terminate();
    assert!(server.exited(Duration::from_secs(30)).await.success());
}

/// A span's attribute as text, whether it went out as a string or a number.
fn attribute(span: &Value, key: &str) -> String {
    match &span["attributes"][key] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The spans whose parent is `parent`, in its trace.
fn children_of<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["parent_span_id"] == parent["span_id"] && s["trace_id"] == parent["trace_id"])
        .collect()
}

#[tokio::test]
async fn given_an_endpoint_when_serve_runs_a_lifecycle_and_stops_then_its_spans_arrive_linked_the_callers_trace_continued()
 {
    let receiver = Receiver::start();
    let server = serve(
        "otel-lifecycle",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base.clone())],
    );
    let paused = server.paused_run("ben", "c-102", None).await;
    // A gate client's trace: its decision joins it.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let decided = server
        .http
        .post(format!(
            "{}/approvals/{}/decisions",
            server.base, paused.approval
        ))
        .bearer_auth(server.token("dana"))
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&approve("dana-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200);
    let settled = server.settled("ben", &paused.run).await;
    assert_eq!(settled.json["status"], "done", "{}", settled.json);

    stop(server).await;

    let spans = receiver.spans();
    assert!(
        spans.iter().all(|s| s["service"] == "countersign"),
        "{spans:#?}"
    );
    let started = request_span(&spans, "POST", "/runs");
    assert_eq!(started["name"], "request");
    assert_eq!(attribute(started, "status"), "202");
    assert_eq!(
        started["parent_span_id"], "",
        "a request without a traceparent starts a trace"
    );
    assert!(
        !children_of(&spans, started).is_empty(),
        "the engine's spans under POST /runs: {spans:#?}"
    );
    let decision = request_span(
        &spans,
        "POST",
        &format!("/approvals/{}/decisions", paused.approval),
    );
    assert_eq!(attribute(decision, "status"), "200");
    assert_eq!(attribute(decision, "route"), "/approvals/{id}/decisions");
    assert_eq!(decision["trace_id"], trace_id);
    assert_eq!(decision["parent_span_id"], caller_span);
    assert!(
        !children_of(&spans, decision).is_empty(),
        "the engine's spans under the decision: {spans:#?}"
    );
}

#[test]
fn given_an_endpoint_when_a_cli_run_ends_then_its_trace_arrives_before_the_command_exits_and_its_log_stays_quiet()
 {
    let receiver = Receiver::start();
    let cs = Countersign::fresh("otel-cli").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("{}/v1/traces", receiver.base),
        ),
        ("OTEL_SERVICE_NAME", "countersign-laptop".into()),
    ]);

    let ran = cs.run(&["agent", "c-102"]);

    assert_eq!(ran.exit, 0, "{}", ran.stderr);
    assert!(
        !ran.stderr.contains("INFO"),
        "the log on stderr is as quiet as without traces: {}",
        ran.stderr
    );
    let run = ran.json["run_id"].as_str().unwrap();
    let spans = receiver.spans();
    let command = spans
        .iter()
        .find(|s| s["name"] == "countersign agent")
        .unwrap_or_else(|| panic!("the command's span in {spans:#?}"));
    assert_eq!(command["parent_span_id"], "", "the root of its trace");
    assert_eq!(command["service"], "countersign-laptop");
    let children = children_of(&spans, command);
    assert!(
        children.iter().any(|s| s["attributes"]["run_id"] == run),
        "the run's span under the command's: {spans:#?}"
    );
}

#[tokio::test]
async fn given_no_endpoint_when_serve_and_the_cli_run_a_lifecycle_then_nothing_is_sent_even_where_the_sdk_sends_by_default()
 {
    let receiver = Receiver::start_on_the_sdk_default();
    let server = serve("otel-off", &[("OTEL_SERVICE_NAME", "countersign".into())]);
    let paused = server.paused_run("ben", "c-102", None).await;
    server.dana_approves(&paused.approval).await;
    let cs = Countersign::fresh("otel-off-cli");
    cs.ok(&["agent", "c-102"]);

    stop(server).await;

    assert_eq!(receiver.spans(), Vec::<Value>::new());
}

/// A collector that takes connections and never answers.
fn silent_collector() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base)
}

#[test]
fn given_a_collector_that_is_down_or_silent_when_a_run_ends_then_its_output_and_exit_are_as_without_and_it_is_not_held_up()
 {
    let (_silent, silent) = silent_collector();
    let down = format!("http://127.0.0.1:{}", common::free_port());
    let without = Countersign::fresh("otel-without").run(&["agent", "c-102"]);
    assert_eq!(without.exit, 0, "{}", without.stderr);

    for endpoint in [down, silent] {
        let cs = Countersign::fresh("otel-unreachable").with_env(vec![
            ("COUNTERSIGN_STORE", "embedded".into()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            // Longer than the command may take: the exit does not wait on the exporter.
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000".into()),
        ]);
        let started = Instant::now();
        let with = cs.run(&["agent", "c-102"]);
        let took = started.elapsed();

        assert_eq!(with.exit, 0, "{endpoint}: {}", with.stderr);
        assert_eq!(with.json["status"], without.json["status"], "{endpoint}");
        assert_eq!(
            with.json.as_object().unwrap().keys().collect::<Vec<_>>(),
            without.json.as_object().unwrap().keys().collect::<Vec<_>>()
        );
        assert!(took < Duration::from_secs(15), "{endpoint}: took {took:?}");
        assert_eq!(
            with.stderr.matches("WARN").count(),
            1,
            "{endpoint}: said once: {}",
            with.stderr
        );
    }
}

#[test]
fn given_a_collector_that_is_down_when_a_hook_answers_then_its_stdout_is_its_answer_alone() {
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/claude-code");
    let down = format!("http://127.0.0.1:{}", common::free_port());
    let event = serde_json::json!({
        "session_id": "abc123",
        "transcript_path": "/home/user/.claude/projects/p/s.jsonl",
        "cwd": "/home/user/my-project",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "npm test"},
        "tool_use_id": "toolu_otel"
    });
    let state = fresh_path("countersign-otel-hook");
    let output = {
        let mut hook = common::countersign(&state)
            .args(["hook", "claude-code", "--as", "dev-bot"])
            .env("COUNTERSIGN_STORE", "embedded")
            .env("COUNTERSIGN_AGENTS", agent)
            .env("COUNTERSIGN_PEOPLE", format!("{agent}/people.toml"))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &down)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the hook starts");
        use std::io::Write as _;
        hook.stdin
            .take()
            .unwrap()
            .write_all(event.to_string().as_bytes())
            .unwrap();
        hook.wait_with_output().unwrap()
    };
    let _ = std::fs::remove_dir_all(&state);

    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    assert!(
        stderr.contains("cannot export traces over OTLP"),
        "the failure is said on stderr: {stderr}"
    );
}

#[test]
fn given_a_grpc_protocol_or_an_endpoint_that_is_no_url_when_a_command_starts_then_it_is_refused_as_bad_usage()
 {
    for (variable, value, saying) in [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: countersign exports traces over http/protobuf only",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "not a url",
            "cannot export traces over OTLP",
        ),
    ] {
        let cs = Countersign::fresh("otel-refused").with_env(vec![
            ("COUNTERSIGN_STORE", "embedded".into()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:4318".into(),
            ),
            (variable, value.into()),
        ]);

        cs.refuses(&["agent", "c-102"], &[saying]);
        assert!(!cs.state().exists(), "{variable}: nothing was written");
    }
}
