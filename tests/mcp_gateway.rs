//! The MCP gateway driven by clients nobody here wrote: the official MCP Python SDK (`mcp` from
//! PyPI, pinned in tests/mcp-client.requirements.txt) through tests/mcp_client.py, the official
//! TypeScript SDK (the one the reference servers pinned in tests/npm/servers are built on)
//! through tests/mcp_client.mjs, and the MCP Inspector's CLI mode (npm, pinned in
//! tests/npm/inspector), against `countersign mcp` over stdio and `/mcp/refunds` on a real
//! `countersign serve`, in front of the refunds agent and a real orders service. Decisions come
//! from `countersign review` in other processes.
//!
//! The clients are installed once under `${XDG_CACHE_HOME:-~/.cache}/countersign` (PyPI and npm
//! the first time, offline after): the Python client in `mcp-client-venv`
//! (`COUNTERSIGN_MCP_PYTHON` names another Python that has it), the Inspector in
//! `mcp-inspector`, the TypeScript SDK with the reference servers in `mcp-servers`.

mod common;
#[allow(dead_code)]
#[path = "../shared/tests/support/mcp_servers.rs"]
mod mcp_servers;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::orders::OrdersService;
use common::{Countersign, stop_group};
use serde_json::{Value, json};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
const TS_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.mjs");
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/mcp-client.requirements.txt"
);

/// The refund policy puts before a finance manager (above USD 100).
fn refund_125() -> Value {
    json!({"order_id": "ord_55", "amount_cents": 12_500, "currency": "USD", "reason": "damaged_item"})
}

/// A `tools/call` step of issue_refund for USD 125, waiting at most `wait_seconds`.
fn ask_refund(wait_seconds: f64) -> Value {
    json!({"op": "call", "tool": "issue_refund", "args": refund_125(), "wait_seconds": wait_seconds})
}

/// The Python that has the pinned client, installed on first use.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| match std::env::var_os("COUNTERSIGN_MCP_PYTHON") {
        Some(python) => PathBuf::from(python),
        None => common::pinned_python("mcp-client-venv", REQUIREMENTS, "mcp"),
    })
}

/// `mcp-inspector --cli ARGS`, which must succeed: the JSON it printed.
#[track_caller]
fn inspect(args: &[String]) -> Value {
    let output = Command::new(mcp_servers::inspector())
        .arg("--cli")
        .args(args)
        .output()
        .expect("the Inspector runs");
    assert!(
        output.status.success(),
        "the Inspector failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the Inspector prints JSON")
}

/// How the client reaches the gateway, and what its processes get.
struct Gateway {
    transport: Vec<String>,
    env: Vec<(&'static str, String)>,
}

impl Gateway {
    /// `countersign mcp --agent refunds --as PERSON`, spawned by the client, over `cs`'s state.
    fn stdio(cs: &Countersign, person: &str) -> Self {
        Self::stdio_for(cs, "refunds", person)
    }

    /// `countersign mcp --agent AGENT --as PERSON`, spawned by the client, over `cs`'s state.
    fn stdio_for(cs: &Countersign, agent: &str, person: &str) -> Self {
        let mut env = cs.env().to_vec();
        env.push(("COUNTERSIGN_STATE", cs.state().display().to_string()));
        let transport = ["stdio", env!("CARGO_BIN_EXE_countersign"), "mcp"]
            .into_iter()
            .chain(["--agent", agent, "--as", person, "--sweep-every", "0s"])
            .map(String::from)
            .collect();
        Self { transport, env }
    }

    /// `/mcp/refunds` on `server`, with `person`'s token.
    fn http(server: &common::Served, cs: &Countersign, person: &str) -> Self {
        Self::http_for(server, cs, "refunds", person)
    }

    /// `/mcp/AGENT` on `server`, with `person`'s token.
    fn http_for(server: &common::Served, cs: &Countersign, agent: &str, person: &str) -> Self {
        let token = cs.token(person);
        Self {
            transport: vec!["http".into(), format!("{}/mcp/{agent}", server.base), token],
            env: Vec::new(),
        }
    }

    /// The Python SDK's client running `steps`.
    fn command(&self, steps: &Value) -> Command {
        let mut command = Command::new(python());
        command
            .arg(CLIENT)
            .arg(steps.to_string())
            .args(&self.transport);
        self.environment(command)
    }

    /// The TypeScript SDK's client running `steps`, over stdio only.
    fn typescript(&self, steps: &Value) -> Command {
        let [transport, server @ ..] = self.transport.as_slice() else {
            panic!("no transport");
        };
        assert_eq!(
            transport, "stdio",
            "the TypeScript client speaks stdio here"
        );
        let mut command = Command::new("node");
        command
            .arg(TS_CLIENT)
            .arg(mcp_servers::typescript_sdk())
            .arg(steps.to_string())
            .args(server);
        self.environment(command)
    }

