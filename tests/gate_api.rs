//! The gate API over a real `countersign serve` in front of examples/helpdesk, whose refund tool
//! its caller runs: a call proposed over HTTP, a finance manager's decision from the CLI in
//! another process, the long-poll that answers it, the claim and the outcome report; and many
//! long-polls held at once while the server answers others promptly.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Countersign;
use serde_json::{Value, json};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/helpdesk")
}

/// A state directory whose processes load examples/helpdesk and its people.
fn refunds(name: &str) -> Countersign {
    Countersign::fresh(name).with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", example().display().to_string()),
        (
            "COUNTERSIGN_PEOPLE",
            example().join("people.toml").display().to_string(),
        ),
        ("COUNTERSIGN_PUBLIC_URL", "http://review.example".into()),
    ])
}

/// `countersign serve` over `cs`'s state, and a client of it as one person.
struct Serve {
    served: common::Served,
    http: reqwest::Client,
}

impl Serve {
    fn start(cs: &Countersign) -> Self {
        Self::start_with(cs, &[])
    }

    /// [`Serve::start`] with more of `serve`'s flags.
    fn start_with(cs: &Countersign, args: &[&str]) -> Self {
        let served = cs.serve_with(args);
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        Self { served, http }
    }

    async fn send(&self, token: &str, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.bearer_auth(token).send().await.expect("answered");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        let request = self
            .http
            .post(format!("{}{path}", self.served.base))
            .json(&body);
        self.send(token, request).await
    }

    async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        let request = self.http.get(format!("{}{path}", self.served.base));
        self.send(token, request).await
    }

    /// `claimant` of `token`'s person claims the call at `call` (`/gate/calls/{id}`).
    async fn claim(&self, token: &str, call: &str, claimant: &str) -> (u16, Value) {
        let body = json!({"claimant": claimant});
        self.post(token, &format!("{call}/claim"), body).await
    }

    /// A long-poll of `path` on a task of its own: its answer, and when it came.
    fn long_poll(&self, token: &str, path: &str) -> tokio::task::JoinHandle<(Value, Instant)> {
        let request = self.http.get(format!("{}{path}", self.served.base));
        let token = token.to_string();
        tokio::spawn(async move {
            let answer = request.bearer_auth(token).send().await.expect("answered");
            (answer.json().await.expect("a JSON answer"), Instant::now())
        })
    }
}

