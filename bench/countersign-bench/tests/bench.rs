//! `countersign-bench` is itself checked: a short run on the embedded store must finish every
//! lifecycle and leave exactly one payment per approval. Its timings are not asserted.

use std::process::Command;

use serde_json::Value;

/// Runs the bench with `args` (`--json` among them), which must succeed; its report.
fn bench(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_countersign-bench"))
        .args(args)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("COUNTERSIGN_INDEX_SHARDS")
        .output()
        .expect("countersign-bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "the bench failed: {stderr}");
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

#[test]
fn a_short_concurrent_bench_pays_each_approved_claim_exactly_once() {
    let report = bench(&["--runs", "20", "--concurrency", "4", "--json"]);

    assert_eq!(report["store"], "embedded");
    assert_eq!(report["runs"], 20);
    assert_eq!(report["ledger_ok"], true, "{report}");
    assert_eq!(report["ledger"]["payments"], 20);
    assert_eq!(report["ledger"]["duplicate_claims"], 0);
    assert_eq!(report["ledger"]["duplicate_keys"], 0);
    assert_eq!(
        report["sweep"]["expired"], 20,
        "every overdue approval expired"
    );
    assert_eq!(report["latency"]["start"]["count"], 20);
    assert_eq!(report["latency"]["decide"]["count"], 20);

    // Each decision brings back the snapshot the review's read gave, and its approval write
    // holds on it: none read the approval again.
    assert_eq!(report["decisions_with_snapshot"], true);
    let steps = &report["per_step"];
    assert_eq!(steps["review_read"]["store"]["gets"], 1.0, "{steps}");
    assert_eq!(steps["decision"]["store"]["unchanged"], 1.0, "{steps}");
    assert_eq!(report["dynamodb_requests_per_decision"], Value::Null);

    // No partition key every tenant writes takes a lifecycle's index writes whole.
    let families = report["partition_keys"]["families"].as_array().unwrap();
    for family in families {
        if family["spread"] == "global" {
            assert_eq!(family["key"], "TENANTS", "{family}");
            // Written by the first starts of the tenant (several at once may each write it),
            // not by every start (2 write units each).
            assert!(
                family["wcu_per_lifecycle"].as_f64().unwrap() < 1.0,
                "{family}"
            );
        }
    }
    let ceilings = report["partition_keys"]["ceilings"].as_array().unwrap();
    let per_second = |i: usize| ceilings[i]["lifecycles_per_second"].as_f64().unwrap();
    assert_eq!(ceilings[3]["tenants"], 1_000);
    assert!(
        per_second(3) > 4.0 * per_second(1),
        "sharding raises the ceiling for many tenants: {ceilings:?}"
    );
}

#[test]
fn the_gate_bench_pays_every_allowed_call_and_wakes_every_waiting_caller() {
    let report = bench(&["--gate", "--runs", "10", "--json"]);

    let paths = report["paths"].as_array().expect("paths");
    let measured: Vec<(&str, u64, u64)> = paths
        .iter()
        .map(|p| {
            let calls = p["latency"]["count"].as_u64().unwrap();
            (
                p["path"].as_str().unwrap(),
                p["concurrency"].as_u64().unwrap(),
                calls,
            )
        })
        .collect();
    assert_eq!(
        measured,
        [
            ("gate", 1, 10),
            ("runs", 1, 10),
            ("gate", 8, 10),
            ("runs", 8, 10)
        ]
    );
    assert_eq!(report["wake"]["waits"], 10);
    assert_eq!(report["wake"]["decision_to_answer"]["count"], 10);
}

#[test]
fn the_mcp_gateway_bench_times_both_paths_and_each_approved_refund_runs_once() {
    let report = bench(&["--mcp-gateway", "--runs", "10", "--json"]);

    assert_eq!(report["direct"]["count"], 10, "{report}");
    assert_eq!(report["through_gateway"]["count"], 10, "{report}");
    assert_eq!(report["decision_to_answer"]["count"], 30, "{report}");
    assert_eq!(
        report["decision_to_answer_after_1500_ms"]["count"], 10,
        "{report}"
    );
    assert_eq!(report["refunds_once"], true, "{report}");
    for concurrency in ["concurrency_1", "concurrency_8"] {
        assert!(
            report["allowed_calls_per_second"][concurrency]
                .as_f64()
                .unwrap()
                > 0.0,
            "{report}"
        );
    }
}

#[test]
fn a_bench_without_the_metrics_counts_still_pays_each_approved_claim_exactly_once() {
    let report = bench(&["--runs", "10", "--without-counts", "--json"]);

    assert_eq!(report["ledger_ok"], true, "{report}");
    assert_eq!(report["ledger"]["payments"], 10);
}