    /// `command` with this gateway's variables and none of the shell's Countersign settings,
    /// its output piped.
    fn environment(&self, mut command: Command) -> Command {
        command
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("COUNTERSIGN_AGENTS")
            .env_remove("COUNTERSIGN_PEOPLE")
            .env_remove("COUNTERSIGN_CLAIMS")
            .env_remove("COUNTERSIGN_MCP_WAIT")
            .env_remove("COUNTERSIGN_PUBLIC_URL")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// One session of `steps`: what each answered, after the line saying what was negotiated.
    #[track_caller]
    fn session(&self, steps: Value) -> Vec<Value> {
        let output = self.command(&steps).output().expect("the client runs");
        assert!(
            output.status.success(),
            "the MCP client failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|line| line.get("event").is_none())
            .collect();
        let negotiated = lines.remove(0);
        assert_eq!(negotiated["server"], "countersign", "{negotiated}");
        assert_eq!(lines.len(), steps.as_array().unwrap().len());
        lines
    }

    /// One call, answered.
    #[track_caller]
    fn call(&self, step: Value) -> Value {
        self.session(json!([step])).remove(0)
    }

    /// A session started in the background, in a process group of its own (with the server it
    /// spawns over stdio).
    fn spawn(&self, steps: Value) -> Child {
        use std::os::unix::process::CommandExt;
        self.command(&steps)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the client starts")
    }
}

/// The id of the one approval waiting in `cs`'s state, once there is one.
#[track_caller]
fn waiting_approval(cs: &Countersign) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = cs.ok(&["review"]);
        if let Some(first) = listed["approvals"].as_array().and_then(|a| a.first()) {
            assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
            return first["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no approval opened: {listed}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the answer's `_meta` says at `key`.
fn meta<'a>(answer: &'a Value, key: &str) -> &'a Value {
    &answer["meta"][format!("countersign/{key}")]
}

/// The answer of a call that ran: the refund of `amount_cents` under the key `act-…:version`,
/// made once at the orders service.
#[track_caller]
fn refunded_once(orders: &OrdersService, answer: &Value, version: u64) {
    assert_eq!(meta(answer, "status"), "succeeded", "{answer}");
    assert_eq!(answer["is_error"], false, "{answer}");
    let key = format!("{}:{version}", meta(answer, "action_id").as_str().unwrap());
    let refund = orders.only_refund("ord_55", 12_500, &key);
    let told: Value = serde_json::from_str(answer["text"].as_str().unwrap()).unwrap();
    assert_eq!(told["refund_id"], refund["refund_id"], "{answer}");
}

/// A gated call that waits: nothing has run, and it says who must approve and how to get the
/// outcome.
#[track_caller]
fn waits_for_a_finance_manager(answer: &Value) -> String {
    assert_eq!(meta(answer, "status"), "awaiting_approval", "{answer}");
    assert_eq!(answer["is_error"], false, "{answer}");
    let text = answer["text"].as_str().unwrap();
    assert!(text.starts_with("Nothing has run yet"), "{text}");
    assert!(text.contains("role finance_manager"), "{text}");
    assert!(
        text.contains("Calling the same tool with the same arguments again returns its outcome and never runs it twice"),
        "{text}"
    );
    meta(answer, "approval_id").as_str().unwrap().to_string()
}

#[test]
fn over_stdio_it_says_on_stderr_which_state_and_agents_it_works_on_and_stdout_stays_the_protocols()
{
    // A client starts it in a directory of its own, the state left to its default; the
    // directory's name would colour a terminal.
    let dir = common::fresh_path("mcp-started-\u{1b}[31m");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(dir.is_absolute());

    let started = common::countersign(Path::new("state"))
        .current_dir(&dir)
        .env("COUNTERSIGN_STORE", "embedded")
        .args(["mcp", "--agent", "refunds", "--as", "sam"])
        .stdin(Stdio::null())
        .output()
        .unwrap();

    let told = String::from_utf8_lossy(&started.stderr);
    assert!(
        !told.contains('\u{1b}'),
        "escaped as every log line: {told}"
    );
    let state = dir
        .join("state")
        .display()
        .to_string()
        .replace('\u{1b}', "\\u{1b}");
    assert!(
        told.contains("serving the tools of agent refunds to sam (acme) over stdio"),
        "{told}"
    );
    assert!(
        told.contains(&format!(
            "state {state}; review its calls with: countersign review --state {state}"
        )),
        "{told}"
    );
    assert!(
        told.contains("agents loaded: expense, refunds (the shipped ones"),
        "{told}"
    );
    assert!(started.stdout.is_empty(), "stdout is the protocol's alone");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn over_stdio_a_client_lists_the_tools_and_a_gated_refund_runs_once_after_approval_from_the_cli() {
    let orders = OrdersService::start("mcp-stdio");
    let cs = Countersign::fresh("mcp-stdio").with_env(orders.embedded_env());
    let gateway = Gateway::stdio(&cs, "sam");

    let answers = gateway.session(json!([
        {"op": "list"},
        {"op": "call", "tool": "get_order", "args": {"order_id": "ord_55"}},
        ask_refund(0.0),
    ]));

    let tools = &answers[0]["tools"];
    assert_eq!(common::texts(tools, "name"), ["get_order", "issue_refund"]);
    assert_eq!(tools[1]["input_schema"]["required"][1], "amount_cents");
    assert!(
        tools[1]["description"]
            .as_str()
            .unwrap()
            .contains("a person may have to approve"),
        "{tools}"
    );
    let order = &answers[1];
    assert_eq!(order["is_error"], false, "{order}");
    assert!(
        order["text"]
            .as_str()
            .unwrap()
            .contains("\"refundable_cents\":14900")
    );
    let approval = waits_for_a_finance_manager(&answers[2]);
    assert!(orders.refunds("ord_55").is_empty(), "nothing refunded yet");

    // Sam may not approve his own request; a finance manager does, from another process.
    let own = cs.run(&["review", "approve", &approval, "--as", "sam"]);
    assert_eq!(own.json["error"]["code"], "own_request", "{}", own.json);
    cs.ok(&["review", "approve", &approval, "--as", "mia"]);
    let again = gateway.call(ask_refund(0.0));

    assert_eq!(meta(&again, "attached"), true, "{again}");
    assert_eq!(meta(&again, "run_id"), meta(&answers[2], "run_id"));
    refunded_once(&orders, &again, 1);
    let history = cs.ok(&["audit", meta(&again, "run_id").as_str().unwrap()]);
    assert_eq!(history["run"]["requested_by"], "sam", "{history}");
    assert_eq!(history["run"]["status"], "done", "{history}");
}

#[test]
fn over_http_a_waiting_call_gets_progress_and_the_outcome_once_another_process_approves_and_a_huge_one_is_refused()
 {
    let orders = OrdersService::start("mcp-http");
    let cs = Countersign::fresh("mcp-http").with_env(orders.embedded_env());
    let server = cs.serve();
    let gateway = Gateway::http(&server, &cs, "sam");

    let mut huge = refund_125();
    huge["reason"] = json!("x".repeat(40_000));
    let answers = gateway.session(json!([
        {"op": "list"},
        {"op": "call", "tool": "get_order", "args": {"order_id": "ord_55"}},
        {"op": "call", "tool": "issue_refund", "args": refund_125(), "wait_seconds": 0.5, "progress": true},
        {"op": "call", "tool": "issue_refund", "args": huge},
    ]));

    assert_eq!(
        common::texts(&answers[0]["tools"], "name"),
        ["get_order", "issue_refund"]
    );
    assert_eq!(answers[1]["is_error"], false, "{}", answers[1]);
    let approval = waits_for_a_finance_manager(&answers[2]);
    let progress = answers[2]["progress"].as_array().unwrap();
    assert!(!progress.is_empty(), "{}", answers[2]);
    assert!(
        progress[0]["message"].as_str().unwrap().contains(&approval),
        "{progress:?}"
    );

    // Arguments past the engine's 32 KiB are refused in its words, never put to a person.
    let refused = &answers[3];
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(meta(refused, "status"), "refused", "{refused}");
    assert!(
        refused["text"]
            .as_str()
            .unwrap()
            .contains("the arguments are too large"),
        "{refused}"
    );

    // The same call waits again; mia approves meanwhile; it answers with the refund.
    let answer = approved_while_it_waits(&cs, &gateway, &approval);

    assert_eq!(meta(&answer, "attached"), true, "{answer}");
    refunded_once(&orders, &answer, 1);
}

#[test]
fn the_typescript_sdk_gives_up_on_a_longer_wait_unless_it_resets_its_timeout_on_the_gateways_progress()
 {
    let orders = OrdersService::start("mcp-typescript");
    let cs = Countersign::fresh("mcp-typescript").with_env(orders.embedded_env());
    let gateway = Gateway::stdio(&cs, "sam");
    let refund = |wait_seconds: u64, timeout_ms: u64, reset: bool| {
        json!({"tool": "issue_refund", "args": refund_125(), "wait_seconds": wait_seconds,
               "timeout_ms": timeout_ms, "reset_timeout_on_progress": reset})
    };

    // Each waits on a person longer than the client's timeout; the second resets it on each
    // progress notification, which the gateway sends when the wait begins and every 5 s.
    let printed = common::stdout_of(
        &mut gateway.typescript(&json!([refund(4, 2_000, false), refund(9, 7_000, true)])),
        "the TypeScript client",
    );

    let answers: Vec<Value> = String::from_utf8_lossy(&printed)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let [gave_up, waited] = answers.as_slice() else {
        panic!("two answers: {answers:?}");
    };
    assert_eq!(
        gave_up["error"]["code"], -32001,
        "request timed out: {gave_up}"
    );
    waits_for_a_finance_manager(waited);
    assert!(waited["elapsed_ms"].as_u64().unwrap() >= 8_500, "{waited}");
    let progress = waited["progress"].as_array().unwrap();
    assert!(progress.len() >= 2, "at the start and 5 s in: {waited}");
    assert!(orders.refunds("ord_55").is_empty(), "nothing refunded");
}

/// The refund asked for again through `gateway`, approved by mia from another process once
/// the call is seen waiting (its first progress notification): what it answered.
fn approved_while_it_waits(cs: &Countersign, gateway: &Gateway, approval: &str) -> Value {
    let started = Instant::now();
    let mut step = ask_refund(30.0);
    step["progress"] = json!(true);
    let mut client = gateway
        .command(&json!([step]))
        .spawn()
        .expect("the client starts");
    let mut lines = BufReader::new(client.stdout.take().unwrap())
        .lines()
        .map(|line| serde_json::from_str::<Value>(&line.unwrap()).unwrap());
    assert_eq!(lines.next().unwrap()["server"], "countersign");
    let first = lines.next().expect("the call answers or waits");
    assert_eq!(first["event"], "progress", "the call waits: {first}");
    cs.ok(&["review", "approve", approval, "--as", "mia"]);
    let answer = lines
        .find(|line| line.get("event").is_none())
        .expect("the call answers");
    assert!(client.wait().unwrap().success());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "answered after {took:?}");
    assert!(!answer["progress"].as_array().unwrap().is_empty());
    answer
}

/// `response`, a refusal: its status, its `error.code`, and its `Allow` header if any.
async fn refusal(response: reqwest::Response) -> (u16, String, Option<String>) {
    let status = response.status().as_u16();
    let allow = response
        .headers()
        .get("allow")
        .map(|allow| allow.to_str().unwrap().to_string());
    let body: Value = response.json().await.expect("a JSON refusal");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{body}");
    (
        status,
        body["error"]["code"].as_str().unwrap().to_string(),
        allow,
    )
}

#[tokio::test]
async fn over_http_every_refusal_is_the_apis_json_error_and_a_json_rpc_error_stays_json_rpc() {
    let cs = Countersign::fresh("mcp-http-refused");
    let server = cs.serve();
    let token = cs.token("sam");
    let http = reqwest::Client::new();
    let url = |agent: &str| format!("{}/mcp/{agent}", server.base);
    let (both, json) = ("application/json, text/event-stream", "application/json");
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let huge = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                      "params": {"padding": "x".repeat(70_000)}})
    .to_string();
    let unknown = json!({"jsonrpc": "2.0", "id": 2, "method": "nope/x"}).to_string();
    // A POST of `body` as `content_type` to `agent`'s gateway, accepting `accept`, as sam.
    let post = |agent: &str, accept: &str, content_type: &str, body: &str| {
        http.post(url(agent))
            .bearer_auth(&token)
            .header("accept", accept)
            .header("content-type", content_type)
            .body(body.to_string())
            .send()
    };

