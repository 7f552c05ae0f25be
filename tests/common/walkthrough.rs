//! The README's expense walkthrough as separate `countersign` processes, with the checks every
//! store must pass: on the embedded store a decision resumes its run in the deciding process; on
//! DynamoDB it queues a resume message and `countersign worker --once` takes it.

use serde_json::{Value, json};

use super::{Countersign, only_approval, texts};

/// Where a run goes on after a decision or the sweep.
#[derive(Clone, Copy, PartialEq)]
pub enum Resumes {
    /// In the process that decided or swept: its output carries the run.
    InProcess,
    /// Through the queue: the next `worker --once` resumes it.
    ThroughTheQueue,
}

impl Resumes {
    /// The runs that `output` (of a decision, or of the sweep if `swept`) set going, once done.
    fn runs(self, cs: &Countersign, output: &Value, swept: bool) -> Vec<Value> {
        match (self, swept) {
            (Resumes::InProcess, false) => vec![output["run"].clone()],
            (Resumes::InProcess, true) => output["runs"].as_array().unwrap().clone(),
            (Resumes::ThroughTheQueue, _) => {
                if !swept {
                    assert!(output["run"].is_null(), "the run waits for the worker");
                }
                let worked = cs.ok(&["worker", "--once"]);
                let resumed = worked["resumed"].as_array().unwrap();
                resumed.iter().map(|r| r["report"]["run"].clone()).collect()
            }
        }
    }
}

/// The one run `output` set going: done, its answer passing `check`.
fn one_done(runs: Vec<Value>, check: impl Fn(&str) -> bool) {
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "done", "{}", runs[0]);
    let answer = runs[0]["answer"].as_str().unwrap();
    assert!(check(answer), "{answer}");
}

/// c-101 paid without a person, c-102 approved and paid once, a refused self-approval and a late
/// second approval, c-103 declined as a duplicate, c-104 expired; the ledger and c-102's audit.
pub fn expense(cs: &Countersign, resumes: Resumes) {
    let c101 = cs.ok(&["agent", "c-101"]);
    assert_eq!(c101["status"], "done", "{c101}");
    assert!(
        c101["answer"].as_str().unwrap().contains("$42.00"),
        "{c101}"
    );

    let c102 = cs.ok(&["agent", "c-102"]);
    assert_eq!(c102["status"], "awaiting_approval");
    let (ap102, approval) = only_approval(&c102);
    assert_eq!(approval["tool"], "reimburse");
    assert_eq!(
        approval["args"]["amount_cents"], 25_000,
        "capped at the lodging limit"
    );
    assert_eq!(approval["action_version"], 1);

    let c103 = cs.ok(&["agent", "c-103"]);
    let (ap103, approval) = only_approval(&c103);
    assert_eq!(approval["tool"], "decline");
    assert!(
        approval["explanation"].as_str().unwrap().contains("c-101"),
        "{approval}"
    );

    let c104 = cs.ok(&["agent", "c-104", "--ttl", "0s"]);
    let (ap104, _) = only_approval(&c104);
    let review = cs.ok(&["review"]);
    let listed = texts(&review["approvals"], "id");
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[0], ap104, "the overdue approval is listed first");

    let own = cs.run(&["review", "approve", &ap102, "--as", "ben"]);
    assert_eq!(own.exit, 1);
    assert_eq!(own.json["error"]["code"], "own_request");
    assert!(own.stderr.starts_with("error: "), "{}", own.stderr);

    let approved = cs.ok(&["review", "approve", &ap102, "--as", "dana"]);
    assert_eq!(approved["approval"]["status"], "approved");
    one_done(resumes.runs(cs, &approved, false), |a| {
        a.contains("$250.00")
    });

    let again = cs.run(&["review", "approve", &ap102, "--as", "erin"]);
    assert_eq!(again.exit, 1);
    assert_eq!(again.json["error"]["code"], "already_decided");

    let declined = cs.ok(&["review", "approve", &ap103, "--as", "dana"]);
    one_done(resumes.runs(cs, &declined, false), |a| {
        a.starts_with("Declined claim c-103")
    });

    let swept = cs.ok(&["review", "expire"]);
    assert_eq!(swept["sweep"]["expired"], json!([ap104]));
    one_done(resumes.runs(cs, &swept, true), |a| a.contains("expired"));
    if resumes == Resumes::ThroughTheQueue {
        let left = cs.ok(&["worker", "--once"]);
        assert_eq!(left["resumed"], json!([]), "nothing left");
    }

    let ledger = cs.ok(&["ledger"]);
    let paid: Vec<(&str, i64)> = ledger["payments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["claim_id"].as_str().unwrap(),
                p["amount"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(paid, [("c-101", 4_200), ("c-102", 25_000)]);
    assert_eq!(ledger["declined"][0]["claim_id"], "c-103");

    let history = cs.ok(&["audit", c102["run_id"].as_str().unwrap()]);
    let entries = history["entries"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let mut rest = names.iter();
    for expected in shared::testing::APPROVED_RUN_EVENTS {
        assert!(
            rest.any(|name| *name == expected),
            "{expected} missing from {names:?}, or out of order"
        );
    }
    let decision = entries.iter().find(|e| e["event"] == "decision").unwrap();
    assert_eq!(decision["actor"]["id"], "dana");
    assert_eq!(decision["version"], 1);
    assert_eq!(decision["args_hash"], c102["approvals"][0]["args_hash"]);
    let executed = entries.iter().rfind(|e| e["event"] == "executed").unwrap();
    assert_eq!(executed["authorized_by"][0]["id"], "dana");
}
