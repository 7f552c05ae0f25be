//! `countersign policy test` and `policy replay` as a team runs them: real processes over a
//! real state directory, on a clean one and on one with stored calls.

mod common;

use std::path::{Path, PathBuf};

use common::Countersign;

fn expense_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/agents/expense").to_string()
}

/// A file of `text` in a fresh directory of its own, named `name`.
fn written(dir: &Path, name: &str, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The shipped expense policy with one more rule: `cedar` is its Cedar file's text.
fn candidate(dir: &Path, cedar: &str) -> String {
    let shipped = std::fs::read_to_string(format!("{}/policy.toml", expense_dir())).unwrap();
    let manifest = shipped.replacen(
        "default_ttl = \"24h\"\n",
        "default_ttl = \"24h\"\ncedar = [\"extra.cedar\"]\n",
        1,
    );
    written(dir, "extra.cedar", cedar);
    written(dir, "policy.toml", &manifest).display().to_string()
}

#[test]
fn policy_test_holds_the_shipped_cases_and_names_the_rules_of_a_case_that_fails() {
    let cs = Countersign::fresh("policy-test");
    let cases = format!("{}/policy-cases.toml", expense_dir());

    let held = cs.printed(&["policy", "test", "--agent", &expense_dir(), &cases]);
    assert!(held.contains("10 of 10 cases hold for expense"), "{held}");

    let wrong = written(
        &cs.state().join("cases"),
        "wrong.toml",
        r#"
[[case]]
name = "a large reimbursement runs without a person"
tool = "reimburse"
args = { claim_id = "c-1", amount_cents = 900000 }
as = "ben"
expect = "allow"

[[case]]
tool = "get_claim"
args = { claim_id = "c-1" }
as = "ben"
expect = "allow"
"#,
    );
    let failed = cs.print(&[
        "policy",
        "test",
        "--agent",
        &expense_dir(),
        wrong.to_str().unwrap(),
    ]);
    assert_eq!(failed.exit, 1, "{}", failed.stderr);
    assert!(
        failed.stderr.contains("1 of 2 cases fail for expense")
            && failed
                .stderr
                .contains("a large reimbursement runs without a person")
            && failed.stderr.contains("expected allow, got approve")
            && failed.stderr.contains("rules: tools.reimburse.thresholds"),
        "{}",
        failed.stderr
    );

    let unreadable = written(
        &cs.state().join("cases"),
        "bad.toml",
        "[[case]]\ntool = 3\n",
    );
    cs.refuses(
        &[
            "policy",
            "test",
            "--agent",
            &expense_dir(),
            unreadable.to_str().unwrap(),
        ],
        &["bad.toml"],
    );
}

#[test]
fn policy_replay_counts_outcomes_before_and_after_and_lists_each_call_a_candidate_changes() {
    let cs = Countersign::fresh("policy-replay");
    let dir = cs.state().join("candidate");
    let every_payment = candidate(
        &dir,
        "@id(\"every-reimbursement-needs-finance\")\n@approve(\"finance\")\n\
         permit (principal, action == Action::\"reimburse\", resource);\n",
    );
    let replay = |policy: &str| {
        cs.ok(&[
            "policy",
            "replay",
            "--agent",
            &expense_dir(),
            "--policy",
            policy,
        ])
    };

    let clean = replay(&every_payment);
    assert_eq!(clean["calls"], 0, "a clean state has nothing: {clean}");
    let said = cs.printed(&["policy", "replay", "--agent", &expense_dir()]);
    assert!(said.contains("nothing to replay"), "{said}");

    // c-101 is paid within policy at once; c-102 waits for finance.
    cs.ok(&["agent", "c-101"]);
    cs.ok(&["agent", "c-102"]);
    let same = cs.ok(&["policy", "replay", "--agent", &expense_dir()]);
    assert!(same["calls"].as_u64().unwrap() >= 2, "{same}");
    assert_eq!(
        same["changed"],
        serde_json::json!([]),
        "its own policy changes nothing"
    );

    let stricter = replay(&every_payment);
    let reimburse = &stricter["tools"]["reimburse"];
    assert_eq!(reimburse["before"]["allow"], 1, "{stricter}");
    assert_eq!(reimburse["after"]["allow"], 0, "{stricter}");
    assert_eq!(
        reimburse["after"]["approve"],
        reimburse["before"]["approve"].as_u64().unwrap() + 1
    );
    let changed = stricter["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{stricter}");
    assert_eq!(changed[0]["tool"], "reimburse");
    assert_eq!(changed[0]["args"]["claim_id"], "c-101");
    assert_eq!(
        (changed[0]["before"].as_str(), changed[0]["after"].as_str()),
        (Some("allow"), Some("approve"))
    );
    assert_eq!(
        changed[0]["rules"],
        serde_json::json!(["every-reimbursement-needs-finance"])
    );

    // A window over the agent's reimbursements: the second within the hour is refused.
    let windowed_dir = cs.state().join("windowed");
    let windowed = candidate(
        &windowed_dir,
        "@id(\"one payment an hour\") @reason(\"One reimbursement an hour.\")\n\
         forbid (principal, action == Action::\"reimburse\", resource)\n  \
         when { context.history.paid_1h.count >= 1 };\n",
    );
    let manifest = std::fs::read_to_string(&windowed).unwrap();
    std::fs::write(
        &windowed,
        format!(
            "{manifest}\n[history.paid_1h]\ntool = \"reimburse\"\nwindow = \"1h\"\nper = \"agent\"\nsum = \"amount_cents\"\n"
        ),
    )
    .unwrap();
    let counted = replay(&windowed);
    let changed = counted["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{counted}");
    assert_eq!(changed[0]["args"]["claim_id"], "c-102", "the second one");
    assert_eq!(
        (changed[0]["before"].as_str(), changed[0]["after"].as_str()),
        (Some("approve"), Some("deny"))
    );

    let broken = candidate(
        &cs.state().join("broken"),
        "@id(\"typo\")\npermit (principal, action == Action::\"reimburse\", resource)\n  when { context.input.amount > 3 };\n",
    );
    cs.refuses(
        &[
            "policy",
            "replay",
            "--agent",
            &expense_dir(),
            "--policy",
            &broken,
        ],
        &["extra.cedar: line 3", "reimburse has no argument amount"],
    );
}

/// A payments agent whose rules are `cedar`, in a directory of its own under `dir`.
fn payments_agent(dir: &Path, cedar: &str) -> String {
    written(
        dir,
        "agent.toml",
        r#"name = "payments"
system_prompt = "You move money when asked."

[tools.send_transfer]
executor = "caller"
description = "Sends money to an account, in cents."
input_schema = { type = "object", required = ["to", "amount_cents"], properties = { to = { type = "string" }, amount_cents = { type = "integer" } } }
"#,
    );
    written(
        dir,
        "policy.toml",
        r#"name = "payments"
version = 1
default_ttl = "4h"
cedar = ["rules.cedar"]

[history.sent_1h]
tool = "send_transfer"
window = "1h"
per = "requester"
sum = "amount_cents"
"#,
    );
    written(dir, "rules.cedar", cedar);
    dir.display().to_string()
}

#[test]
fn a_bad_rule_stops_serve_and_run_before_anything_starts_naming_the_file_the_line_and_the_reason() {
    let cs = Countersign::fresh("policy-bad-rules");
    let good = "@id(\"small\")\npermit (principal, action == Action::\"send_transfer\", resource)\n  when { context.input.amount_cents <= 50000 };\n";
    let ok_dir = payments_agent(&cs.state().join("good"), good);
    let held = cs.printed(&["policy", "test", "--agent", &ok_dir, &{
        let cases = written(
            &cs.state().join("good-cases"),
            "cases.toml",
            "[[case]]\ntool = \"send_transfer\"\nargs = { to = \"a\", amount_cents = 100 }\nas = \"ana\"\nexpect = \"allow\"\n",
        );
        cases.display().to_string()
    }]);
    assert!(held.contains("1 of 1 cases hold"), "{held}");

    let bad = [
        (
            "an unknown argument",
            "@id(\"x\")\npermit (principal, action == Action::\"send_transfer\", resource)\n  when { context.input.amount > 5 };\n",
            "line 3",
            "send_transfer has no argument amount",
        ),
        (
            "a string compared with a number",
            "@id(\"x\")\npermit (principal, action == Action::\"send_transfer\", resource)\n  when { context.input.to > 5 };\n",
            "line 3",
            "Long",
        ),
        (
            "a role nobody holds",
            "@id(\"x\") @approve(\"treasurer\")\npermit (principal, action == Action::\"send_transfer\", resource);\n",
            "rules.cedar",
            "treasurer",
        ),
        (
            "an unknown history window",
            "@id(\"x\")\npermit (principal, action == Action::\"send_transfer\", resource)\n  when { context.history.sent_24h.count < 5 };\n",
            "line 3",
            "sent_24h",
        ),
        (
            "a rule that does not parse",
            "@id(\"x\")\npermit (principal, action == Action::\"send_transfer\", resource)\n  when { context.input.amount_cents <= };\n",
            "line 3",
            "rules.cedar",
        ),
    ];
    for (number, (what, cedar, at, reason)) in bad.into_iter().enumerate() {
        let dir = payments_agent(&cs.state().join(format!("bad-{number}")), cedar);
        for command in [
            vec!["--agents", dir.as_str(), "serve", "--addr", "127.0.0.1:0"],
            vec![
                "--agents",
                dir.as_str(),
                "run",
                "--agent",
                "payments",
                "pay acct 9",
                "--as",
                "ana",
            ],
        ] {
            let refused = cs.print(&command);
            assert_eq!(refused.exit, 2, "{what}: {command:?}: {}", refused.stderr);
            assert!(
                refused.stderr.contains("rules.cedar")
                    && refused.stderr.contains(at)
                    && refused.stderr.contains(reason),
                "{what}: {}",
                refused.stderr
            );
            assert!(
                !refused.stdout.contains("listening"),
                "{what}: nothing starts: {}",
                refused.stdout
            );
        }
    }
    assert!(
        !cs.state().join("countersign.db").exists()
            || cs.printed(&["review"]).contains("Nothing waits"),
        "no run was started"
    );
}