    let refused = [
        http.post(url("refunds"))
            .header("accept", both)
            .json(&list)
            .send()
            .await,
        post("payroll", both, json, &list).await,
        http.get(url("refunds")).bearer_auth(&token).send().await,
        post("refunds", json, json, &list).await,
        post("refunds", both, "text/plain", &list).await,
        post("refunds", both, json, "{\"jsonrpc\":").await,
        post("refunds", both, json, r#"{"a": 1}"#).await,
        post("refunds", both, json, &huge).await,
        http.post(url("refunds"))
            .bearer_auth(&token)
            .header("accept", both)
            .header("content-type", json)
            .header("mcp-protocol-version", "1999-01-01")
            .body(list.clone())
            .send()
            .await,
    ];
    let answered = post("refunds", both, json, &unknown).await.unwrap();
    let listed = post("refunds", both, json, &list).await.unwrap();

    let mut refusals = Vec::new();
    for response in refused {
        refusals.push(refusal(response.unwrap()).await);
    }
    let refusal = |status: u16, code: &str| (status, code.to_string(), None);
    assert_eq!(
        refusals,
        [
            refusal(401, "missing_token"),
            refusal(404, "not_found"),
            (405, "method_not_allowed".into(), Some("POST".into())),
            refusal(406, "not_acceptable"),
            refusal(400, "bad_content_type"),
            refusal(400, "malformed_json"),
            refusal(400, "not_json_rpc"),
            refusal(400, "body_too_large"),
            refusal(400, "bad_mcp_request"),
        ]
    );
    // A request the transport took is answered in JSON-RPC, an error too.
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["id"], 2, "{answered}");
    assert_eq!(answered["error"]["code"], -32601, "{answered}");
    assert_eq!(listed.status(), 200);
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(
        listed["result"]["tools"][1]["name"], "issue_refund",
        "{listed}"
    );
}

#[tokio::test]
async fn over_http_an_agent_is_not_found_for_a_tenant_it_does_not_name_as_an_unknown_one_is() {
    let cs = Countersign::fresh("mcp-http-tenants");
    let server = cs.serve();
    // zoe is of globex; the refunds agent names acme only.
    let zoe = cs.token("zoe");
    let http = reqwest::Client::new();
    let post = |agent: &str, method: &str, params: Value| {
        http.post(format!("{}/mcp/{agent}", server.base))
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(&zoe)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
    };
    let call = json!({"name": "issue_refund", "arguments": refund_125()});

    for (agent, method, params) in [
        ("refunds", "tools/list", json!({})),
        ("refunds", "tools/call", call.clone()),
        ("payroll", "tools/list", json!({})),
    ] {
        let answer = post(agent, method, params).await.unwrap();

        assert_eq!(answer.status(), 404, "{agent} {method}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{body}");
        assert_eq!(
            body["error"]["message"],
            format!("agent {agent} was not found"),
            "{body}"
        );
    }
    assert_eq!(
        cs.ok(&["review"])["approvals"],
        json!([]),
        "nothing was proposed"
    );
}

#[test]
fn a_client_that_disconnects_while_its_call_waits_gets_the_outcome_by_calling_again() {
    let orders = OrdersService::start("mcp-disconnect");
    let cs = Countersign::fresh("mcp-disconnect").with_env(orders.embedded_env());
    let gateway = Gateway::stdio(&cs, "sam");

    // The client goes away, and its gateway with it, while the call waits on a person.
    let mut client = gateway.spawn(json!([ask_refund(60.0)]));
    let approval = waiting_approval(&cs);
    stop_group(&mut client, "KILL");

    let again = gateway.call(ask_refund(0.0));
    assert_eq!(
        waits_for_a_finance_manager(&again),
        approval,
        "the same approval"
    );
    assert_eq!(meta(&again, "attached"), true, "{again}");
    cs.ok(&["review", "approve", &approval, "--as", "mia"]);
    let after = gateway.call(ask_refund(0.0));

    refunded_once(&orders, &after, 1);
}

#[test]
fn a_gateway_killed_while_a_call_waits_and_started_again_returns_the_outcome_decided_meanwhile() {
    let orders = OrdersService::start("mcp-restart");
    let cs = Countersign::fresh("mcp-restart").with_env(orders.embedded_env());
    let server = cs.serve();
    let gateway = Gateway::http(&server, &cs, "sam");

    let mut client = gateway.spawn(json!([ask_refund(60.0)]));
    let approval = waiting_approval(&cs);
    server.kill();
    stop_group(&mut client, "KILL");
    cs.ok(&["review", "approve", &approval, "--as", "mia"]);
    let server = cs.serve();
    let gateway = Gateway::http(&server, &cs, "sam");
    let after = gateway.call(ask_refund(0.0));

    assert_eq!(meta(&after, "attached"), true, "{after}");
    refunded_once(&orders, &after, 1);
}

#[test]
fn the_mcp_inspector_lists_and_calls_over_stdio_and_http_and_a_call_attaches_across_them() {
    let orders = OrdersService::start("mcp-inspector");
    let cs = Countersign::fresh("mcp-inspector").with_env(orders.embedded_env());
    let server = cs.serve();
    // As docs/mcp-gateway.md configures it: the state and the agents named, absolute.
    let mut stdio: Vec<String> = cs
        .env()
        .iter()
        .flat_map(|(k, v)| ["-e".to_string(), format!("{k}={v}")])
        .collect();
    let state = cs.state().display().to_string();
    let agents = concat!(env!("CARGO_MANIFEST_DIR"), "/agents");
    stdio.extend(
        [
            env!("CARGO_BIN_EXE_countersign"),
            "mcp",
            "--agent",
            "refunds",
            "--as",
            "sam",
            "--state",
            &state,
            "--agents",
            agents,
        ]
        .map(String::from),
    );
    let token = cs.token("sam");
    let http = vec![
        format!("{}/mcp/refunds", server.base),
        "--transport".into(),
        "http".into(),
        "--header".into(),
        format!("Authorization: Bearer {token}"),
    ];
    let with = |transport: &[String], method: &[&str]| {
        let mut args = transport.to_vec();
        args.extend(method.iter().map(|a| a.to_string()));
        inspect(&args)
    };
    let refund = [
        "--method",
        "tools/call",
        "--tool-name",
        "issue_refund",
        "--tool-arg",
        "order_id=ord_55",
        "amount_cents=12500",
        "currency=USD",
        "reason=damaged_item",
        "--tool-metadata",
        "countersign/wait_seconds=0",
    ];

    let listed = with(&stdio, &["--method", "tools/list"]);
    let order = with(
        &http,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "get_order",
            "--tool-arg",
            "order_id=ord_55",
        ],
    );
    let waiting = with(&stdio, &refund);

