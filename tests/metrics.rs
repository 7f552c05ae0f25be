//! `GET /metrics` on a real `countersign serve`, read by a real Prometheus parser (PyPI's
//! `prometheus-client`, pinned in tests/metrics-parser.requirements.txt, through
//! tests/metrics_parse.py), while the expense lifecycle runs in other processes over the same
//! state: one approval waiting, then none after another process decided it, the decision
//! counted, the oldest wait back to zero.
//!
//! The parser is installed once under `${XDG_CACHE_HOME:-~/.cache}/countersign`
//! (`metrics-parser-venv`), as scripts/test-all installs it.

mod common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::{Countersign, item_where, only_approval};
use serde_json::Value;

const PARSER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/metrics_parse.py");
const DASHBOARD: &str = include_str!("../infra/grafana/countersign.json");
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/metrics-parser.requirements.txt"
);

fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        common::pinned_python("metrics-parser-venv", REQUIREMENTS, "prometheus-client")
    })
}

/// Every sample of a /metrics answer, as the parser read it.
struct Samples(Vec<Value>);

impl Samples {
    /// Parses `text`; the test fails if the parser refuses it.
    fn parse(text: &str) -> Self {
        let mut parser = Command::new(python())
            .arg(PARSER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the parser starts");
        parser
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let output = parser.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "the parser refused the answer: {}\n{text}",
            String::from_utf8_lossy(&output.stderr)
        );
        Self(serde_json::from_slice::<Vec<Value>>(&output.stdout).unwrap())
    }

    /// The value of the sample `name` of acme's expense agent with these labels too.
    #[track_caller]
    fn expense(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Value> = self
            .0
            .iter()
            .filter(|s| s["name"] == name)
            .filter(|s| s["labels"]["tenant"] == "acme" && s["labels"]["agent"] == "expense")
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .collect();
        assert_eq!(found.len(), 1, "one {name} {labels:?} in {:?}", self.0);
        found[0]["value"].as_f64().unwrap()
    }

    /// The type the parser gave the family `name`.
    fn type_of(&self, family: &str) -> &str {
        self.0
            .iter()
            .find(|s| s["family"] == family)
            .and_then(|s| s["type"].as_str())
            .unwrap_or("absent")
    }
}

async fn scrape(base: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("{base}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("serve answers")
}

async fn samples(base: &str, token: Option<&str>) -> Samples {
    let answer = scrape(base, token).await;
    assert_eq!(answer.status(), 200);
    let kind = answer.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    Samples::parse(&answer.text().await.unwrap())
}

#[tokio::test]
async fn given_a_payment_waiting_when_another_process_approves_it_then_metrics_show_none_waiting_one_decision_and_the_payment_run()
 {
    let cs = Countersign::fresh("metrics-lifecycle");
    let served = cs.serve();

    let started = cs.ok(&["agent", "c-102"]);
    let (approval, _) = only_approval(&started);

    let waiting = samples(&served.base, None).await;
    assert_eq!(waiting.expense("countersign_approvals_waiting", &[]), 1.0);
    let oldest = waiting.expense("countersign_approval_oldest_wait_seconds", &[]);
    assert!((0.0..60.0).contains(&oldest), "{oldest}");
    assert_eq!(waiting.expense("countersign_unknown_outcomes", &[]), 0.0);
    let approved = [("outcome", "approved")];
    assert_eq!(
        waiting.expense("countersign_decisions_total", &approved),
        0.0
    );
    let approve_ruled = [("outcome", "approve"), ("mode", "enforce")];
    assert_eq!(
        waiting.expense("countersign_policy_outcomes_total", &approve_ruled),
        1.0
    );
    let succeeded = [("outcome", "succeeded")];
    let reads = waiting.expense("countersign_executions_total", &succeeded);
    // The offline model says no usage: its turn is a request counted, with no tokens.
    let asked = [("outcome", "ok")];
    let turns = waiting.expense("countersign_model_requests_total", &asked);
    assert!(turns >= 1.0, "{turns}");
    for kind in ["input", "output"] {
        let tokens = waiting.expense("countersign_model_tokens_total", &[("kind", kind)]);
        assert_eq!(tokens, 0.0, "{kind}");
    }

    cs.ok(&["review", "approve", &approval, "--as", "dana"]);

    let decided = samples(&served.base, None).await;
    assert_eq!(decided.expense("countersign_approvals_waiting", &[]), 0.0);
    assert_eq!(
        decided.expense("countersign_approval_oldest_wait_seconds", &[]),
        0.0
    );
    assert_eq!(
        decided.expense("countersign_decisions_total", &approved),
        1.0
    );
    let rejected = [("outcome", "rejected")];
    assert_eq!(
        decided.expense("countersign_decisions_total", &rejected),
        0.0
    );
    assert_eq!(
        decided.expense("countersign_decision_seconds_count", &[]),
        1.0
    );
    // Cumulative as Prometheus reads them: the decision is within the first bound and every later.
    for le in ["10", "604800", "+Inf"] {
        let bucket = decided.expense("countersign_decision_seconds_bucket", &[("le", le)]);
        assert_eq!(bucket, 1.0, "le={le}");
    }
    assert_eq!(
        decided.expense("countersign_executions_total", &succeeded),
        reads + 1.0,
        "the payment ran"
    );
    assert_eq!(
        decided.expense("countersign_model_requests_total", &asked),
        turns + 1.0,
        "the resumed run asked its model once more"
    );
    let failed = [("outcome", "error")];
    assert_eq!(
        decided.expense("countersign_model_requests_total", &failed),
        0.0
    );
    assert_eq!(
        decided.expense("countersign_resume_failures_total", &[]),
        0.0
    );
    assert_eq!(decided.type_of("countersign_decision_seconds"), "histogram");
    assert_eq!(decided.type_of("countersign_model_tokens"), "counter");
    assert_eq!(decided.type_of("countersign_resume_failures"), "counter");
    assert_eq!(decided.type_of("countersign_decisions"), "counter");
    assert_eq!(decided.type_of("countersign_approvals_waiting"), "gauge");
}

#[tokio::test]
async fn given_a_metrics_token_when_a_scrape_bears_none_or_another_then_it_is_refused_and_with_it_answered()
 {
    let token = "a-scraper-token-of-some-length";
    let cs = Countersign::fresh("metrics-token").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_METRICS_TOKEN", token.into()),
    ]);
    let served = cs.serve();
    cs.ok(&["agent", "c-102"]);

    for borne in [None, Some("another-token-of-some-length")] {
        let refused = scrape(&served.base, borne).await;
        assert_eq!(refused.status(), 401, "{borne:?}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["code"], "unauthenticated");
    }
    let answered = samples(&served.base, Some(token)).await;
    assert_eq!(answered.expense("countersign_approvals_waiting", &[]), 1.0);
}

