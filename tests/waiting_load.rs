//! A thousand requests waiting at once on a real `countersign serve` (gate long-polls of ten
//! people, four times its 256 connections), over real loopback HTTP: a reviewer's request is
//! still answered within a second, one person's wait past their share is refused at once while
//! another person's still waits, and a decision answers its waiters.
//!
//! The server raises its own open-file limit to fit its connections and waiting requests; this
//! test raises its own for the thousand client connections it holds.

mod common;

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Countersign;
use serde_json::{Value, json};

/// People who each hold [`WAITS_EACH`] waits: their share, all of it.
const PEOPLE: usize = 10;
const WAITS_EACH: usize = 100;

/// A state directory whose processes load examples/helpdesk, with eleven requesters and fran,
/// its finance manager.
fn helpdesk(name: &str) -> Countersign {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/helpdesk");
    let cs = Countersign::fresh(name);
    let people: Vec<String> = (0..=PEOPLE)
        .map(|n| {
            format!("  {{ name = \"bot-{n:02}\", tenant = \"acme\", roles = [\"support\"] }},")
        })
        .chain(["  { name = \"fran\", tenant = \"acme\", roles = [\"finance_manager\"] },".into()])
        .collect();
    // In the state directory, as private as the server wants it.
    std::fs::create_dir_all(cs.state()).unwrap();
    std::fs::set_permissions(cs.state(), Permissions::from_mode(0o700)).unwrap();
    let file = cs.state().join("people.toml");
    std::fs::write(&file, format!("people = [\n{}\n]\n", people.join("\n"))).unwrap();
    std::fs::set_permissions(&file, Permissions::from_mode(0o600)).unwrap();
    cs.with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", example.display().to_string()),
        ("COUNTERSIGN_PEOPLE", file.display().to_string()),
    ])
}