    assert_eq!(
        common::texts(&listed["tools"], "name"),
        ["get_order", "issue_refund"]
    );
    assert_eq!(order["isError"], false, "{order}");
    assert_eq!(order["_meta"]["countersign/status"], "succeeded", "{order}");
    assert_eq!(
        waiting["_meta"]["countersign/status"], "awaiting_approval",
        "{waiting}"
    );
    let approval = waiting["_meta"]["countersign/approval_id"]
        .as_str()
        .unwrap();
    cs.ok(&["review", "approve", approval, "--as", "mia"]);
    // The same person's same call, over the other transport: the same call.
    let after = with(&http, &refund);

    assert_eq!(after["_meta"]["countersign/attached"], true, "{after}");
    let action = after["_meta"]["countersign/action_id"].as_str().unwrap();
    orders.only_refund("ord_55", 12_500, &format!("{action}:1"));
}

// Upstream MCP servers nobody here wrote, behind agents that have no [model]: the reference
// filesystem server over stdio, started by the gateway, and the reference "everything" server
// over Streamable HTTP.

/// Reads run by the servers' read-only hint; a write waits for a finance manager.
const FILES_POLICY: &str = r#"name = "files"
version = 1
default_ttl = "1h"

[hints.read_only]
decision = "allow"

[tools.write_file]
decision = "approve"
approver_role = "finance_manager"
quorum = 1
reason = "Writing a file changes what the team reads."
"#;

