//! The README walkthrough, run as real processes: every command a separate `countersign` over
//! the same state directory.

mod common;

use common::{Countersign, only_approval};
use serde_json::Value;

#[test]
fn the_walkthrough_pays_exactly_c101_and_c102_and_explains_every_outcome() {
    let cs = Countersign::fresh("walkthrough");

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
    let listed: Vec<&str> = review["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[0], ap104, "the overdue approval is listed first");

    let own = cs.run(&["review", "approve", &ap102, "--as", "ben"]);
    assert_eq!(own.exit, 1);
    assert_eq!(own.json["error"]["code"], "own_request");
    assert!(own.stderr.starts_with("error: "), "{}", own.stderr);

    let approved = cs.ok(&["review", "approve", &ap102, "--as", "dana"]);
    assert_eq!(approved["run"]["status"], "done");
    assert!(
        approved["run"]["answer"]
            .as_str()
            .unwrap()
            .contains("$250.00")
    );

    let again = cs.run(&["review", "approve", &ap102, "--as", "erin"]);
    assert_eq!(again.exit, 1);
    assert_eq!(again.json["error"]["code"], "already_decided");

    let declined = cs.ok(&["review", "approve", &ap103, "--as", "dana"]);
    assert_eq!(declined["run"]["status"], "done");
    assert!(
        declined["run"]["answer"]
            .as_str()
            .unwrap()
            .starts_with("Declined claim c-103")
    );

    let swept = cs.ok(&["review", "expire"]);
    assert_eq!(swept["sweep"]["expired"], serde_json::json!([ap104]));
    assert_eq!(swept["runs"][0]["status"], "done");
    assert!(
        swept["runs"][0]["answer"]
            .as_str()
            .unwrap()
            .contains("expired")
    );

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
    let names: Vec<&str> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    for expected in [
        "started",
        "proposed",
        "paused",
        "decision",
        "executing",
        "executed",
        "done",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let decision = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "decision")
        .unwrap();
    assert_eq!(decision["actor"]["id"], "dana");
    assert_eq!(decision["version"], 1);
    assert_eq!(decision["args_hash"], approval_hash(&c102));
    let executed = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|e| e["event"] == "executed")
        .unwrap();
    assert_eq!(executed["authorized_by"][0]["id"], "dana");
}

fn approval_hash(run: &Value) -> Value {
    run["approvals"][0]["args_hash"].clone()
}

#[test]
fn an_unknown_person_is_refused_and_bad_usage_exits_2() {
    let cs = Countersign::fresh("usage");
    let run = cs.ok(&["agent", "c-102"]);
    let (ap, _) = only_approval(&run);

    let stranger = cs.run(&["review", "approve", &ap, "--as", "mallory"]);
    assert_eq!(stranger.exit, 1);
    assert_eq!(stranger.json["error"]["code"], "unknown_person");

    let malformed = cs.run(&["review", "approve", "not/an/id", "--as", "dana"]);
    assert_eq!(malformed.exit, 2);
    let no_person = cs.run(&["review", "approve", &ap]);
    assert_eq!(no_person.exit, 2, "a decision needs --as");
    let bad_ttl = cs.run(&["agent", "c-101", "--ttl", "soon"]);
    assert_eq!(bad_ttl.exit, 2);
    let unknown_claim = cs.run(&["agent", "c-999"]);
    assert_eq!(unknown_claim.exit, 1);
    assert_eq!(unknown_claim.json["error"]["code"], "not_found");

    let other_tenant = cs.run(&["review", "approve", &ap, "--as", "zoe"]);
    assert_eq!(other_tenant.json["error"]["code"], "not_found");
    let pending = cs.ok(&["review"]);
    assert_eq!(
        pending["approvals"].as_array().unwrap().len(),
        1,
        "refusals change nothing"
    );
}

#[test]
fn an_edit_lowers_the_amount_and_the_run_pays_the_edited_version() {
    let cs = Countersign::fresh("edit");
    let run = cs.ok(&["agent", "c-102"]);
    let (ap, _) = only_approval(&run);

    let raise = cs.run(&[
        "review", "edit", &ap, "--amount", "300", "--note", "more", "--as", "dana",
    ]);
    assert_eq!(raise.exit, 1);
    assert_eq!(raise.json["error"]["code"], "edit_refused");

    let edited = cs.ok(&[
        "review",
        "edit",
        &ap,
        "--amount",
        "199.50",
        "--note",
        "one night at the usual rate",
        "--as",
        "dana",
    ]);
    assert_eq!(edited["decision"]["effect"]["effect"], "edited");
    assert_eq!(edited["next_approval"]["action_version"], 2);
    assert_eq!(
        edited["run"]["status"], "done",
        "the editor's edit is their approval of version 2"
    );
    let ledger = cs.ok(&["ledger"]);
    assert_eq!(ledger["payments"][0]["amount"], 19_950);

    let stale = cs.run(&["review", "approve", &ap, "--as", "erin"]);
    assert_eq!(stale.json["error"]["code"], "superseded");
}
