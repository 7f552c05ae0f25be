//! `countersign run --agent <name|dir> "<task>" --as <person>` as real processes: any agent, for
//! the person who asks, and a refusal that writes nothing.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::agents::TempDir;
use common::orders::OrdersService;
use common::{Countersign, only_approval};
use serde_json::json;

const TASK: &str = "Refund USD 125 for order ord_55: the blender arrived damaged.";

/// The shipped refunds definition as a team's own, "returns".
fn returns_agent(into: &Path) -> PathBuf {
    common::agents::returns_agent(into, |text| text)
}

#[test]
fn a_run_that_cannot_start_is_refused_with_its_code_and_writes_nothing() {
    let cs = Countersign::fresh("run-refused");

    let unknown_agent = cs.run(&["run", "--agent", "payroll", "Pay everyone.", "--as", "sam"]);
    assert_eq!(unknown_agent.exit, 1, "{}", unknown_agent.stderr);
    assert_eq!(unknown_agent.json["error"]["code"], "not_found");
    assert!(
        unknown_agent.stderr.contains("payroll"),
        "{}",
        unknown_agent.stderr
    );

    let stranger = cs.run(&["run", "--agent", "refunds", TASK, "--as", "mallory"]);
    assert_eq!(stranger.exit, 1, "{}", stranger.stderr);
    assert_eq!(stranger.json["error"]["code"], "unknown_person");

    let too_long = cs.run(&[
        "run", "--agent", "refunds", TASK, "--as", "sam", "--ttl", "2h",
    ]);
    assert_eq!(too_long.exit, 2, "{}", too_long.stderr);
    assert_eq!(too_long.json["error"]["code"], "bad_input");
    assert!(too_long.stderr.contains("30m"), "{}", too_long.stderr);

    let blank = cs.run(&["run", "--agent", "refunds", " ", "--as", "sam"]);
    assert_eq!(blank.exit, 2, "{}", blank.stderr);
    assert_eq!(blank.json["error"]["code"], "bad_input");

    let nobody = cs.run(&["run", "--agent", "refunds", TASK]);
    assert_eq!(nobody.exit, 2, "a run needs --as: {}", nobody.stderr);
    let bad_name = cs.run(&["run", "--agent", "../refunds", TASK, "--as", "sam"]);
    assert_eq!(bad_name.exit, 2, "{}", bad_name.stderr);

    assert_eq!(cs.ok(&["review"])["approvals"], json!([]));
}

#[test]
fn a_run_of_an_agent_whose_model_key_is_unset_names_the_variable_and_writes_nothing() {
    let definitions = TempDir::new("run-no-key");
    let oai = definitions.agent(
        "oai",
        &[
            (
                "agent.toml",
                "name = \"oai\"\nsystem_prompt = \"You answer questions.\"\n\n[model]\n\
                 provider = \"openai\"\nid = \"gpt-4o\"\napi_key_env = \"OAI_TEST_KEY\"\n",
            ),
            (
                "policy.toml",
                "name = \"oai\"\nversion = 1\ndefault_ttl = \"1h\"\n",
            ),
        ],
    );
    let cs = Countersign::fresh("run-no-key").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_AGENTS", oai),
    ]);

    let refused = cs.run(&["run", "--agent", "oai", "Hello?", "--as", "sam"]);

    assert_eq!(refused.exit, 1, "{}", refused.stderr);
    assert_eq!(refused.json["error"]["code"], "not_configured");
    assert!(
        refused.stderr.contains(
            "the agent oai has no model in this process: its [model] reads the API key from \
             OAI_TEST_KEY, which is not set here"
        ),
        "{}",
        refused.stderr
    );
    assert_eq!(cs.ok(&["review"])["approvals"], json!([]));
}

#[test]
fn an_agent_is_not_loaded_for_a_tenant_its_definition_does_not_name_in_the_words_of_an_unknown_one()
{
    let cs = Countersign::fresh("run-tenants");

    // zoe is of globex; the shipped refunds agent names acme only.
    let foreign = cs.run(&["run", "--agent", "refunds", TASK, "--as", "zoe"]);
    let unknown = cs.run(&["run", "--agent", "payroll", TASK, "--as", "zoe"]);
    let gateway = cs.run(&["mcp", "--agent", "refunds", "--as", "zoe"]);

    assert_eq!(foreign.exit, 1, "{}", foreign.stderr);
    assert_eq!(foreign.json["error"]["code"], "not_found");
    assert!(
        foreign
            .stderr
            .contains("agent refunds is not loaded here (loaded: none)"),
        "{}",
        foreign.stderr
    );
    assert_eq!(
        foreign.stderr.replace("refunds", "payroll"),
        unknown.stderr,
        "the same words"
    );
    assert_eq!(gateway.exit, 1, "{}", gateway.stderr);
    assert!(
        gateway.stderr.contains("agent refunds is not loaded here"),
        "{}",
        gateway.stderr
    );
    assert_eq!(cs.ok(&["review"])["approvals"], json!([]));
}