/// The reference server's echo runs; nothing else of it is allowed.
const REFERENCE_POLICY: &str = r#"name = "reference"
version = 1
default_ttl = "1h"

[tools.echo]
decision = "allow"
"#;

/// Two agents without a model: `files` starts the filesystem server over `data` (each start
/// counted in `root`'s [`STARTS`]), `reference` reaches the everything server at
/// `everything_url`. Returns the directory holding both.
fn upstream_agents(root: &Path, data: &Path, everything_url: &str) -> PathBuf {
    let agents = root.join("agents");
    let files = agents.join("files");
    let reference = agents.join("reference");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::create_dir_all(&reference).unwrap();
    let filesystem = mcp_servers::server_script(mcp_servers::FILESYSTEM);
    std::fs::write(
        files.join("agent.toml"),
        format!(
            "name = \"files\"\nsystem_prompt = \"You keep the team's notes.\"\n\n\
             [mcp.files]\ncommand = \"sh\"\n\
             args = [\"-c\", \"echo started >> \\\"$0\\\" && exec node \\\"$1\\\" \\\"$2\\\"\", \"{}\", \"{}\", \"${{FILES_ROOT}}\"]\n\
             tools = \"*\"\n",
            root.join(STARTS).display(),
            filesystem.display()
        ),
    )
    .unwrap();
    std::fs::write(files.join("policy.toml"), FILES_POLICY).unwrap();
    std::fs::write(
        reference.join("agent.toml"),
        format!(
            "name = \"reference\"\nsystem_prompt = \"You echo.\"\n\n\
             [mcp.everything]\nurl = \"{everything_url}\"\ntools = [\"echo\"]\n"
        ),
    )
    .unwrap();
    std::fs::write(reference.join("policy.toml"), REFERENCE_POLICY).unwrap();
    std::fs::write(data.join("notes.txt"), "Ship on Friday.\n").unwrap();
    agents
}

/// The file under a test's root where each start of the filesystem server is a line.
const STARTS: &str = "files-started";

/// How many times the filesystem server of the agents under `root` was started.
fn starts(root: &Path) -> usize {
    std::fs::read_to_string(root.join(STARTS))
        .map(|started| started.lines().count())
        .unwrap_or(0)
}

/// The everything server over Streamable HTTP on a free port, in a process group of its own.
struct Everything {
    child: Child,
    url: String,
}

