//! The four functions as Lambda runs them, locally: `cargo lambda watch` emulates the Lambda
//! runtime API in front of the real binaries, over a table and FIFO queue of this test's own on
//! the local AWS stack. HTTP goes to the start and decide functions through function URLs (no
//! authorizer there, so they accept development tokens); the resume and sweep functions are
//! invoked with `cargo lambda invoke`, the resume function with the queue's real messages.
//! What the functions print on stdout is read back for their metric lines.

#[path = "../shared/tests/support/aws.rs"]
mod aws;
mod common;

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const SQS_BATCH: &str = include_str!("../functions/resume/tests/fixtures/sqs-fifo-batch.json");

/// `cargo lambda watch`, stopped with its functions when dropped.
struct Watch {
    child: Child,
    port: u16,
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Stop the watcher's process group; the watcher stops the functions it started.
        common::stop_group(&mut self.child, "TERM");
    }
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cargo_lambda_available() {
    let found = Command::new("cargo")
        .args(["lambda", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "cargo lambda is not on PATH: pip install cargo-lambda==1.9.2 (scripts/test-all installs it under ~/.cache/countersign)"
    );
}

/// `cargo lambda watch` over `stack`, the functions' stdout (their metric lines) into `printed`.
fn watch(stack: &aws::FreshStack, key_file: &Path, printed: &Path) -> Watch {
    use std::os::unix::process::CommandExt;
    cargo_lambda_available();
    let port = common::free_port();
    let child = Command::new("cargo")
        .args([
            "lambda",
            "watch",
            "--invoke-address",
            "127.0.0.1",
            "--invoke-port",
            &port.to_string(),
            "--ignore-changes",
        ])
        .current_dir(workspace())
        .envs(stack.env())
        .env("COUNTERSIGN_DEV_JWT_KEY_FILE", key_file)
        .env_remove("ANTHROPIC_API_KEY")
        // The shipped definitions: the local stack's exports name the Lambda's packaged path.
        .env_remove("COUNTERSIGN_AGENTS")
        .stdout(std::fs::File::create(printed).expect("a file for the functions' stdout"))
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .expect("cargo lambda watch starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "cargo lambda watch did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Watch { child, port }
}

/// A development token from `countersign token`, signed with the state's key.
fn token(state: &Path, person: &str) -> String {
    let printed = common::stdout_of(
        Command::new(env!("CARGO_BIN_EXE_countersign"))
            .args(["token", "--as", person, "--state"])
            .arg(state),
        "countersign token",
    );
    String::from_utf8(printed).unwrap().trim().to_string()
}

/// `cargo lambda invoke <function>` with an event, as the README shows.
fn invoke(watch: &Watch, function: &str, event: &Value) -> Value {
    let file = std::env::temp_dir().join(format!(
        "countersign-event-{}-{function}.json",
        std::process::id()
    ));
    std::fs::write(&file, event.to_string()).unwrap();
    let what = format!("invoking {function}");
    let printed = common::stdout_of(
        Command::new("cargo")
            .args([
                "lambda",
                "invoke",
                function,
                "--invoke-address",
                "127.0.0.1",
                "--invoke-port",
            ])
            .arg(watch.port.to_string())
            .arg("--data-file")
            .arg(&file)
            .args(["--output-format", "json"])
            .current_dir(workspace()),
        &what,
    );
    let _ = std::fs::remove_file(file);
    serde_json::from_slice(&printed).unwrap()
}

struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    fn new(watch: &Watch) -> Self {
        // The first request to each function waits for it to compile.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(900))
            .build()
            .unwrap();
        Self {
            client,
            base: format!("http://127.0.0.1:{}/lambda-url", watch.port),
        }
    }

    /// `POST /runs` on the start function with `body`, which must accept a run; the resume
    /// function drives it from the queue's drive message: the run as the decide function's
    /// `GET /runs/{id}` then gives it.
    async fn start_run(
        &self,
        stack: &aws::FreshStack,
        watch: &Watch,
        token: &str,
        body: Value,
    ) -> Value {
        let (status, accepted) = self.call("POST", "start/runs", token, Some(body)).await;
        assert_eq!(status, 202, "{accepted}");
        assert_eq!(accepted["status"], "running", "{accepted}");
        let response = resume_from_queue(stack, watch).await;
        assert_eq!(response["batchItemFailures"], json!([]));
        let path = format!("decide/runs/{}", accepted["run_id"].as_str().unwrap());
        let (status, run) = self.call("GET", &path, token, None).await;
        assert_eq!(status, 200, "{run}");
        run
    }

    /// The decision `id` to approve version 1 of `approval`, sent to the decide function.
    async fn approve(&self, approval: &str, token: &str, id: &str) -> (u16, Value) {
        let path = format!("decide/approvals/{approval}/decisions");
        let decision = json!({"decision_id": id, "action_version": 1, "choice": "approve"});
        self.call("POST", &path, token, Some(decision)).await
    }

    async fn call(
        &self,
        method: &str,
        function_path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}/{function_path}", self.base);
        let request = match method {
            "GET" => self.client.get(url),
            _ => self.client.post(url),
        };
        let request = request.bearer_auth(token);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// What the SQS event source does: receive the queue's messages and hand them to the resume
/// function as one batch, then delete what it did not report as failed.
async fn resume_from_queue(stack: &aws::FreshStack, watch: &Watch) -> Value {
    let queue = stack.aws().queue;
    let mut received = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.is_empty() && Instant::now() < deadline {
        received = queue.receive(10, Duration::from_secs(1)).await.unwrap();
    }
    assert!(
        !received.is_empty(),
        "a resume or drive message is on the queue"
    );
    let mut event: Value = serde_json::from_str(SQS_BATCH).unwrap();
    let template = event["Records"][0].clone();
    event["Records"] = received
        .iter()
        .map(|m| {
            let mut record = template.clone();
            record["messageId"] = json!(m.message_id);
            record["receiptHandle"] = json!(m.receipt_handle);
            record["body"] = json!(serde_json::to_string(m.message.as_ref().unwrap()).unwrap());
            record
        })
        .collect();
    let response = tokio::task::block_in_place(|| invoke(watch, "resume", &event));
    let failed = common::texts(&response["batchItemFailures"], "itemIdentifier");
    for message in &received {
        if !failed.contains(&message.message_id.as_str()) {
            queue.delete(&message.receipt_handle).await.unwrap();
        }
    }
    response
}

/// One `cargo lambda watch` for both flows: the functions compile once.
#[tokio::test(flavor = "multi_thread")]
async fn under_cargo_lambda_watch_the_functions_take_claims_through_approval_and_expiry() {
    let stack = aws::FreshStack::new("lambda-watch").await;
    let state = common::fresh_path("countersign-watch-flow");
    token(&state, "dana"); // creates the state's development key before the functions read it
    let printed = state.join("functions.out");
    let watch = watch(&stack, &state.join("dev-jwt.key"), &printed);
    let http = Http::new(&watch);
    approval_flow(&stack, &state, &watch, &http).await;
    expiry_flow(&stack, &state, &watch, &http).await;
    metric_lines_printed(&printed);
    let _ = std::fs::remove_dir_all(state);
}

/// What the functions printed in CloudWatch's Embedded Metric Format over both flows: each line
/// valid, the decision and the expiry counted, the payment's run, and the sweep's gauges.
fn metric_lines_printed(printed: &Path) {
    let text = std::fs::read_to_string(printed).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|line| line.find("{\"_aws\"").map(|at| &line[at..]))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for line in &lines {
        assert_eq!(shared::adapters::emf::rule_broken(line), None);
    }
    let of = |metric: &str, outcome: &str| {
        lines
            .iter()
            .filter(|l| l.get(metric).is_some() && l["outcome"] == outcome)
            .count()
    };
    assert_eq!(of("countersign_decisions_total", "approved"), 1, "{text}");
    assert_eq!(of("countersign_decisions_total", "expired"), 1, "{text}");
    assert!(
        of("countersign_executions_total", "succeeded") >= 1,
        "{text}"
    );
    let gauges: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("countersign_approvals_waiting").is_some())
        .collect();
    assert!(
        gauges.iter().any(|g| g["agent"] == "expense"),
        "the sweep printed the gauges: {text}"
    );
}

