//! What `countersign` prints for people, as real processes over one state directory: stored
//! text never reaches the terminal raw, a decision says what became of the call it let run, the
//! sweep says what it did, and a missing agent or an example-only command says what to do.

mod common;

use common::agents::TempDir;
use common::orders::OrdersService;
use common::server::Server;
use common::{Countersign, only_approval};
use serde_json::{Value, json};

const TASK: &str = "Refund USD 125 for order ord_55: the blender arrived damaged.";

/// What a terminal acts on: escape sequences, carriage returns, bells, C1 controls, reordering.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| {
            (c.is_control() && *c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// The agent's words carry a clear-screen, a title-setting OSC ended by a bell, and a carriage
/// return before a line that imitates the audit's.
const CONTROLS_SCRIPT: &str = r#"[[turns]]
say = "Paying as asked.\u001b[2J\u001b]0;all approved\u0007\r                                  allowed by policy\u009b31m\u202e"
calls = [{ tool = "pay_bonus", args = { employee = "mallory\u001b[8m", amount_cents = 500 } }]

[[turns]]
say = "Paid: {last_result}"
"#;

/// A bonus for ana, which a finance manager decides.
const BONUS_SCRIPT: &str = r#"[[turns]]
say = "Paying."
calls = [{ tool = "pay_bonus", args = { employee = "ana", amount_cents = 500 } }]

[[turns]]
say = "{last_result}"
"#;

#[tokio::test]
async fn control_characters_of_a_task_an_explanation_and_a_comment_are_printed_escaped() {
    let definitions = TempDir::new("cli-text-controls");
    let bonuses = definitions.bonuses_agent(CONTROLS_SCRIPT);
    let env = [("COUNTERSIGN_AGENTS", bonuses.clone())];
    let server = Server::start_with_env("cli-text-controls", &["--sweep-every", "0s"], &env);

    // Given a run whose task, whose agent's words and a comment on its approval carry ESC, CR,
    // OSC and BEL (any member of the tenant may write the task and the comment).
    let task = "Pay mallory\u{1b}[2J\u{1b}]0;pwned\u{7}\r2026-01-01T00:00:00.000Z  done";
    let started = server.start_agent("sam", "bonuses", task).await;
    assert_eq!(started.status, 200, "{}", started.json);
    let run = started.json["run_id"].as_str().unwrap().to_string();
    let approval = started.json["approvals"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let comment = "\u{1b}[1A\u{1b}[2K\rdecision   mia      approve → approved\u{7}";
    let commented = server
        .post(
            &format!("/approvals/{approval}/comments"),
            "sam",
            json!({"text": comment}),
        )
        .await;
    assert_eq!(commented.status, 201, "{}", commented.json);

    // When a reviewer lists it and reads its audit trail in a terminal.
    let printed = |args: &[&str]| {
        let output = common::countersign(&server.state)
            .args(args)
            .env("COUNTERSIGN_AGENTS", &bonuses)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let review = printed(&["review"]);
    let audit = printed(&["audit", &run]);

    // Then nothing the terminal would act on is printed, and every such character shows.
    for (what, text) in [("review", &review), ("audit", &audit)] {
        assert_eq!(
            raw_controls(text),
            Vec::<char>::new(),
            "{what} printed raw controls:\n{text}"
        );
        for shown in ["\\u{1b}[2J", "\\u{1b}]0;", "\\u{7}", "\\r"] {
            assert!(
                text.contains(shown),
                "{what} does not show {shown}:\n{text}"
            );
        }
    }
    assert!(review.contains("\\u{9b}31m\\u{202e}"), "{review}");
    // The call's arguments are JSON, whose own escapes show them.
    assert!(
        review.contains(r#""employee":"mallory\u001b[8m""#),
        "{review}"
    );
    assert!(review.contains("comment: sam: \\u{1b}[1A"), "{review}");
    // The audit's own lines are the only ones that start with a time: the task's forged one,
    // the explanation's and the comment's stay inside the lines that hold them.
    let lines: Vec<&str> = audit.lines().collect();
    assert!(
        lines
            .iter()
            .all(|line| !line.starts_with("2026-01-01")
                && !line.trim_start().starts_with("decision")),
        "{audit}"
    );
    assert!(
        audit.contains("\\u{1b}[1A\\u{1b}[2K\\rdecision   mia"),
        "{audit}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.trim() == "allowed by policy")
            .count(),
        0,
        "{audit}"
    );
}

/// The refunds agent against the orders service, on the embedded store.
fn refunds(name: &str, orders: &OrdersService) -> Countersign {
    Countersign::fresh(name).with_env(orders.embedded_env())
}

/// sam asks the refunds agent to do `task`: where the run stands.
fn sam_asks(cs: &Countersign, task: &str) -> Value {
    cs.ok(&["run", "--agent", "refunds", task, "--as", "sam"])
}

#[test]
fn an_approver_whose_approved_call_fails_is_told_so_on_stdout() {
    let orders = OrdersService::start("cli-text-failed");
    let cs = refunds("cli-text-failed", &orders);
    // ord_42 was refunded in full: the refund sam's task asks for is refused by the service.
    let started = sam_asks(&cs, "Refund the lost mugs of ord_42.");
    let (approval, waiting) = only_approval(&started);

    let approved = cs.printed(&["review", "approve", &approval, "--as", "mia"]);

    let key = format!("{}:1", waiting["action_id"].as_str().unwrap());
    assert!(
        approved.contains(&format!("issue_refund {key} failed (the agent is told): ")),
        "{approved}"
    );
    assert!(
        approved.contains("only 0.00 USD is left to refund"),
        "{approved}"
    );
    assert!(
        orders.refunds("ord_42").len() == 1,
        "the seeded refund only"
    );
}

#[test]
fn a_call_whose_outcome_is_unknown_is_said_to_be_held_and_the_sweep_says_it_reconciled_it() {
    // The service stores the refund, then answers 500.
    let orders = OrdersService::start_with("cli-text-unknown", &["--fault", "commit-then-500"]);
    let cs = refunds("cli-text-unknown", &orders);
    let started = sam_asks(&cs, TASK);
    let (approval, waiting) = only_approval(&started);
    let key = format!("{}:1", waiting["action_id"].as_str().unwrap());

    let approved = cs.printed(&["review", "approve", &approval, "--as", "mia"]);

    assert!(
        approved.contains(&format!("issue_refund {key} outcome unknown (")),
        "{approved}"
    );
    assert!(approved.contains("held for reconciliation"), "{approved}");
    assert!(
        approved.contains("paused until that outcome is settled"),
        "{approved}"
    );
    assert!(!approved.contains("waiting for a reviewer"), "{approved}");

    let swept = cs.printed(&["review", "expire"]);

    assert!(swept.contains(&format!("reconciled {key}")), "{swept}");
    assert!(!swept.contains("Nothing"), "{swept}");
    orders.only_refund("ord_55", 12_500, &key);
    let nothing = cs.printed(&["review", "expire"]);
    assert_eq!(nothing, "Nothing was due.\n");
}

#[test]
fn an_overdue_approval_expired_by_the_sweep_is_named_with_where_its_run_stands() {
    let cs = Countersign::fresh("cli-text-expire");
    let started = cs.ok(&["agent", "c-104", "--ttl", "0s"]);
    let (approval, _) = only_approval(&started);

    let swept = cs.printed(&["review", "expire"]);

    assert!(
        swept.starts_with(&format!("expired {approval} (reimburse version 1)\n")),
        "{swept}"
    );
    assert!(
        swept.contains("done: Nothing was settled for claim c-104"),
        "{swept}"
    );
}

#[test]
fn an_agent_that_is_not_loaded_is_named_with_how_to_load_it() {
    let definitions = TempDir::new("cli-text-missing");
    let bonuses = definitions.bonuses_agent(BONUS_SCRIPT);
    let cs = Countersign::fresh("cli-text-missing");

    let missing = cs.print(&["run", "--agent", "support", "Help.", "--as", "sam"]);

    assert_eq!(missing.exit, 1, "{}", missing.stderr);
    for part in [
        "agent support is not loaded here",
        "loaded: expense, refunds",
        "--agents DIR",
        "COUNTERSIGN_AGENTS",
    ] {
        assert!(missing.stderr.contains(part), "{part}: {}", missing.stderr);
    }
    assert_eq!(
        cs.run(&["run", "--agent", "support", "Help.", "--as", "sam"])
            .json["error"]["code"],
        "not_found"
    );

    // A run of an agent loaded for one command is decided by a process that loads it too.
    let started = cs.ok(&[
        "run",
        "--agent",
        &bonuses,
        "A bonus for ana.",
        "--as",
        "sam",
    ]);
    let (approval, _) = only_approval(&started);
    let without = cs.print(&["review", "approve", &approval, "--as", "mia"]);
    assert_eq!(without.exit, 1, "{}", without.stderr);
    let said = &without.stderr;
    assert!(
        said.contains("agent bonuses is not loaded here") && said.contains("--agents DIR"),
        "{said}"
    );
    assert_eq!(
        cs.ok(&["review"])["approvals"][0]["status"],
        "awaiting_approval"
    );
}

#[test]
fn the_expense_examples_commands_say_so_and_its_ledger_does_not_speak_for_other_agents() {
    let orders = OrdersService::start("cli-text-ledger");
    let cs = refunds("cli-text-ledger", &orders);
    for command in ["agent", "ledger"] {
        let help = cs.printed(&[command, "--help"]);
        assert!(
            help.contains("The expense example only"),
            "{command}: {help}"
        );
    }
    sam_asks(&cs, "Goodwill for ord_77, please.");

    let ledger = cs.printed(&["ledger"]);

    assert!(!ledger.contains("No payment has been made"), "{ledger}");
    assert!(
        ledger.starts_with("The expense example's ledger is empty"),
        "{ledger}"
    );

    let definitions = TempDir::new("cli-text-ledger-agents");
    let refunds_only = definitions.agent(
        "refunds",
        &[
            ("agent.toml", include_str!("../agents/refunds/agent.toml")),
            ("policy.toml", include_str!("../agents/refunds/policy.toml")),
            ("script.toml", include_str!("../agents/refunds/script.toml")),
        ],
    );
    let elsewhere = cs.printed(&["ledger", "--agents", &refunds_only]);
    assert!(
        elsewhere.starts_with("There is no expense ledger here"),
        "{elsewhere}"
    );
    let example = cs.print(&["agent", "c-101", "--agents", &refunds_only]);
    assert_eq!(example.exit, 1, "{}", example.stderr);
    assert!(
        example.stderr.contains("agent expense is not loaded here"),
        "{}",
        example.stderr
    );
}

#[test]
fn an_edited_version_explains_itself_in_its_editors_note_and_a_told_reason_keeps_one_full_stop() {
    let orders = OrdersService::start("cli-text-edit");
    let cs = refunds("cli-text-edit", &orders);
    let started = sam_asks(&cs, TASK);
    let (approval, _) = only_approval(&started);
    let note = "Damage covers the jug only; USD 75 per the repair quote.";

    let edited = cs.ok(&[
        "review", "edit", &approval, "--amount", "75", "--note", note, "--as", "mia",
    ]);

    let run = edited["approval"]["run_id"].as_str().unwrap();
    let audit = cs.ok(&["audit", run]);
    let proposed: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "proposed" && e["tool"] == "issue_refund")
        .map(|e| e["explanation"].as_str().unwrap())
        .collect();
    assert_eq!(proposed.len(), 2, "{audit}");
    assert!(
        proposed[0].contains("I propose refunding USD 125.00"),
        "{proposed:?}"
    );
    assert_eq!(proposed[1], note);

    // A rejection's reason that ends in a full stop is told with one.
    let again = sam_asks(&cs, TASK);
    let (second, _) = only_approval(&again);
    let rejected = cs.ok(&[
        "review",
        "reject",
        &second,
        "--reason",
        "Retention team calls first.",
        "--as",
        "mia",
    ]);
    let answer = rejected["run"]["answer"].as_str().unwrap();
    assert!(
        answer.ends_with("mia rejected this call: Retention team calls first. Do not retry it."),
        "{answer}"
    );
}

#[test]
fn the_offline_refunds_agent_follows_the_order_its_task_names() {
    let orders = OrdersService::start("cli-text-cases");
    let cs = refunds("cli-text-cases", &orders);

    let goodwill = sam_asks(&cs, "Goodwill for ord_77, please.");
    let default = sam_asks(&cs, TASK);

    // ord_77's case: a small refund, which policy lets run; its words quote the task.
    assert_eq!(goodwill["status"], "done", "{goodwill}");
    let refunded = orders.refunds("ord_77");
    assert_eq!(refunded.len(), 1, "{refunded:?}");
    assert_eq!(refunded[0]["amount_cents"], 1_500);
    let run = goodwill["run_id"].as_str().unwrap();
    let audit = cs.printed(&["audit", run]);
    assert!(
        audit.contains("as asked (Goodwill for ord_77, please.)"),
        "{audit}"
    );
    // Any other task: the walkthrough's refund of ord_55.
    let (_, waiting) = only_approval(&default);
    assert_eq!(waiting["args"]["order_id"], "ord_55");
}

#[test]
fn a_script_placeholder_the_script_does_not_have_stops_the_process_naming_its_file() {
    let definitions = TempDir::new("cli-text-placeholder");
    let bonuses = definitions.bonuses_agent("[[turns]]\nsay = \"Paying {whom}.\"\n");
    let cs = Countersign::fresh("cli-text-placeholder");

    cs.refuses(
        &["review", "--agents", &bonuses],
        &["script.toml", "{whom}"],
    );
}

#[test]
fn review_lists_a_page_and_says_how_to_see_the_rest() {
    let cs = Countersign::fresh("cli-text-pages");
    for _ in 0..3 {
        let paused = cs.ok(&["agent", "c-102"]);
        assert_eq!(paused["status"], "awaiting_approval", "{paused}");
    }
    let cards = |text: &str| text.lines().filter(|l| l.starts_with("ap-")).count();

    let first = cs.printed(&["review", "--limit", "2"]);

    assert_eq!(cards(&first), 2, "{first}");
    assert!(
        first.contains("2 shown, soonest deadline first; more wait."),
        "{first}"
    );
    let next = first
        .lines()
        .find_map(|l| l.strip_prefix("Next page: countersign review --limit 2 --cursor "))
        .unwrap_or_else(|| panic!("no next page in:\n{first}"));
    assert!(
        first.contains("Every one: countersign review --all"),
        "{first}"
    );
    let rest = cs.printed(&["review", "--limit", "2", "--cursor", next]);
    assert_eq!(cards(&rest), 1, "{rest}");
    assert!(!rest.contains("more wait"), "{rest}");
    let every = cs.printed(&["review", "--all"]);
    assert_eq!(cards(&every), 3, "{every}");
    let listed = cs.ok(&["review", "--limit", "2"]);
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 2);
    assert_eq!(listed["next_cursor"], next, "{listed}");
    cs.refuses(
        &["review", "--cursor", "not-one"],
        &["not one a page of waiting approvals gave"],
    );
}