impl Everything {
    fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let port = common::free_port();
        let mut child = Command::new("node")
            .arg(mcp_servers::server_script(mcp_servers::EVERYTHING))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("node starts the everything server");
        let stderr = BufReader::new(child.stderr.take().unwrap());
        for line in stderr.lines() {
            if line.unwrap().contains("listening on port") {
                break;
            }
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        stop_group(&mut self.child, "KILL");
    }
}

/// The files in `dir`, by name.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn write_file(path: &Path, content: &str) -> Value {
    json!({"op": "call", "tool": "write_file", "wait_seconds": 0.0,
           "args": {"path": path.display().to_string(), "content": content}})
}

#[test]
fn the_filesystem_server_over_stdio_reads_freely_and_writes_once_after_approval_or_not_at_all() {
    let root = common::fresh_path("mcp-files");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let agents = upstream_agents(&root, &data, "http://127.0.0.1:9/mcp");
    let cs = Countersign::fresh("mcp-files").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", agents.display().to_string()),
        (
            "FILES_ROOT",
            data.canonicalize().unwrap().display().to_string(),
        ),
    ]);
    let data = data.canonicalize().unwrap();
    let gateway = Gateway::stdio_for(&cs, "files", "sam");
    let approved = data.join("plan.txt");

    let answers = gateway.session(json!([
        {"op": "list"},
        {"op": "call", "tool": "read_file", "args": {"path": data.join("notes.txt").display().to_string()}},
        write_file(&approved, "Ship on Monday.\n"),
        {"op": "call", "tool": "read_text_file", "args": {"path": data.join("notes.txt").display().to_string()}},
        {"op": "call", "tool": "list_directory", "args": {"path": data.display().to_string()}},
    ]));

    let tools = common::texts(&answers[0]["tools"], "name");
    assert!(
        tools.contains(&"read_file") && tools.contains(&"write_file"),
        "{tools:?}"
    );
    // The server's answer as it gave it: its text block, and its structured content.
    let read = &answers[1];
    assert_eq!(meta(read, "status"), "succeeded", "{read}");
    assert_eq!(
        read["content"],
        json!([{"type": "text", "text": "Ship on Friday.\n"}]),
        "{read}"
    );
    assert_eq!(read["structured"], json!({"content": "Ship on Friday.\n"}));
    assert!(
        !answers[4]["text"].as_str().unwrap().contains("plan.txt"),
        "{}",
        answers[4]
    );
    let waiting = &answers[2];
    assert_eq!(meta(waiting, "status"), "awaiting_approval", "{waiting}");
    let approval = meta(waiting, "approval_id").as_str().unwrap().to_string();
    assert_eq!(listing(&data), ["notes.txt"], "nothing written yet");

    cs.ok(&["review", "approve", &approval, "--as", "mia"]);
    let again = gateway.call(write_file(&approved, "Ship on Monday.\n"));
    assert_eq!(meta(&again, "attached"), true, "{again}");
    assert_eq!(meta(&again, "status"), "succeeded", "{again}");
    assert_eq!(
        std::fs::read_to_string(&approved).unwrap(),
        "Ship on Monday.\n"
    );
    // A read policy allows runs every time: what changed since the first is read afresh. A
    // call policy denies is ruled on again each time too.
    std::fs::write(data.join("notes.txt"), "Ship on Tuesday.\n").unwrap();
    let mkdir = json!({"op": "call", "tool": "create_directory", "args": {"path": data.join("old").display().to_string()}});
    let reads = gateway.session(json!([
        {"op": "call", "tool": "read_text_file", "args": {"path": data.join("notes.txt").display().to_string()}},
        {"op": "call", "tool": "list_directory", "args": {"path": data.display().to_string()}},
        mkdir,
        mkdir,
    ]));
    for read in &reads[..2] {
        assert_eq!(meta(read, "status"), "succeeded", "{read}");
        assert_eq!(meta(read, "attached"), false, "{read}");
    }
    for denied in &reads[2..] {
        assert_eq!(meta(denied, "status"), "denied", "{denied}");
        assert_eq!(meta(denied, "attached"), false, "{denied}");
    }
    assert!(
        reads[0]["text"]
            .as_str()
            .unwrap()
            .contains("Ship on Tuesday."),
        "{}",
        reads[0]
    );
    assert!(
        reads[1]["text"].as_str().unwrap().contains("plan.txt"),
        "{}",
        reads[1]
    );
    // Once: the file removed, the same call again answers the outcome and writes nothing.
    std::fs::remove_file(&approved).unwrap();
    let third = gateway.call(write_file(&approved, "Ship on Monday.\n"));
    assert_eq!(meta(&third, "status"), "succeeded", "{third}");
    assert_eq!(listing(&data), ["notes.txt"]);

    let rejected = data.join("rumour.txt");
    let waiting = gateway.call(write_file(&rejected, "Ship never.\n"));
    let approval = meta(&waiting, "approval_id").as_str().unwrap().to_string();
    cs.ok(&[
        "review",
        "reject",
        &approval,
        "--reason",
        "Not true.",
        "--as",
        "mia",
    ]);
    let told = gateway.call(write_file(&rejected, "Ship never.\n"));
    assert_eq!(meta(&told, "status"), "rejected", "{told}");
    assert!(
        told["text"].as_str().unwrap().starts_with("Not executed"),
        "{told}"
    );
    assert_eq!(
        listing(&data),
        ["notes.txt"],
        "a rejected write leaves the directory as it was"
    );
    std::fs::remove_dir_all(root).ok();
}