#[test]
fn a_definition_open_to_every_tenant_whose_bindings_hold_secrets_is_warned_of_at_start() {
    let definitions = TempDir::new("run-open-secrets");
    let bonuses = definitions.bonuses_agent(BONUSES_SCRIPT);
    let agent = std::path::Path::new(&bonuses).join("agent.toml");
    let text = std::fs::read_to_string(&agent).unwrap();
    std::fs::write(
        &agent,
        text.replace(
            "timeout = \"1s\"",
            "timeout = \"1s\"\nheaders = { Authorization = \"Bearer ${PAYROLL_TOKEN:-t0k3n}\" }",
        ),
    )
    .unwrap();
    let cs = Countersign::fresh("run-open-secrets").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_AGENTS", bonuses.clone()),
        ("COUNTERSIGN_PEOPLE", definitions.people()),
    ]);

    let open = cs.run(&["review"]);

    assert_eq!(open.exit, 0, "{}", open.stderr);
    assert!(
        open.stderr
            .contains("names no tenants, so every tenant may use it")
            && open
                .stderr
                .contains("tools.pay_bonus.http.headers.Authorization"),
        "{}",
        open.stderr
    );
    assert!(!open.stderr.contains("t0k3n"), "{}", open.stderr);
    // Named, no warning.
    let text = std::fs::read_to_string(&agent).unwrap();
    std::fs::write(&agent, format!("tenants = [\"acme\"]\n{text}")).unwrap();
    let named = cs.run(&["review"]);
    assert!(
        !named.stderr.contains("names no tenants"),
        "{}",
        named.stderr
    );
}

#[test]
fn a_shorter_ttl_gives_the_reviewer_less_time() {
    let orders = OrdersService::start("run-ttl");
    let cs = Countersign::fresh("run-ttl").with_env(orders.embedded_env());

    let started = cs.ok(&[
        "run", "--agent", "refunds", TASK, "--as", "sam", "--ttl", "10m",
    ]);

    let (_, approval) = only_approval(&started);
    let at = |field: &str| {
        chrono::DateTime::parse_from_rfc3339(approval[field].as_str().unwrap()).unwrap()
    };
    assert_eq!(
        at("expires_at") - at("created_at"),
        chrono::TimeDelta::minutes(10)
    );
}

#[test]
fn a_teams_own_definition_directory_runs_and_its_approval_is_decided_by_a_later_process() {
    let orders = OrdersService::start("run-dir");
    let definitions = TempDir::new("run-dir-agents");
    let returns = returns_agent(&definitions.0);
    let returns = returns.to_str().unwrap();
    // Every process loads the team's definition; `run` names it by its directory too.
    let mut env = vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_AGENTS", returns.to_string()),
    ];
    env.extend(orders.env());
    let cs = Countersign::fresh("run-dir").with_env(env);

    let started = cs.ok(&["run", "--agent", returns, TASK, "--as", "sam"]);

    assert_eq!(started["agent"], "returns", "{started}");
    let (approval, waiting) = only_approval(&started);
    assert_eq!(waiting["approver_role"], "finance_manager");
    assert_eq!(waiting["requested_by"], json!(["sam"]));
    let own = cs.run(&["review", "approve", &approval, "--as", "sam"]);
    assert_eq!(own.json["error"]["code"], "own_request", "{}", own.stderr);

    let approved = cs.ok(&["review", "approve", &approval, "--as", "mia"]);
    assert_eq!(approved["run"]["status"], "done", "{approved}");
    let key = format!("{}:1", waiting["action_id"].as_str().unwrap());
    orders.only_refund("ord_55", 12_500, &key);
}

const BONUSES_SCRIPT: &str = r#"[[turns]]
say = "Mia's bonus, as asked."
calls = [{ tool = "pay_bonus", args = { employee = "mia", amount_cents = 50000 } }]

[[turns]]
say = "The bonus came back: {last_result}"
"#;

