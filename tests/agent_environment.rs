//! Which processes need an agent's variables, as real processes over one state directory: the
//! ones that run tools (`run`, `serve`, `mcp`, a worker) refuse a `${VAR}` that is unset at
//! start; a reviewer's shell without the agent's secrets lists, decides and audits, and a call
//! it approves waits, unclaimed, for a process that has them, which runs it once.

mod common;

use std::path::Path;

use common::agents::TempDir;
use common::orders::OrdersService;
use common::{Countersign, Ran, only_approval};
use serde_json::Value;

/// The shipped refunds definition as a team that keeps its token out of the file writes it:
/// named "returns", its token read from `ORDERS_TOKEN` with no default.
fn returns_agent(into: &Path) -> String {
    let token =
        |text: String| text.replace("${ORDERS_TOKEN:-local-orders-token}", "${ORDERS_TOKEN}");
    let dir = common::agents::returns_agent(into, token);
    dir.to_str().unwrap().to_string()
}

/// `countersign ARGS --json` over the harness's state and definitions, from a shell that holds
/// none of the agent's variables (a reviewer's).
fn without_the_agents_environment(cs: &Countersign, agents: &str, args: &[&str]) -> Ran {
    let output = common::countersign(cs.state())
        .env("COUNTERSIGN_STORE", "embedded")
        .env("COUNTERSIGN_AGENTS", agents)
        .env_remove("ORDERS_TOKEN")
        .env_remove("ORDERS_URL")
        .args(args)
        .arg("--json")
        .output()
        .expect("countersign runs");
    Ran {
        exit: output.status.code().unwrap_or(-1),
        json: serde_json::from_slice(&output.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&output.stderr).into(),
    }
}

/// The events of a run's audit about one action, in order.
fn events_of<'a>(history: &'a Value, action: &Value) -> Vec<&'a str> {
    let entries = history["entries"].as_array().unwrap();
    let about = entries.iter().filter(|e| e["action_id"] == action["id"]);
    about.map(|e| e["event"].as_str().unwrap()).collect()
}

#[test]
fn a_reviewer_without_the_agents_variables_decides_and_the_call_runs_once_where_they_are_set() {
    let orders = OrdersService::start("env-when-run");
    let definitions = TempDir::new("env-when-run-agents");
    let returns = returns_agent(&definitions.0);
    let mut env = vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_AGENTS", returns.clone()),
    ];
    env.extend(orders.env());
    let cs = Countersign::fresh("env-when-run").with_env(env);
    let reviewer = |args: &[&str]| without_the_agents_environment(&cs, &returns, args);

    // Given two refunds paused for a finance manager, started where the token is set.
    let damaged = cs.ok(&[
        "run",
        "--agent",
        "returns",
        "Refund USD 125 for order ord_55: the blender arrived damaged.",
        "--as",
        "sam",
    ]);
    let (approved, waiting) = only_approval(&damaged);
    let key = format!("{}:1", waiting["action_id"].as_str().unwrap());
    let mugs = cs.ok(&[
        "run",
        "--agent",
        "returns",
        "Refund the lost mugs of ord_42.",
        "--as",
        "sam",
    ]);
    let (rejected, _) = only_approval(&mugs);
    let mugs_refunded = orders.refunds("ord_42").len();

    // A process that would run the agent's tools refuses at once, naming the file and field.
    let run = reviewer(&["run", "--agent", "returns", "Refund ord_55.", "--as", "sam"]);
    assert_eq!(run.exit, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("agent.toml: tools.get_order.http.headers.Authorization: the environment variable ORDERS_TOKEN is not set"),
        "{}",
        run.stderr
    );

    // When a reviewer without the token lists, approves one, rejects the other and audits.
    let listed = reviewer(&["review"]);
    assert_eq!(listed.exit, 0, "{}", listed.stderr);
    assert_eq!(listed.json["approvals"].as_array().unwrap().len(), 2);
    let approve = approved_as_a_person_reads_it(&cs, &returns, &approved);
    let reject = reviewer(&[
        "review",
        "reject",
        &rejected,
        "--reason",
        "Mugs are not refunded.",
        "--as",
        "mia",
    ]);
    assert_eq!(reject.exit, 0, "{}", reject.stderr);
    assert_eq!(reject.json["approval"]["status"], "rejected");
    assert_eq!(
        reject.json["waits_for_environment"]["variable"], "ORDERS_TOKEN",
        "{}",
        reject.json
    );
    let run_id = damaged["run_id"].as_str().unwrap();
    let audit = reviewer(&["audit", run_id]);
    assert_eq!(audit.exit, 0, "{}", audit.stderr);

    // Then the decision is recorded and the call waits approved: not claimed, not sent.
    let actions = &audit.json["actions"];
    let refund = common::item_where(actions, "tool", "issue_refund");
    assert_eq!(refund["status"], "approved", "{}", audit.json);
    assert_eq!(events_of(&audit.json, refund), ["proposed", "decision"]);
    assert!(orders.refunds("ord_55").is_empty());

    // And the approver read what runs it, and where.
    assert!(
        approve.contains("mia approved") && approve.contains(
            "waits for the agent's environment: tools.get_order.http.headers.Authorization reads \
             the environment variable ORDERS_TOKEN, which is not set in this process; nothing \
             was claimed or sent."
        ) && approve.contains("`countersign serve` (its sweep) or `countersign review expire`"),
        "{approve}"
    );

    // When the sweep runs where the token is set, the call runs once and both runs go on.
    cs.ok(&["review", "expire"]);
    cs.ok(&["review", "expire"]);
    orders.only_refund("ord_55", 12_500, &key);
    let history = cs.ok(&["audit", run_id]);
    assert_eq!(history["run"]["status"], "done", "{history}");
    let mugs_history = cs.ok(&["audit", mugs["run_id"].as_str().unwrap()]);
    assert_eq!(mugs_history["run"]["status"], "done", "{mugs_history}");
    assert_eq!(
        orders.refunds("ord_42").len(),
        mugs_refunded,
        "rejected: not sent"
    );
}

/// `review approve` of `approval` as mia from the reviewer's shell, as a person reads it: what
/// it printed, once it succeeded.
fn approved_as_a_person_reads_it(cs: &Countersign, agents: &str, approval: &str) -> String {
    let output = common::countersign(cs.state())
        .env("COUNTERSIGN_STORE", "embedded")
        .env("COUNTERSIGN_AGENTS", agents)
        .env_remove("ORDERS_TOKEN")
        .env_remove("ORDERS_URL")
        .args(["review", "approve", approval, "--as", "mia"])
        .output()
        .expect("countersign runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    String::from_utf8_lossy(&output.stdout).into()
}

#[test]
fn serve_refuses_at_start_an_agent_whose_variable_is_unset() {
    let definitions = TempDir::new("env-serve-agents");
    let returns = returns_agent(&definitions.0);
    let state = common::fresh_path("countersign-env-serve");

    let output = common::countersign(&state)
        .env("COUNTERSIGN_AGENTS", &returns)
        .env_remove("ORDERS_TOKEN")
        .args(["serve", "--addr", "127.0.0.1:0", "--sweep-every", "0s"])
        .output()
        .expect("countersign serve runs");

    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the environment variable ORDERS_TOKEN is not set"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(state);
}