/// A fresh state whose agents are [`upstream_agents`] under `root` (the everything server
/// nowhere), with their data directory: `countersign` over it, and the data directory.
fn files_state(name: &str, root: &Path) -> (Countersign, PathBuf) {
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let agents = upstream_agents(root, &data, "http://127.0.0.1:9/mcp");
    let data = data.canonicalize().unwrap();
    let cs = Countersign::fresh(name).with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", agents.display().to_string()),
        ("FILES_ROOT", data.display().to_string()),
    ]);
    (cs, data)
}

#[test]
fn a_stdio_mcp_server_is_started_when_a_call_first_needs_it_never_when_serve_or_mcp_starts() {
    let root = common::fresh_path("mcp-lazy");
    let (cs, _data) = files_state("mcp-lazy", &root);

    let server = cs.serve();
    // `countersign mcp` of another agent, sweeping every second, with its client still there.
    let mut other = common::countersign(cs.state())
        .args([
            "mcp",
            "--agent",
            "reference",
            "--as",
            "sam",
            "--sweep-every",
            "1s",
        ])
        .envs(cs.env().iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let before = starts(&root);
    drop(other.stdin.take());
    other.wait().unwrap();
    let listed = Gateway::http_for(&server, &cs, "files", "sam").call(json!({"op": "list"}));

    assert_eq!(before, 0, "started before anything needed it");
    assert!(!listed["tools"].as_array().unwrap().is_empty(), "{listed}");
    assert_eq!(starts(&root), 1);
    std::fs::remove_dir_all(root).ok();
}

#[tokio::test]
async fn after_a_restart_a_decision_over_http_lists_the_servers_tools_and_runs_the_approved_write_once()
 {
    let root = common::fresh_path("mcp-lazy-decide");
    let (cs, data) = files_state("mcp-lazy-decide", &root);
    let plan = data.join("plan.txt");
    let server = cs.serve();
    let waiting = Gateway::http_for(&server, &cs, "files", "sam")
        .call(write_file(&plan, "Ship on Monday.\n"));
    let approval = meta(&waiting, "approval_id").as_str().unwrap().to_string();
    server.kill();

    // Started again, the server has listed nothing when mia's decision comes in.
    let server = cs.serve();
    let token = cs.token("mia");
    let decided = reqwest::Client::new()
        .post(format!("{}/approvals/{approval}/decisions", server.base))
        .bearer_auth(token)
        .json(&json!({"decision_id": "d-lazy", "action_version": 1, "choice": "approve"}))
        .send()
        .await
        .unwrap();

    assert_eq!(decided.status(), 200, "{}", decided.text().await.unwrap());
    assert_eq!(std::fs::read_to_string(&plan).unwrap(), "Ship on Monday.\n");
    let again = Gateway::http_for(&server, &cs, "files", "sam")
        .call(write_file(&plan, "Ship on Monday.\n"));
    assert_eq!(meta(&again, "status"), "succeeded", "{again}");
    assert_eq!(meta(&again, "attached"), true, "{again}");
    assert_eq!(starts(&root), 2, "once per server process");
    std::fs::remove_dir_all(root).ok();
}

#[test]
fn the_filesystem_servers_image_and_error_come_through_as_it_gave_them_over_http() {
    let root = common::fresh_path("mcp-files-blocks");
    let (cs, data) = files_state("mcp-files-blocks", &root);
    std::fs::write(data.join("pixel.png"), PIXEL_PNG).unwrap();
    let server = cs.serve();
    let gateway = Gateway::http_for(&server, &cs, "files", "sam");
    let path = |name: &str| data.join(name).display().to_string();

    let answers = gateway.session(json!([
        {"op": "call", "tool": "read_media_file", "args": {"path": path("pixel.png")}},
        {"op": "call", "tool": "read_text_file", "args": {"path": "/etc/hostname"}},
    ]));

    let image = &answers[0];
    assert_eq!(meta(image, "status"), "succeeded", "{image}");
    assert_eq!(image["is_error"], false, "{image}");
    let block = json!({"type": "image", "data": PIXEL_BASE64, "mimeType": "image/png"});
    assert_eq!(image["content"], json!([block]), "{image}");
    assert_eq!(image["structured"], json!({"content": [block]}));
    let refused = &answers[1];
    assert_eq!(meta(refused, "status"), "failed", "{refused}");
    assert_eq!(refused["is_error"], true, "{refused}");
    let said = refused["text"].as_str().unwrap();
    assert!(said.contains("Access denied"), "{refused}");
    assert!(
        !said.starts_with("The call failed"),
        "the server's own words: {said}"
    );

    // The audit keeps the text a model reads, the run's action the server's answer.
    let run = meta(image, "run_id").as_str().unwrap();
    let history = cs.ok(&["audit", run]);
    let stored = &history["actions"][0]["result"];
    assert_eq!(
        stored["content"], "[image: image/png, 70 bytes]",
        "{history}"
    );
    assert_eq!(stored["mcp"]["content"], json!([block]), "{history}");
    std::fs::remove_dir_all(root).ok();
}

/// The smallest PNG there is, one pixel, and its bytes in base64.
const PIXEL_PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x64, 0xf8, 0xcf, 0x50,
    0x0f, 0x00, 0x03, 0x86, 0x01, 0x80, 0x5a, 0x34, 0x7d, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];
const PIXEL_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