/// Room for this test's own connections: many systems start a process at 1,024 open files.
fn raise_open_files(wanted: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted.min(hard), hard).unwrap();
    }
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        soft >= wanted,
        "this test needs {wanted} open files; the limit is {soft}"
    );
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn send(
        &self,
        token: &str,
        request: reqwest::RequestBuilder,
    ) -> (u16, Value, Option<String>) {
        let answer = request.bearer_auth(token).send().await.expect("answered");
        let status = answer.status().as_u16();
        let retry_after = answer
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (
            status,
            answer.json().await.expect("a JSON answer"),
            retry_after,
        )
    }

    async fn get(&self, token: &str, path: &str) -> (u16, Value, Option<String>) {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(token, request).await
    }

    /// A refund of USD 125 proposed through the gate: it waits for fran. Its call's path and
    /// its approval.
    async fn propose(&self, token: &str, call_id: &str) -> (String, String) {
        let body = json!({
            "agent": "helpdesk",
            "tool": "refund",
            "args": {"order_id": call_id, "amount_cents": 12_500},
            "call_id": call_id,
        });
        let request = self
            .http
            .post(format!("{}/gate/calls", self.base))
            .json(&body);
        let (status, call, _) = self.send(token, request).await;
        assert_eq!(status, 202, "{call}");
        (
            format!("/gate/calls/{}", call["id"].as_str().unwrap()),
            call["approval"]["id"].as_str().unwrap().to_string(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waits_leave_a_reviewer_answered_within_a_second_and_nobody_waits_past_their_share()
 {
    raise_open_files(2 * 1024);
    let cs = helpdesk("waiting-load");
    let served = cs.serve_with(&["--max-waiting", "1024", "--max-waiting-per-person", "100"]);
    let client = Client {
        http: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
        base: served.base.clone(),
    };
    let bots: Vec<String> = (0..=PEOPLE)
        .map(|n| cs.token(&format!("bot-{n:02}")))
        .collect();
    let fran = cs.token("fran");
    let mut calls = Vec::new();
    for (n, bot) in bots.iter().take(PEOPLE).enumerate() {
        calls.push(client.propose(bot, &format!("order-{n}")).await);
    }

    // Each person's hundred long-polls of their call, a person at a time.
    let opening = Instant::now();
    let mut waits = Vec::new();
    for (bot, (call, _)) in bots.iter().zip(&calls) {
        for _ in 0..WAITS_EACH {
            let request = client.http.get(format!("{}{call}?wait=25s", client.base));
            let bot = bot.clone();
            waits.push(tokio::spawn(async move {
                let answer = request.bearer_auth(bot).send().await.expect("answered");
                let status = answer.status().as_u16();
                (
                    status,
                    answer.json::<Value>().await.expect("JSON"),
                    Instant::now(),
                )
            }));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let opened = opening.elapsed();

    let mut took = Vec::new();
    for _ in 0..5 {
        let asked = Instant::now();
        let (status, listed, _) = client.get(&fran, "/approvals").await;
        took.push(asked.elapsed());
        assert_eq!(status, 200, "{listed}");
        assert_eq!(listed["approvals"].as_array().unwrap().len(), PEOPLE);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    took.sort();
    println!(
        "{} waits opened in {opened:?}; fran's GET /approvals beside them took {took:?}",
        PEOPLE * WAITS_EACH
    );
    let median = took[took.len() / 2];
    assert!(
        median < Duration::from_secs(1),
        "a reviewer waited {median:?} (median of {took:?}) beside 1,000 waits"
    );

    // bot-00 holds their share: one more wait is answered at once, refused with the call.
    let asked = Instant::now();
    let (status, refused, retry_after) = client
        .get(&bots[0], &format!("{}?wait=25s", calls[0].0))
        .await;
    let refused_in = asked.elapsed();
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "too_many_waits", "{refused}");
    assert_eq!(refused["call"]["status"], "awaiting_approval", "{refused}");
    assert_eq!(retry_after.as_deref(), Some("5"));
    // Another person's wait is taken: it waits its two seconds.
    let (other, _) = client.propose(&bots[PEOPLE], "order-other").await;
    let asked = Instant::now();
    let (status, waited, _) = client.get(&bots[PEOPLE], &format!("{other}?wait=2s")).await;
    let waited_for = asked.elapsed();
    assert_eq!(status, 200, "{waited}");
    assert_eq!(waited["status"], "awaiting_approval");
    assert!(
        waited_for >= Duration::from_millis(1_500),
        "answered after {waited_for:?}: it did not wait"
    );
    println!(
        "a wait past the share refused in {refused_in:?}; another person's waited {waited_for:?}"
    );

    // fran approves each call: its hundred waits are answered with it.
    let deciding = Instant::now();
    for (n, (_, approval)) in calls.iter().enumerate() {
        let decision =
            json!({"decision_id": format!("d-{n}"), "action_version": 1, "choice": "approve"});
        let request = client
            .http
            .post(format!("{}/approvals/{approval}/decisions", client.base))
            .json(&decision);
        let (status, decided, _) = client.send(&fran, request).await;
        assert_eq!(status, 200, "{decided}");
    }
    let mut last = deciding;
    for wait in waits {
        let (status, answer, at) = wait.await.unwrap();
        assert_eq!(
            (status, &answer["status"]),
            (200, &json!("approved")),
            "{answer}"
        );
        last = last.max(at);
    }
    println!(
        "{} waits answered {:?} after fran began deciding",
        PEOPLE * WAITS_EACH,
        last - deciding
    );
}

/// `tools/call` of the expense agent's `reimburse` over MCP's Streamable HTTP, as `token`'s
/// person, waiting at most `wait_seconds`: the result, and how long it took.
async fn reimburse_over_mcp(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    claim: &str,
    wait_seconds: u32,
) -> (Value, Duration) {
    let call = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "reimburse",
            "arguments": {"claim_id": claim, "amount_cents": 9_000},
            "_meta": {"countersign/wait_seconds": wait_seconds},
        },
    });
    let asked = Instant::now();
    let answer = http
        .post(format!("{base}/mcp/expense"))
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(token)
        .json(&call)
        .send()
        .await
        .expect("answered");
    let answer: Value = answer.json().await.expect("a JSON-RPC answer");
    (answer["result"].clone(), asked.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_past_its_persons_share_of_waits_is_answered_at_once_while_anothers_waits() {
    let cs = Countersign::fresh("waiting-mcp-share");
    let served = cs.serve_with(&["--max-waiting-per-person", "1"]);
    let http = reqwest::Client::new();
    let (ben, chen) = (cs.token("ben"), cs.token("chen"));

    // ben's first call waits for a finance reviewer: it holds his one waiting slot.
    let holding = tokio::spawn({
        let (http, base, ben) = (http.clone(), served.base.clone(), ben.clone());
        async move { reimburse_over_mcp(&http, &base, &ben, "c-102", 30).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (second, answered_in) = reimburse_over_mcp(&http, &served.base, &ben, "c-101", 20).await;
    let (chens, waited) = reimburse_over_mcp(&http, &served.base, &chen, "c-103", 2).await;

    assert_eq!(
        second["_meta"]["countersign/status"], "awaiting_approval",
        "{second}"
    );
    assert!(
        answered_in < Duration::from_secs(10),
        "answered after {answered_in:?}: it waited past ben's share"
    );
    assert_eq!(
        chens["_meta"]["countersign/status"], "awaiting_approval",
        "{chens}"
    );
    assert!(
        waited >= Duration::from_millis(1_500),
        "answered after {waited:?}: it did not wait"
    );
    println!("ben's call past his share answered in {answered_in:?}; chen's waited {waited:?}");
    assert!(!holding.is_finished(), "ben's first call still waits");
    holding.abort();
}