#[test]
fn given_a_metrics_token_too_short_to_keep_anyone_out_when_serve_starts_then_it_refuses_to() {
    let cs = Countersign::fresh("metrics-short-token").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_METRICS_TOKEN", "secret".into()),
    ]);

    cs.refuses(
        &["serve", "--addr", "127.0.0.1:0"],
        &["COUNTERSIGN_METRICS_TOKEN must be at least 16 characters"],
    );
}

#[test]
fn given_one_payment_approved_and_one_waiting_when_stats_runs_then_it_prints_them_as_a_table_and_as_json()
 {
    let cs = Countersign::fresh("metrics-stats");
    let (first, _) = only_approval(&cs.ok(&["agent", "c-102"]));
    cs.ok(&["review", "approve", &first, "--as", "dana"]);
    cs.ok(&["agent", "c-104"]);

    let figures = cs.ok(&["stats"]);
    let table = cs.printed(&["stats", "--tenant", "acme"]);

    let expense = item_where(&figures["agents"], "agent", "expense");
    assert_eq!(expense["tenant"], "acme");
    assert_eq!(expense["approvals_waiting"], 1);
    assert_eq!(expense["decisions"]["approved"], 1);
    assert_eq!(expense["decision_seconds"]["count"], 1);
    assert_eq!(figures["counted"], true);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("TENANT  AGENT "), "{table}");
    let row = lines
        .iter()
        .find(|line| line.starts_with("acme    expense "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells[2], cells[5]), ("1", "1/0/0/0"), "{row}");
    cs.refuses(&["stats", "--tenant", "not a tenant"], &["tenant id"]);
}

/// Every name in a PromQL expression that is one of Countersign's metrics.
fn metrics_named(expr: &str) -> BTreeSet<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("countersign_"))
        .collect()
}

/// The labels an expression groups by (`by (a, b)`).
fn grouped_by(expr: &str) -> Vec<&str> {
    expr.split("by (")
        .skip(1)
        .filter_map(|rest| rest.split_once(')'))
        .flat_map(|(labels, _)| labels.split(',').map(str::trim))
        .collect()
}

#[tokio::test]
async fn given_the_grafana_dashboard_when_its_queries_are_read_then_each_names_only_metrics_and_labels_a_live_scrape_serves()
 {
    let cs = Countersign::fresh("metrics-grafana");
    let served = cs.serve();
    cs.ok(&["agent", "c-102"]);
    let live = samples(&served.base, None).await;
    let served_names: BTreeSet<&str> = live.0.iter().filter_map(|s| s["name"].as_str()).collect();
    let served_labels: BTreeSet<&str> = live
        .0
        .iter()
        .filter_map(|s| s["labels"].as_object())
        .flat_map(|labels| labels.keys().map(String::as_str))
        .collect();

    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    assert!(dashboard["schemaVersion"].is_u64());
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("a ${name} variable"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    let mut queries = Vec::new();
    for name in ["tenant", "agent"] {
        let query = variable(name)["query"]["query"].as_str().unwrap();
        assert!(query.starts_with("label_values("), "{query}");
        assert!(query.ends_with(&format!(", {name})")), "{query}");
        queries.push(query.to_string());
    }

    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for panel in panels {
        let id = panel["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("an id: {panel}"));
        assert!(ids.insert(id), "the id {id} is taken twice");
        for edge in ["h", "w", "x", "y"] {
            assert!(panel["gridPos"][edge].is_u64(), "gridPos.{edge}: {panel}");
        }
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            assert!(target["refId"].is_string(), "{target}");
            queries.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(queries.len() > 10, "{queries:?}");

    let mut shown = BTreeSet::new();
    for query in &queries {
        let named = metrics_named(query);
        assert!(
            !named.is_empty(),
            "{query} reads no metric of Countersign's"
        );
        for name in named {
            assert!(
                served_names.contains(name),
                "{query} reads {name}, which /metrics does not serve"
            );
            shown.insert(name.to_string());
        }
        for label in grouped_by(query) {
            assert!(
                served_labels.contains(label),
                "{query} groups by {label}, no series has it"
            );
        }
    }
    // Every family /metrics serves is on the dashboard.
    for family in live.0.iter().filter_map(|s| s["family"].as_str()) {
        assert!(
            shown.iter().any(|name| name.starts_with(family)),
            "{family} is on no panel"
        );
    }
}