#[tokio::test]
async fn the_everything_server_over_streamable_http_lists_and_runs_an_allowed_call_and_an_agent_without_a_model_runs_no_run()
 {
    let everything = Everything::start();
    let root = common::fresh_path("mcp-reference");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let agents = upstream_agents(&root, &data, &everything.url);
    let cs = Countersign::fresh("mcp-reference").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", agents.display().to_string()),
        ("FILES_ROOT", data.display().to_string()),
    ]);
    let server = cs.serve();
    let gateway = Gateway::http_for(&server, &cs, "reference", "sam");

    let answers = gateway.session(json!([
        {"op": "list"},
        {"op": "call", "tool": "echo", "args": {"message": "through the gateway"}},
    ]));
    assert_eq!(common::texts(&answers[0]["tools"], "name"), ["echo"]);
    assert_eq!(meta(&answers[1], "status"), "succeeded", "{}", answers[1]);
    assert!(
        answers[1]["text"]
            .as_str()
            .unwrap()
            .contains("through the gateway"),
        "{}",
        answers[1]
    );

    // Neither agent has a model: a run of one is refused, over HTTP and from the CLI.
    let token = cs.token("sam");
    let refused = reqwest::Client::new()
        .post(format!("{}/runs", server.base))
        .bearer_auth(token)
        .json(&json!({"agent": "files", "task": "Tidy the notes."}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the agent files has no model")
            && message.contains("for the MCP gateway and the gate API only"),
        "{body}"
    );
    let ran = cs.run(&[
        "run",
        "--agent",
        "reference",
        "--as",
        "sam",
        "Echo something.",
    ]);
    assert_ne!(ran.exit, 0);
    assert!(
        ran.json["error"]["message"]
            .as_str()
            .unwrap_or(&ran.stderr)
            .contains("the agent reference has no model"),
        "{} {}",
        ran.json,
        ran.stderr
    );
    std::fs::remove_dir_all(root).ok();
}

/// What Claude Code's permission prompt tool answered: the JSON of its one text block.
#[track_caller]
fn behavior(answer: &Value) -> Value {
    assert_eq!(answer["is_error"], false, "{answer}");
    serde_json::from_str(answer["text"].as_str().unwrap()).unwrap()
}

/// A `tools/call` of the permission prompt tool, as Claude Code makes it for `tool_name`.
fn permission_prompt(tool_name: &str, input: Value, tool_use_id: &str, wait: f64) -> Value {
    json!({"op": "call", "tool": "permission_prompt", "wait_seconds": wait,
           "args": {"tool_name": tool_name, "input": input, "tool_use_id": tool_use_id}})
}

#[test]
fn given_the_claude_code_agent_over_http_its_permission_prompt_tool_is_listed_and_allows_a_call_a_lead_approved_with_its_input()
 {
    let cs = common::claude_code::harness("mcp-permission-allow");
    let server = cs.serve();
    let gateway = Gateway::http_for(&server, &cs, "claude-code", "dev-bot");
    let listed = gateway.call(json!({"op": "list"}));
    assert_eq!(
        common::texts(&listed["tools"], "name"),
        ["permission_prompt"],
        "the caller-run tools are not listed, the prompt tool is: {listed}"
    );
    assert_eq!(
        listed["tools"][0]["input_schema"]["required"],
        json!(["tool_name", "input"])
    );

    let push = json!({"command": "git push origin main"});
    let waiting = std::thread::spawn({
        let step = permission_prompt("Bash", push.clone(), "toolu_pp_push", 30.0);
        move || gateway.call(step)
    });
    let approval = common::claude_code::waiting_approval(&cs);
    assert_eq!(approval["tool_use_id"], "toolu_pp_push");
    common::claude_code::lead_approves(&cs, approval["id"].as_str().unwrap());

    let answer = waiting.join().unwrap();
    assert_eq!(
        behavior(&answer),
        json!({"behavior": "allow", "updatedInput": push})
    );
    let audit = cs.ok(&["audit", approval["id"].as_str().unwrap()]);
    assert_eq!(
        audit["actions"][0]["status"], "executing",
        "claimed: {audit}"
    );
}

#[test]
fn given_the_permission_prompt_tool_then_policy_allows_at_once_and_an_undecided_rejected_or_unlisted_call_is_denied()
 {
    let cs = common::claude_code::harness("mcp-permission-deny");
    let gateway = Gateway::stdio_for(&cs, "claude-code", "dev-bot");
    let rm = json!({"command": "rm -rf node_modules"});
    let answers = gateway.session(json!([
        permission_prompt("Bash", json!({"command": "npm test"}), "toolu_pp_test", 0.0),
        permission_prompt("Bash", rm.clone(), "toolu_pp_rm", 0.0),
        permission_prompt(
            "Read",
            json!({"file_path": "/etc/hosts"}),
            "toolu_pp_read",
            0.0
        ),
    ]));

    assert_eq!(
        behavior(&answers[0]),
        json!({"behavior": "allow", "updatedInput": {"command": "npm test"}})
    );
    let undecided = behavior(&answers[1]);
    let message = undecided["message"].as_str().unwrap();
    assert_eq!(undecided["behavior"], "deny", "{undecided}");
    assert!(
        message.starts_with("Countersign: no decision within 0s on approval ap-")
            && message.ends_with("ask again with the same tool_use_id once it is decided"),
        "{message}"
    );
    assert_eq!(
        behavior(&answers[2]),
        json!({"behavior": "deny", "message": "Countersign: agent claude-code has no tool Read that Claude Code runs; it is not allowed here"})
    );

    let approval = common::claude_code::waiting_approval(&cs);
    common::claude_code::lead_rejects(&cs, approval["id"].as_str().unwrap(), "keep the cache");
    let again = behavior(&gateway.call(permission_prompt("Bash", rm, "toolu_pp_rm", 0.0)));
    assert_eq!(again["behavior"], "deny", "{again}");
    assert!(
        again["message"]
            .as_str()
            .unwrap()
            .contains("keep the cache"),
        "{again}"
    );
    let listed = cs.ok(&["review", "--as", "lin"]);
    assert_eq!(
        listed["approvals"],
        json!([]),
        "one approval, decided: {listed}"
    );
}
