//! `countersign-bench` is itself checked: a short run on the embedded store must finish every
//! lifecycle and leave exactly one payment per approval. Its timings are not asserted.

use std::process::Command;

use serde_json::Value;

#[test]
fn a_short_concurrent_bench_pays_each_approved_claim_exactly_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_countersign-bench"))
        .args(["--runs", "20", "--concurrency", "4", "--json"])
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .expect("countersign-bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "the bench failed: {stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");

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
}
