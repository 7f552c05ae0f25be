//! History windows through the engine: the totals rules read move as calls run, wait, are
//! rejected, expire or are edited; each requester, the agent and each argument value has its
//! own total; the window's end drops old calls; calls of one turn count against each other in
//! order; and concurrent calls from many processes cannot pass a limit together.

use super::*;
use shared::agents::{Definition, InMemory};
use shared::domain::ids::AgentName;
use shared::domain::money::Amount;
use shared::domain::run::GateVia;
use shared::engine::{CallState, CallStatus, GateCall, StartRun};

/// USD 500 an hour per requester runs; past it, finance decides (within ten minutes, the
/// policy's time to decide). At most two transfers an hour to one account, and six an hour from
/// the agent.
const POLICY: &str = include_str!("../fixtures/policies/payments/windows-policy.toml");

const HOURLY_LIMIT: &str = include_str!("../fixtures/policies/payments/hourly-limit.cedar");

const RULES: &str = r#"@id("one account twice an hour") @reason("At most two transfers an hour to one account.")
forbid(principal, action == Action::"send_transfer", resource)
when { context.history.per_account_1h.count >= 2 };

@id("the agent's hour") @reason("The agent sends at most six transfers an hour.")
forbid(principal, action == Action::"send_transfer", resource)
when { context.history.all_1h.count >= 6 };
"#;

const SCHEMA: &str = r#"input_schema = { type = "object", required = ["to", "amount_cents"], additionalProperties = false, properties = { to = { type = "string" }, amount_cents = { type = "integer", minimum = 1 } } }"#;

/// The payments agent whose caller runs its transfers (through the gate API).
fn payments() -> Definition {
    definition(&payments_by_caller(), "")
}

/// The agent.toml of [`payments`].
fn payments_by_caller() -> String {
    format!(
        r#"name = "payments"
system_prompt = "You move money when asked."

[tools.send_transfer]
executor = "caller"
description = "Sends money to an account, in cents."
{SCHEMA}
"#
    )
}

fn definition(agent: &str, script: &str) -> Definition {
    definition_ruled_by(agent, script, RULES)
}

/// The payments agent's definition, with `rules` beside the hour's limit.
fn definition_ruled_by(agent: &str, script: &str, rules: &str) -> Definition {
    Definition::load(&InMemory {
        dir: "test-history",
        files: &[
            ("agent.toml", agent),
            ("policy.toml", POLICY),
            ("hourly-limit.cedar", HOURLY_LIMIT),
            ("rules.cedar", rules),
            ("script.toml", script),
        ],
    })
    .expect("the payments definition loads")
}

