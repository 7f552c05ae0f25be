//! The MCP gateway driven by clients nobody here wrote: the official MCP Python SDK (`mcp` from
//! PyPI, pinned in tests/mcp-client.requirements.txt) through tests/mcp_client.py, and the MCP
//! Inspector's CLI mode (npm, pinned in tests/npm/inspector), against `countersign mcp`
//! over stdio and `/mcp/refunds` on a real `countersign serve`, in front of the refunds agent and
//! a real orders service. Decisions come from `countersign review` in other processes.
//!
//! Both clients are installed once under `${XDG_CACHE_HOME:-~/.cache}/countersign` (PyPI and npm
//! the first time, offline after): the Python client in `mcp-client-venv`
//! (`COUNTERSIGN_MCP_PYTHON` names another Python that has it), the Inspector in `mcp-inspector`.

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

/// Where the clients are installed, as scripts/test-all installs them.
fn cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
        .join("countersign")
}

/// The Python that has the pinned client, installed on first use.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        if let Some(python) = std::env::var_os("COUNTERSIGN_MCP_PYTHON") {
            return PathBuf::from(python);
        }
        let venv = cache().join("mcp-client-venv");
        let python = venv.join("bin").join("python");
        let pinned = std::fs::read_to_string(REQUIREMENTS).unwrap();
        let version = pinned.trim().strip_prefix("mcp==").unwrap().to_string();
        if installed(&python).as_deref() != Some(version.as_str()) {
            run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
            run(Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "-r",
                REQUIREMENTS,
            ]));
            assert_eq!(installed(&python).as_deref(), Some(version.as_str()));
        }
        python
    })
}

/// The `mcp` version `python` has, if any.
fn installed(python: &Path) -> Option<String> {
    let output = Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('mcp'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[track_caller]
fn run(command: &mut Command) {
    let status = command.status().expect("the installer runs");
    assert!(
        status.success(),
        "installing an MCP client failed ({command:?}): python3 with venv and pip, npm, and \
         PyPI and npm once, are needed (scripts/test-all installs them too)"
    );
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
        let token = cs.printed(&["token", "--as", person]).trim().to_string();
        Self {
            transport: vec!["http".into(), format!("{}/mcp/{agent}", server.base), token],
            env: Vec::new(),
        }
    }

    fn command(&self, steps: &Value) -> Command {
        let mut command = Command::new(python());
        command
            .arg(CLIENT)
            .arg(steps.to_string())
            .args(&self.transport)
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

#[tokio::test]
async fn over_http_a_caller_without_a_token_or_for_an_agent_not_loaded_is_refused() {
    let cs = Countersign::fresh("mcp-http-refused");
    let server = cs.serve();
    let token = cs.printed(&["token", "--as", "sam"]).trim().to_string();
    let http = reqwest::Client::new();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let post = |path: &str, token: Option<&str>| {
        let mut request = http
            .post(format!("{}{path}", server.base))
            .header("accept", "application/json, text/event-stream")
            .json(&list);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };

    let anonymous = post("/mcp/refunds", None).await.unwrap();
    let elsewhere = post("/mcp/payroll", Some(&token)).await.unwrap();
    let listed = post("/mcp/refunds", Some(&token)).await.unwrap();

    assert_eq!(anonymous.status(), 401);
    assert_eq!(
        anonymous.json::<Value>().await.unwrap()["error"]["code"],
        "missing_token"
    );
    assert_eq!(elsewhere.status(), 404);
    assert_eq!(
        elsewhere.json::<Value>().await.unwrap()["error"]["code"],
        "not_found"
    );
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
    let zoe = cs.printed(&["token", "--as", "zoe"]).trim().to_string();
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
    let mut stdio: Vec<String> = cs
        .env()
        .iter()
        .chain(&[("COUNTERSIGN_STATE", cs.state().display().to_string())])
        .flat_map(|(k, v)| ["-e".to_string(), format!("{k}={v}")])
        .collect();
    stdio.extend(
        [
            env!("CARGO_BIN_EXE_countersign"),
            "mcp",
            "--agent",
            "refunds",
            "--as",
            "sam",
        ]
        .map(String::from),
    );
    let token = cs.printed(&["token", "--as", "sam"]).trim().to_string();
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

/// Two agents without a model: `files` starts the filesystem server over `data`, `reference`
/// reaches the everything server at `everything_url`. Returns the directory holding both.
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
             [mcp.files]\ncommand = \"node\"\nargs = [\"{}\", \"${{FILES_ROOT}}\"]\ntools = \"*\"\n",
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
    let read = &answers[1];
    assert_eq!(meta(read, "status"), "succeeded", "{read}");
    assert!(
        read["text"].as_str().unwrap().contains("Ship on Friday."),
        "{read}"
    );
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
    let token = cs.printed(&["token", "--as", "sam"]).trim().to_string();
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