/// Start, pause, a refused self-approval, an approval by another reviewer, resume from the
/// queue's real message, done.
async fn approval_flow(stack: &aws::FreshStack, state: &Path, watch: &Watch, http: &Http) {
    let ben = token(state, "ben");
    let (dana, erin) = (token(state, "dana"), token(state, "erin"));

    // Start: accepted at once, then driven from the queue; the run pauses on reimbursing $250.
    let run = http
        .start_run(stack, watch, &ben, json!({"claim_id": "c-102"}))
        .await;
    assert_eq!(run["status"], "awaiting_approval");
    let approval = run["approvals"][0]["id"].as_str().unwrap().to_string();
    let run_id = run["run_id"].as_str().unwrap().to_string();

    let (status, listed) = http.call("GET", "decide/approvals", &dana, None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["approvals"][0]["id"], approval.as_str());

    let (status, refused) = http.approve(&approval, &ben, "d-ben").await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (403, Some("own_request"))
    );

    let (status, decided) = http.approve(&approval, &dana, "d-dana").await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["approval"]["status"], "approved");

    // The resume function takes the queue's real message; the run finishes and pays once.
    let response = resume_from_queue(stack, watch).await;
    assert_eq!(response["batchItemFailures"], json!([]));
    let (status, audit) = http
        .call("GET", &format!("decide/runs/{run_id}/audit"), &erin, None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(audit["run"]["status"], "done", "{audit}");
    let executed: Vec<&Value> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "executed")
        .collect();
    assert_eq!(executed.last().unwrap()["authorized_by"][0]["id"], "dana");

    let (status, late) = http.approve(&approval, &erin, "d-erin").await;
    assert_eq!(
        (status, late["error"]["code"].as_str()),
        (409, Some("already_decided"))
    );
}

/// An approval left to expire: the sweep expires it, the resume function tells the run.
async fn expiry_flow(stack: &aws::FreshStack, state: &Path, watch: &Watch, http: &Http) {
    let (chen, dana) = (token(state, "chen"), token(state, "dana"));

    let run = http
        .start_run(
            stack,
            watch,
            &chen,
            json!({"claim_id": "c-104", "ttl": "0s"}),
        )
        .await;
    let approval = run["approvals"][0]["id"].as_str().unwrap().to_string();

    let swept = tokio::task::block_in_place(|| {
        invoke(
            watch,
            "sweep",
            &json!({"source": "countersign.scheduler", "wake": "sweep"}),
        )
    });
    assert_eq!(swept["expired"], json!([approval]));

    let response = resume_from_queue(stack, watch).await;
    assert_eq!(response["batchItemFailures"], json!([]));
    let (_, audit) = http
        .call(
            "GET",
            &format!("decide/runs/{}/audit", run["run_id"].as_str().unwrap()),
            &dana,
            None,
        )
        .await;
    assert_eq!(audit["run"]["status"], "done");
    assert!(
        audit["run"]["answer"].as_str().unwrap().contains("expired"),
        "{audit}"
    );
    let payment = audit["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["tool"] == "reimburse")
        .unwrap();
    assert_eq!(payment["status"], "expired", "the payment never ran");
}
