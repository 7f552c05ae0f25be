//! The README walkthrough, run as real processes: every command a separate `countersign` over
//! the same state directory.

mod common;

use common::walkthrough::{self, Resumes};
use common::{Countersign, only_approval};

#[test]
fn the_walkthrough_pays_exactly_c101_and_c102_and_explains_every_outcome() {
    walkthrough::expense(&Countersign::fresh("walkthrough"), Resumes::InProcess);
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