/// The same rules over an agent whose model proposes three transfers in one turn, its tool
/// posting to a service that is not there (each call that runs fails: it was still called).
fn payments_in_one_turn() -> Definition {
    let agent = format!(
        r#"name = "payments"
system_prompt = "You move money when asked."

[model]
provider = "scripted"
offline = "script.toml"

[tools.send_transfer]
description = "Sends money to an account, in cents."
{SCHEMA}

[tools.send_transfer.http]
method = "POST"
url = "{}"
timeout = "1s"
"#,
        super::environment::NOWHERE
    );
    let script = r#"[[turns]]
say = "Three transfers."
calls = [
  { tool = "send_transfer", args = { to = "acct_1", amount_cents = 40000 } },
  { tool = "send_transfer", args = { to = "acct_2", amount_cents = 20000 } },
  { tool = "send_transfer", args = { to = "acct_3", amount_cents = 5000 } },
]

[[turns]]
say = "Done."
"#;
    definition(&agent, script)
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// `who` asks, through the gate API, to send `cents` to `to`: a call of its own each time.
fn transfer(who: &str, to: &str, cents: i64) -> GateCall {
    let n = CALLS.fetch_add(1, Ordering::SeqCst);
    GateCall {
        tenant: acme(),
        agent: AgentName::parse("payments").unwrap(),
        requested_by: person(who),
        tool: "send_transfer".into(),
        args: json!({"to": to, "amount_cents": cents}),
        call_id: Some(format!("transfer-{n}")),
        conversation: None,
        via: GateVia::Api,
        standing: Default::default(),
    }
}

async fn sent(p: &Process, who: &str, to: &str, cents: i64) -> CallState {
    p.gate_call(transfer(who, to, cents))
        .await
        .expect("the gate takes the call")
}

/// [`sent`], which must come to `status`.
async fn sent_as(p: &Process, (who, to, cents): (&str, &str, i64), status: CallStatus) {
    assert_status(&sent(p, who, to, cents).await, status);
}

#[track_caller]
fn assert_status(state: &CallState, status: CallStatus) {
    assert_eq!(state.status, status, "{state:?}");
}

fn fay() -> Identity {
    Identity::new(acme(), person("fay"), [finance()].into())
}

async fn given_a_limit_an_hour_when_calls_run_wait_are_rejected_and_expire_then_the_total_counts_those_that_ran_or_may_still_run(
    h: &Harness,
) {
    let p = h.process_of_definitions(&[payments()]).await;

    // USD 300 runs; USD 300 more would pass USD 500: finance decides, and while it waits it
    // counts, so USD 50 more waits too.
    sent_as(&p, ("lee", "acct_1", 30_000), CallStatus::Approved).await;
    let first = sent(&p, "lee", "acct_2", 30_000).await;
    assert_status(&first, CallStatus::AwaitingApproval);
    let second = sent(&p, "lee", "acct_3", 5_000).await;
    assert_status(&second, CallStatus::AwaitingApproval);

    // Rejected, the USD 300 no longer counts: USD 300 + USD 50 waiting + USD 150 runs.
    let rejected = first.approval.as_ref().unwrap();
    h.decided(&p, &fay(), &rejected.id, reject("d-1", "not this one"))
        .await;
    sent_as(&p, ("lee", "acct_4", 15_000), CallStatus::Approved).await;
    sent_as(&p, ("lee", "acct_5", 1), CallStatus::AwaitingApproval).await;

    // Expired, the USD 50 no longer counts either: USD 50 more runs.
    h.clock.advance(Duration::minutes(11));
    let swept = p.sweep(100).await.unwrap();
    assert_eq!(swept.expired.len(), 2, "{swept:?}");
    sent_as(&p, ("lee", "acct_6", 5_000), CallStatus::Approved).await;
    sent_as(&p, ("lee", "acct_7", 1), CallStatus::AwaitingApproval).await;
}

async fn given_a_call_that_waits_when_finance_lowers_it_then_the_window_counts_the_new_amount(
    h: &Harness,
) {
    let p = h.process_of_definitions(&[payments()]).await;
    sent_as(&p, ("lee", "acct_1", 40_000), CallStatus::Approved).await;
    let waits = sent(&p, "lee", "acct_2", 30_000).await;
    let approval = waits.approval.clone().unwrap();

    // Lowered to USD 50, the new version is decided without its first one counted: USD 400 +
    // USD 50 is within the limit, so fay's edit lets it run.
    let lowered = decision(
        "d-edit",
        approval.action_version,
        Choice::Edit {
            amount: Amount::from_dollars(50),
            note: None,
        },
    );
    h.decided(&p, &fay(), &approval.id, lowered).await;
    let state = p.call_state(&acme(), &waits.run_id).await.unwrap();
    assert_status(&state, CallStatus::Approved);
    assert_eq!(state.version, Some(2));

    // The window counts USD 450 now, not USD 700: USD 50 more runs, a cent more waits.
    sent_as(&p, ("lee", "acct_3", 5_000), CallStatus::Approved).await;
    sent_as(&p, ("lee", "acct_4", 1), CallStatus::AwaitingApproval).await;
}

async fn given_windows_per_requester_per_agent_and_per_account_then_each_keeps_its_own_total(
    h: &Harness,
) {
    let p = h.process_of_definitions(&[payments()]).await;

    // Two transfers to one account an hour, whoever asks; another account has its own count.
    sent_as(&p, ("lee", "acct_1", 100), CallStatus::Approved).await;
    sent_as(&p, ("lee", "acct_1", 100), CallStatus::Approved).await;
    let third = sent(&p, "lee", "acct_1", 100).await;
    assert_status(&third, CallStatus::Denied);
    let told = third.result.unwrap().content;
    assert!(told.contains("At most two transfers"), "{told}");
    sent_as(&p, ("tam", "acct_1", 100), CallStatus::Denied).await;
    sent_as(&p, ("lee", "acct_2", 100), CallStatus::Approved).await;

    // Each requester has their own sum: lee's USD 3 do not count against tam's USD 500.
    sent_as(&p, ("tam", "acct_3", 50_000), CallStatus::Approved).await;

    // The agent's six an hour count every requester's calls that ran, not the two denied.
    sent_as(&p, ("ivy", "acct_4", 100), CallStatus::Approved).await;
    sent_as(&p, ("ivy", "acct_5", 100), CallStatus::Approved).await;
    let seventh = sent(&p, "ivy", "acct_6", 100).await;
    assert_status(&seventh, CallStatus::Denied);
    let told = seventh.result.unwrap().content;
    assert!(told.contains("at most six transfers"), "{told}");
}

async fn given_calls_of_an_hour_ago_when_the_window_moves_on_then_they_no_longer_count(
    h: &Harness,
) {
    let p = h.process_of_definitions(&[payments()]).await;
    sent_as(&p, ("lee", "acct_1", 50_000), CallStatus::Approved).await;
    h.clock.advance(Duration::minutes(59));
    let waits = sent(&p, "lee", "acct_2", 100).await;
    assert_status(&waits, CallStatus::AwaitingApproval);

    // An hour after the first, it is out of the window; the USD 1 still waiting is in it.
    h.clock.advance(Duration::minutes(1));
    sent_as(&p, ("lee", "acct_3", 49_900), CallStatus::Approved).await;
    sent_as(&p, ("lee", "acct_4", 1), CallStatus::AwaitingApproval).await;
}

async fn given_three_calls_in_one_turn_then_each_counts_against_the_ones_after_it(h: &Harness) {
    let p = h.process_of_definitions(&[payments_in_one_turn()]).await;
    let start = StartRun {
        agent: AgentName::parse("payments").unwrap(),
        task: "Send the three transfers.".into(),
        ..scripted_task("lee")
    };
    let report = p.start(start).await.unwrap();

    // USD 400 ran (and failed: it was called all the same); USD 200 more passes USD 500, and
    // USD 50 after it too, counting the USD 200 that waits.
    assert_eq!(report.status, RunStatus::AwaitingApproval, "{report:?}");
    let waiting: Vec<i64> = report
        .approvals
        .iter()
        .map(|a| a.args.int("amount_cents").unwrap())
        .collect();
    assert_eq!(waiting, [20_000, 5_000]);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let ran = history
        .actions
        .iter()
        .find(|a| a.args.int("amount_cents") == Some(40_000))
        .unwrap();
    assert_eq!(ran.status, ActionStatus::Failed);
}

/// 16 transfers of `cents` for lee, to accounts of their own, each proposed from a process of
/// its own over `payments`, at once: their states, and a process of them to read with.
async fn sixteen_at_once(
    h: &Harness,
    payments: &Definition,
    cents: i64,
    round: usize,
) -> (Vec<CallState>, Arc<Process>) {
    let mut processes = Vec::new();
    for _ in 0..16 {
        let definitions = from_ref(payments);
        processes.push(Arc::new(h.process_of_definitions(definitions).await));
    }
    let barrier = Arc::new(Barrier::new(16));
    let proposals: Vec<_> = processes
        .iter()
        .enumerate()
        .map(|(n, process)| {
            let (process, barrier) = (process.clone(), barrier.clone());
            let call = transfer("lee", &format!("acct_{n}"), cents);
            tokio::spawn(async move {
                barrier.wait().await;
                process.gate_call(call).await
            })
        })
        .collect();
    let mut states = Vec::new();
    for proposal in proposals {
        let state = proposal.await.unwrap();
        states.push(state.unwrap_or_else(|e| panic!("round {round}: {e}")));
    }
    (states, processes.swap_remove(0))
}

/// 16 calls of USD 100 for one requester, each from a process of its own, at once: the rules
/// let USD 500 run without a person and never more, and count six calls an hour and never
/// more, however the calls interleave.
pub async fn given_limits_of_usd_500_and_six_calls_when_sixteen_processes_propose_usd_100_at_once_then_five_run_one_waits_and_ten_are_denied(
    h: Harness,
    round: usize,
) {
    let (states, _) = sixteen_at_once(&h, &payments(), 10_000, round).await;
    let [ran, waiting, denied] = [
        CallStatus::Approved,
        CallStatus::AwaitingApproval,
        CallStatus::Denied,
    ]
    .map(|status| states.iter().filter(|s| s.status == status).count());
    assert_eq!(
        (ran, waiting, denied),
        (5, 1, 10),
        "round {round}: {states:?}"
    );
}

/// 16 calls of USD 600 (each past the hour's USD 500, so finance decides), each from a process
/// of its own, at once, with no rule on how many calls an hour: every one waits on finance. Each
/// opening takes the next slot of the agent's window and the requester's, so each process but
/// one loses the race and decides again, and the last to win has lost fifteen times: none is
/// turned away as contended.
pub async fn given_no_limit_on_calls_an_hour_when_sixteen_processes_propose_usd_600_at_once_then_all_sixteen_wait_on_finance(
    h: Harness,
    round: usize,
) {
    let only_the_hours_limit = "// The hour's limit (hourly-limit.cedar) is the only rule.\n";
    let payments = definition_ruled_by(&payments_by_caller(), "", only_the_hours_limit);
    let (states, process) = sixteen_at_once(&h, &payments, 60_000, round).await;
    for state in &states {
        assert_status(state, CallStatus::AwaitingApproval);
    }
    let waiting = process.pending(&acme()).await.unwrap();
    assert_eq!(waiting.len(), 16, "round {round}");
}

on_both_stores!([
    given_a_limit_an_hour_when_calls_run_wait_are_rejected_and_expire_then_the_total_counts_those_that_ran_or_may_still_run,
    given_a_call_that_waits_when_finance_lowers_it_then_the_window_counts_the_new_amount,
    given_windows_per_requester_per_agent_and_per_account_then_each_keeps_its_own_total,
    given_calls_of_an_hour_ago_when_the_window_moves_on_then_they_no_longer_count,
    given_three_calls_in_one_turn_then_each_counts_against_the_ones_after_it,
]);