#[test]
fn a_definition_names_the_argument_whose_person_may_not_approve_the_call() {
    let definitions = TempDir::new("run-claimant");
    let bonuses = definitions.bonuses_agent(BONUSES_SCRIPT);
    let cs = Countersign::fresh("run-claimant").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_AGENTS", bonuses),
        ("COUNTERSIGN_PEOPLE", definitions.people()),
    ]);

    // Given sam asks for a bonus for mia, a finance manager herself.
    let started = cs.ok(&[
        "run",
        "--agent",
        "bonuses",
        "A bonus for mia.",
        "--as",
        "sam",
    ]);
    let (approval, waiting) = only_approval(&started);
    assert_eq!(waiting["requested_by"], json!(["sam", "mia"]), "{waiting}");

    // When mia approves her own bonus, she is refused, as sam is; nothing is recorded.
    for who in ["mia", "sam"] {
        let own = cs.run(&["review", "approve", &approval, "--as", who]);
        assert_eq!(own.exit, 1, "{who}: {}", own.stderr);
        assert_eq!(
            own.json["error"]["code"], "own_request",
            "{who}: {}",
            own.json
        );
    }
    assert_eq!(cs.ok(&["review"])["approvals"][0]["decisions"], json!([]));

    // Then another finance manager decides (a rejection: nothing is paid).
    let rejected = cs.ok(&[
        "review",
        "reject",
        &approval,
        "--reason",
        "Bonuses go through payroll.",
        "--as",
        "max",
    ]);
    assert_eq!(rejected["approval"]["status"], "rejected", "{rejected}");
    assert_eq!(rejected["run"]["status"], "done", "{rejected}");
}

#[cfg(unix)]
#[test]
fn a_policy_linked_outside_the_agents_directory_is_refused_and_never_printed() {
    let definitions = TempDir::new("run-link-out");
    let returns = returns_agent(&definitions.0);
    let private = definitions.0.join("private.txt");
    std::fs::write(&private, "root:x:0:0:a-private-first-line\n").unwrap();
    let policy = returns.join("policy.toml");
    std::fs::remove_file(&policy).unwrap();
    std::os::unix::fs::symlink(&private, &policy).unwrap();
    let cs = Countersign::fresh("run-link-out");

    let refused = cs.run(&[
        "run",
        "--agent",
        returns.to_str().unwrap(),
        TASK,
        "--as",
        "sam",
    ]);

    assert_eq!(refused.exit, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(&policy.display().to_string()),
        "names the file: {}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("outside the agent's directory"),
        "{}",
        refused.stderr
    );
    let printed = format!("{}{}", refused.stderr, refused.json);
    assert!(!printed.contains("root:x"), "{printed}");
}

/// A Converse stand-in on loopback: every request is answered with the model's last words; the
/// head of each (request line and headers, lower-cased names) is kept.
fn converse_stand_in(words: &'static str) -> (String, Arc<Mutex<Vec<Vec<String>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim_end().is_empty() {
                    break;
                }
                let line = line.trim_end().to_string();
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                    head.push(format!("{}:{value}", name.to_ascii_lowercase()));
                } else {
                    head.push(line);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            seen.lock().unwrap().push(head);
            let answer = json!({
                "output": {"message": {"role": "assistant", "content": [{"text": words}]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": 640, "outputTokens": 12, "totalTokens": 652},
                "metrics": {"latencyMs": 310},
            })
            .to_string();
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (url, heads)
}

#[test]
fn a_deployment_that_names_a_bedrock_model_runs_an_anthropic_agent_on_bedrock_signed_with_its_credentials()
 {
    const PROFILE: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
    let (bedrock, heads) = converse_stand_in("Claim c-101 needs nothing more from me.");
    let cs = Countersign::fresh("run-bedrock").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".to_string()),
        ("COUNTERSIGN_BEDROCK_MODEL", PROFILE.to_string()),
        ("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", bedrock),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "ASIAFUNCTIONROLE".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "role-secret".to_string()),
    ]);

    let ran = cs.ok(&[
        "run",
        "--agent",
        "expense",
        "Process expense claim c-101.",
        "--as",
        "ana",
    ]);

    assert_eq!(ran["status"], "done", "{ran}");
    assert_eq!(ran["answer"], "Claim c-101 needs nothing more from me.");
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "one turn: {heads:?}");
    assert_eq!(
        heads[0][0],
        "POST /model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse HTTP/1.1"
    );
    let signed = heads[0]
        .iter()
        .find_map(|h| h.strip_prefix("authorization: "))
        .expect("a signed request");
    assert!(
        signed.starts_with("AWS4-HMAC-SHA256 Credential=ASIAFUNCTIONROLE/")
            && signed.contains("/us-east-1/bedrock/aws4_request"),
        "{signed}"
    );
    let history = cs.ok(&["audit", ran["run_id"].as_str().unwrap()]);
    let turn = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "model_turn")
        .expect("the turn is audited");
    assert_eq!(turn["model"], PROFILE);
    assert_eq!(turn["input_tokens"], 640);
    assert_eq!(turn["output_tokens"], 12);
}