fn refund(call_id: &str, cents: i64) -> Value {
    json!({
        "agent": "helpdesk",
        "tool": "refund",
        "args": {"order_id": "A-1001", "amount_cents": cents},
        "call_id": call_id,
        "conversation": "thread-42",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_proposed_over_http_and_lowered_from_the_cli_is_claimed_once_and_reported() {
    let cs = refunds("gate-api-flow");
    let server = Serve::start(&cs);
    let runner = cs.token("helpdesk-bot");

    let (status, proposed) = server
        .post(&runner, "/gate/calls", refund("call_1", 12_500))
        .await;
    assert_eq!(status, 202, "{proposed}");
    assert_eq!(proposed["status"], "awaiting_approval");
    assert_eq!(proposed["executor"], "caller");
    assert_eq!(proposed["conversation"], "thread-42");
    let approval = proposed["approval"]["id"].as_str().unwrap().to_string();
    assert_eq!(proposed["approval"]["approver_role"], "finance_manager");
    assert_eq!(
        proposed["approval"]["link"],
        format!("http://review.example/#approval={approval}")
    );
    let call = format!("/gate/calls/{}", proposed["id"].as_str().unwrap());

    // The same id with other arguments is another call: refused, nothing opened.
    let (status, reused) = server
        .post(&runner, "/gate/calls", refund("call_1", 9_000))
        .await;
    assert_eq!(
        (status, &reused["error"]["code"]),
        (409, &json!("call_id_reused"))
    );
    let (status, again) = server
        .post(&runner, "/gate/calls", refund("call_1", 12_500))
        .await;
    assert_eq!((status, &again["attached"]), (202, &json!(true)), "{again}");

    // A long-poll held while fran lowers it to USD 75 from the CLI, in another process.
    let polling = server.long_poll(&runner, &format!("{call}?wait=25s"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let decided = {
        let cs_state = cs.state().to_path_buf();
        let env = cs.env().to_vec();
        let approval = approval.clone();
        tokio::task::spawn_blocking(move || {
            let printed = common::stdout_of(
                common::countersign(&cs_state)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .args([
                        "review", "edit", &approval, "--amount", "75", "--as", "fran",
                    ]),
                "countersign review edit",
            );
            (
                Instant::now(),
                String::from_utf8_lossy(&printed).into_owned(),
            )
        })
        .await
        .unwrap()
    };
    let (decided, said) = decided;
    let run = proposed["id"].as_str().unwrap();
    assert!(
        said.contains(r#"approved: its caller claims it and runs it in its own process, once, with the arguments {"amount_cents":7500,"order_id":"A-1001"}"#)
            && said.contains(&format!(
                "[{run}] waits for its caller to claim the call (POST /gate/calls/{run}/claim)"
            )),
        "{said}"
    );
    assert!(
        !said.contains("resumes"),
        "nothing resumes a caller-run call: {said}"
    );
    let (polled, answered) = polling.await.unwrap();
    assert_eq!(polled["status"], "approved", "{polled}");
    assert_eq!(polled["version"], 2);
    // The embedded store shows the server another process's commit at a glance (50 ms).
    let lag = answered.saturating_duration_since(decided);
    assert!(
        lag < Duration::from_millis(500),
        "another process's decision seen after {lag:?}"
    );

    // The review page's recently decided list shows it waits for its caller to claim it.
    let fran = cs.token("fran");
    let (_, decided) = server.get(&fran, "/approvals/decided").await;
    let waiting = decided["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["call"]["status"] == "approved")
        .expect("the lowered version, approved");
    assert_eq!(waiting["awaiting_caller"]["stuck"], false, "{waiting}");

    let (status, claimed) = server.claim(&runner, &call, "worker-1").await;
    assert_eq!(status, 200, "{claimed}");
    assert_eq!(claimed["status"], "running");
    assert_eq!(claimed["args"]["amount_cents"], 7_500);
    let key = format!("{}:2", claimed["action_id"].as_str().unwrap());
    assert_eq!(claimed["key"], key);
    assert_eq!(claimed["claim"]["claimant"], "worker-1");
    let (status, other) = server.claim(&runner, &call, "worker-2").await;
    assert_eq!((status, &other["error"]["code"]), (409, &json!("claimed")));
    assert_eq!(
        other["call"]["status"], "running",
        "the call comes with the refusal"
    );
    let (status, stranger) = server.claim(&fran, &call, "worker-1").await;
    assert_eq!(
        (status, &stranger["error"]["code"]),
        (403, &json!("not_requester"))
    );

    let report =
        json!({"claimant": "worker-1", "status": "succeeded", "result": {"refund_id": "re_1"}});
    let (status, settled) = server
        .post(&runner, &format!("{call}/outcome"), report.clone())
        .await;
    assert_eq!(status, 200, "{settled}");
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(settled["result"]["content"], r#"{"refund_id":"re_1"}"#);
    let (status, _) = server
        .post(&runner, &format!("{call}/outcome"), report)
        .await;
    assert_eq!(status, 200, "the same report again");
    // Settled: claiming it again, even by its claimant, is refused with the call as it stands.
    let (status, late) = server.claim(&runner, &call, "worker-1").await;
    assert_eq!(
        (status, &late["error"]["code"], &late["call"]["status"]),
        (409, &json!("not_claimable"), &json!("succeeded")),
        "{late}"
    );
    let failed = json!({"claimant": "worker-1", "status": "failed", "result": "declined"});
    let (status, refused) = server
        .post(&runner, &format!("{call}/outcome"), failed)
        .await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (409, &json!("outcome_recorded"))
    );

    let audit = cs.ok(&["audit", proposed["id"].as_str().unwrap()]);
    assert_eq!(audit["run"]["status"], "done", "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_run_call_approved_from_the_cli_is_said_to_wait_for_its_caller() {
    let cs = refunds("gate-api-approved");
    let server = Serve::start(&cs);
    let runner = cs.token("helpdesk-bot");
    let (_, proposed) = server
        .post(&runner, "/gate/calls", refund("call_approved", 12_500))
        .await;
    let approval = proposed["approval"]["id"].as_str().unwrap();
    let run = proposed["id"].as_str().unwrap();

    let said = cs.printed(&["review", "approve", approval, "--as", "fran"]);

    assert!(
        said.contains(r#"approved: its caller claims it and runs it in its own process, once, with the arguments {"amount_cents":12500,"order_id":"A-1001"} and the key act-"#)
            && said.contains(&format!(
                "[{run}] waits for its caller to claim the call (POST /gate/calls/{run}/claim) and report what it did"
            )),
        "{said}"
    );
    assert!(!said.contains("resumes"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_report_is_read_up_to_64_kib_and_its_result_kept_up_to_32_kib() {
    let cs = refunds("gate-api-sizes");
    let server = Serve::start(&cs);
    let runner = cs.token("helpdesk-bot");
    let (_, proposed) = server
        .post(&runner, "/gate/calls", refund("call_sizes", 4_000))
        .await;
    assert_eq!(
        proposed["status"], "approved",
        "allowed by policy: {proposed}"
    );
    let call = format!("/gate/calls/{}", proposed["id"].as_str().unwrap());
    let (status, _) = server.claim(&runner, &call, "worker-1").await;
    assert_eq!(status, 200);
    let report = |bytes: usize| json!({"claimant": "worker-1", "status": "succeeded", "result": "r".repeat(bytes)});

    let (status, over) = server
        .post(&runner, &format!("{call}/outcome"), report(65 * 1024))
        .await;
    assert_eq!(
        (status, &over["error"]["code"]),
        (400, &json!("body_too_large")),
        "{over}"
    );
    let (_, unchanged) = server.get(&runner, &call).await;
    assert_eq!(unchanged["status"], "running", "{unchanged}");

    let (status, kept) = server
        .post(&runner, &format!("{call}/outcome"), report(40 * 1024))
        .await;
    assert_eq!(
        status, 200,
        "a body past 16 KiB is read on the gate's routes"
    );
    assert_eq!(kept["status"], "succeeded");
    let result = kept["result"]["content"].as_str().unwrap();
    assert!(result.len() <= 32 * 1024, "{}", result.len());
    assert!(
        result.contains("[Countersign kept the first 32 KiB of this result, which was 40 KiB"),
        "{}",
        &result[result.len() - 200..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_gate_requests_are_refused_with_their_codes() {
    // The helpdesk's people, and gus of globex, whom the helpdesk agent (acme's) does not serve.
    let cs = refunds("gate-api-bad");
    let people = cs.state().join("people.toml");
    std::fs::create_dir_all(cs.state()).unwrap();
    let file = std::fs::read_to_string(example().join("people.toml")).unwrap();
    let gus = "  { name = \"gus\", tenant = \"globex\", roles = [\"support\"] },\n]\n";
    std::fs::write(&people, file.replace("]\n", gus)).unwrap();
    let mut env = cs.env().to_vec();
    env.retain(|(name, _)| *name != "COUNTERSIGN_PEOPLE");
    env.push(("COUNTERSIGN_PEOPLE", people.display().to_string()));
    let cs = cs.with_env(env);
    let server = Serve::start(&cs);
    let runner = cs.token("helpdesk-bot");
    let gus = cs.token("gus");
    let mut no_id = refund("x", 100);
    no_id.as_object_mut().unwrap().remove("call_id");

    let (missing, _) = server.post(&runner, "/gate/calls", no_id).await;
    let (unknown_agent, _) = server
        .post(
            &runner,
            "/gate/calls",
            json!({"agent": "payroll", "tool": "refund", "args": {}, "call_id": "c"}),
        )
        .await;
    let (bad_wait, _) = server.get(&runner, "/gate/calls/run-nope?wait=soon").await;
    let (no_call, _) = server.get(&runner, "/gate/calls/run-nope").await;
    let (lacking, told) = server
        .post(
            &runner,
            "/gate/calls",
            json!({"agent": "helpdesk", "tool": "wire_money", "args": {}, "call_id": "c"}),
        )
        .await;

    let (foreign, foreign_told) = server
        .post(&gus, "/gate/calls", refund("gus-1", 2_500))
        .await;
    let (_, unknown_told) = server
        .post(
            &gus,
            "/gate/calls",
            json!({"agent": "payroll", "tool": "refund", "args": {}, "call_id": "c"}),
        )
        .await;

    assert_eq!(missing, 400);
    assert_eq!(unknown_agent, 404);
    // Another tenant's agent is not found, in the words of an agent that does not exist.
    assert_eq!(foreign, 404, "{foreign_told}");
    assert_eq!(foreign_told["error"]["code"], "not_found");
    assert_eq!(
        foreign_told["error"]["message"],
        "agent helpdesk was not found"
    );
    assert_eq!(
        unknown_told["error"]["message"],
        "agent payroll was not found"
    );
    let (_, waiting) = server.get(&gus, "/approvals").await;
    assert_eq!(waiting["approvals"], json!([]), "{waiting}");
    assert_eq!(bad_wait, 400);
    assert_eq!(no_call, 404);
    assert_eq!(
        (lacking, &told["status"]),
        (200, &json!("refused")),
        "{told}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_long_polls_are_held_while_others_are_answered_and_a_decision_here_wakes_them_at_once()
 {
    let cs = refunds("gate-api-many");
    // One person's 200 waits: more than the default share of the waiting slots.
    let server = Serve::start_with(&cs, &["--max-waiting-per-person", "200"]);
    let runner = cs.token("helpdesk-bot");
    let fran = cs.token("fran");
    let (_, proposed) = server
        .post(&runner, "/gate/calls", refund("call_many", 12_500))
        .await;
    let approval = proposed["approval"]["id"].as_str().unwrap().to_string();
    let path = format!("/gate/calls/{}?wait=20s", proposed["id"].as_str().unwrap());

    let polls: Vec<_> = (0..200).map(|_| server.long_poll(&runner, &path)).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let asked = Instant::now();
    let (status, listed) = server.get(&fran, "/approvals").await;
    let took = asked.elapsed();
    assert_eq!(status, 200, "{listed}");
    assert!(
        took < Duration::from_secs(1),
        "answered in {took:?} beside 200 long-polls"
    );

    let decision = json!({"decision_id": "d-1", "action_version": 1, "choice": "approve"});
    let (status, decided) = server
        .post(&fran, &format!("/approvals/{approval}/decisions"), decision)
        .await;
    let decided_at = Instant::now();
    assert_eq!(status, 200, "{decided}");
    for poll in polls {
        let (answer, at) = poll.await.unwrap();
        assert_eq!(answer["status"], "approved", "{answer}");
        let lag = at.saturating_duration_since(decided_at);
        assert!(
            lag < Duration::from_millis(500),
            "woken {lag:?} after the decision"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_gateway_neither_lists_nor_runs_a_tool_its_caller_runs() {
    let cs = refunds("gate-api-mcp");
    let server = Serve::start(&cs);
    let runner = cs.token("helpdesk-bot");
    let rpc = |method: &str, params: Value| {
        server
            .http
            .post(format!("{}/mcp/helpdesk", server.served.base))
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
    };

    let (_, listed) = server.send(&runner, rpc("tools/list", json!({}))).await;
    let args = json!({"order_id": "A-1001", "amount_cents": 4_000});
    let (_, called) = server
        .send(
            &runner,
            rpc("tools/call", json!({"name": "refund", "arguments": args})),
        )
        .await;

    assert_eq!(
        common::texts(&listed["result"]["tools"], "name"),
        ["permission_prompt"],
        "only the gateway's own prompt tool: {listed}"
    );
    let result = &called["result"];
    assert_eq!(result["_meta"]["countersign/status"], "refused", "{called}");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("only a call through the gate API can run it"),
        "{called}"
    );
}
