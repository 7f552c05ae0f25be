//! The fault campaign's history window case: a payments agent whose policy lets each requester
//! send USD 500 an hour without a person (shared/tests/fixtures/policies/payments), and many
//! transfers, each proposed by a real `countersign hook claude-code` process as Claude Code's
//! PreToolUse hook, one requester's calls several at once. A share of the hooks is SIGKILLed at
//! a random moment (before, during or after the transaction that counts the call, or after its
//! claim) and asked again with the same `tool_use_id`, as a caller whose hook died asks again;
//! each allowed transfer is reported by a PostToolUse hook, killed and asked again the same way.
//! Then the sweep runs with the clock past every deadline and lease, and the verdict is read
//! from the store: the transfers allowed without a person never total more than USD 500 for a
//! requester, every call is in the one state its answers lead to, a retry attached to its call
//! (one run per call id, counted once), and the windows' slots agree with the calls.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared::deploy::Setup;
use shared::domain::action::ActionStatus;
use shared::domain::identity::Actor;
use shared::domain::ids::{AgentName, TenantId};
use shared::engine::records::keys;
use shared::ports::store::{ItemStore, query_all};

use crate::campaign::{Rng, Store, reading_engine};

/// What one requester may send in an hour without a person, in cents (hourly-limit.cedar).
const HOURLY_LIMIT_CENTS: i64 = 50_000;

/// The payments policy's fixtures: the windows manifest and the hour's limit.
const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/shared/tests/fixtures/policies/payments"
);

/// The payments agent as Claude Code's hook sees it: its caller runs the transfers.
const AGENT: &str = r#"name = "payments"
description = "Moves money when asked; its caller runs the transfers."
system_prompt = "Not used: the caller's own loop holds its prompt and its model."
recovery_owner = "finance"
tenants = ["acme"]

[tools.send_transfer]
executor = "caller"
description = "Sends money to an account, in cents."
input_schema = { type = "object", required = ["to", "amount_cents"], additionalProperties = false, properties = { to = { type = "string" }, amount_cents = { type = "integer", minimum = 1 } } }
"#;

/// The windows manifest's second rules file: the hour's limit is the only rule here.
const NO_MORE_RULES: &str =
    "// The hour's limit (hourly-limit.cedar) is the campaign's only rule.\n";

/// Who proposes transfers; fay of finance is the recovery owner.
const REQUESTERS: [&str; 12] = [
    "lee", "kim", "max", "ola", "ren", "sam", "tom", "uma", "val", "wes", "yan", "zoe",
];

/// How many times one hook event's process is killed at most before it is left to answer.
const MAX_KILLS: usize = 2;

pub struct WindowCampaign {
    /// Transfers proposed, spread over the requesters.
    pub calls: usize,
    pub requesters: usize,
    pub seed: u64,
    pub store: Store,
    /// Where the state directory, the agent and the people live.
    pub dir: PathBuf,
    /// Hook events in flight at once.
    pub parallel: usize,
    /// Share of hook processes SIGKILLed at a random moment of their life.
    pub kill_share: f64,
}

/// What the window campaign did and found.
#[derive(Debug, Default)]
pub struct WindowFigures {
    pub store: &'static str,
    pub seed: u64,
    pub calls: usize,
    pub requesters: usize,
    pub processes: usize,
    /// Hook processes SIGKILLed, each event then asked again with the same input.
    pub killed: usize,
    /// Transfers allowed by policy and reported as run.
    pub allowed: usize,
    /// Transfers that waited on finance (and expired in the sweep).
    pub waited: usize,
    /// Transfers claimed by a hook killed before it answered: never run twice, unknown.
    pub claimed_by_killed: usize,
    /// The most one requester had allowed without a person, in cents.
    pub most_allowed_cents: i64,
    /// History window slots read and checked against the calls.
    pub slots: usize,
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

impl fmt::Display for WindowFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault campaign, history windows, on {} (seed {}), {:.0?}:",
            self.store, self.seed, self.elapsed
        )?;
        writeln!(
            f,
            "  processes: {} started, {} SIGKILLed and their hook events asked again",
            self.processes, self.killed
        )?;
        writeln!(
            f,
            "  transfers: {} from {} requesters; {} allowed and run, {} waited on finance, {} claimed by a killed hook (unknown)",
            self.calls, self.requesters, self.allowed, self.waited, self.claimed_by_killed
        )?;
        writeln!(
            f,
            "  most allowed without a person for one requester: USD {}.{:02} of {}.00; slots checked: {}",
            self.most_allowed_cents / 100,
            self.most_allowed_cents % 100,
            HOURLY_LIMIT_CENTS / 100,
            self.slots
        )?;
        writeln!(f, "  rules broken: {}", self.violations.len())?;
        for violation in &self.violations {
            writeln!(f, "    {violation}")?;
        }
        Ok(())
    }
}

/// How a proposed transfer's hooks were answered, in the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Allowed, run and reported.
    Allowed,
    /// Asked: it waits on finance.
    Asked,
    /// Denied as already handed over: a killed hook claimed it, so it never runs again.
    ClaimedByKilled,
}

#[derive(Debug, Clone)]
struct Proposed {
    call_id: String,
    requester: &'static str,
    cents: i64,
    answer: Answer,
}

/// The hook processes' lives, shared by the threads that run them.
#[derive(Default)]
struct Tally {
    processes: usize,
    killed: usize,
    /// How long a hook left alone lives, on average, and over how many: kills land anywhere
    /// in one and a half of it.
    lived: Duration,
    finished: u32,
    violations: Vec<String>,
}

impl WindowCampaign {
    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn agent_dir(&self) -> PathBuf {
        self.dir.join("payments")
    }

    fn people(&self) -> PathBuf {
        self.dir.join("people.toml")
    }

    /// The payments agent (its policy the fixtures' windows manifest) and its people.
    fn write_agent(&self) {
        let agent = self.agent_dir();
        std::fs::create_dir_all(&agent).expect("the agent's directory");
        std::fs::write(agent.join("agent.toml"), AGENT).expect("agent.toml");
        for (fixture, name) in [
            ("windows-policy.toml", "policy.toml"),
            ("hourly-limit.cedar", "hourly-limit.cedar"),
        ] {
            std::fs::copy(format!("{FIXTURES}/{fixture}"), agent.join(name)).expect(fixture);
        }
        std::fs::write(agent.join("rules.cedar"), NO_MORE_RULES).expect("rules.cedar");
        let mut people: Vec<String> = REQUESTERS
            .iter()
            .map(|name| format!(r#"  {{ name = "{name}", tenant = "acme", roles = ["trader"] }},"#))
            .collect();
        people.push(r#"  { name = "fay", tenant = "acme", roles = ["finance"] },"#.into());
        std::fs::write(
            self.people(),
            format!("people = [\n{}\n]\n", people.join("\n")),
        )
        .expect("people.toml");
    }

    /// `countersign ARGS` with the payments agent and its people.
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command = self.store.countersign(&self.state(), args);
        command
            .arg("--agents")
            .arg(self.agent_dir())
            .arg("--people")
            .arg(self.people());
        command
    }

    /// A hook process for `person`, `event` on its stdin.
    fn hook(&self, person: &str, event: &Value) -> Child {
        let mut child = self
            .command(&[
                "hook",
                "claude-code",
                "--agent",
                "payments",
                "--as",
                person,
                "--wait",
                "0s",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the hook starts");
        let mut stdin = child.stdin.take().expect("its stdin");
        stdin
            .write_all(event.to_string().as_bytes())
            .expect("the event written");
        child
    }

    /// One hook event run to its answer, its stdout (an exit other than 0 is a violation): each
    /// process killed at a random moment with the campaign's chance, at most `MAX_KILLS` times,
    /// then asked again.
    fn answered(&self, person: &str, event: &Value, rng: &mut Rng, tally: &Mutex<Tally>) -> String {
        for attempt in 0.. {
            let lived = tally.lock().unwrap().lived;
            let kill_at = (attempt < MAX_KILLS && rng.chance(self.kill_share))
                .then(|| Instant::now() + rng.millis(0, lived.as_millis() as u64 * 3 / 2));
            let started = Instant::now();
            let mut child = self.hook(person, event);
            tally.lock().unwrap().processes += 1;
            loop {
                if child.try_wait().expect("waiting on a hook").is_some() {
                    let output = child.wait_with_output().expect("its output");
                    let mut tally = tally.lock().unwrap();
                    tally.finished += 1;
                    let n = tally.finished;
                    tally.lived = (tally.lived * (n - 1) + started.elapsed()) / n;
                    if output.status.code() != Some(0) {
                        tally.violations.push(format!(
                            "a hook exited with {:?}: {}",
                            output.status.code(),
                            String::from_utf8_lossy(&output.stderr).trim()
                        ));
                    }
                    return String::from_utf8_lossy(&output.stdout).into();
                }
                if kill_at.is_some_and(|at| at <= Instant::now()) {
                    child.kill().expect("SIGKILL");
                    let _ = child.wait();
                    let mut tally = tally.lock().unwrap();
                    tally.killed += 1;
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        unreachable!("the last try is never killed")
    }

    /// Proposes one transfer through its hooks, as Claude Code would: PreToolUse, asked again
    /// while killed, and on an allow the transfer's PostToolUse.
    fn propose(&self, call: &Proposed, rng: &mut Rng, tally: &Mutex<Tally>) -> Answer {
        let input = json!({"to": format!("acct_{}", call.call_id), "amount_cents": call.cents});
        let event = |name: &str| {
            json!({
                "hook_event_name": name,
                "session_id": format!("session-{}", call.requester),
                "tool_name": "send_transfer",
                "tool_input": input,
                "tool_use_id": call.call_id,
                "tool_response": {"sent_cents": call.cents},
            })
        };
        let answer = self.answered(call.requester, &event("PreToolUse"), rng, tally);
        let answer: Value = serde_json::from_str(answer.trim()).unwrap_or(Value::Null);
        let decided = &answer["hookSpecificOutput"];
        let reason = decided["permissionDecisionReason"].as_str().unwrap_or("");
        match decided["permissionDecision"].as_str() {
            Some("allow") => {
                if decided["updatedInput"] != input {
                    tally.lock().unwrap().violations.push(format!(
                        "{} allowed with {}, not the proposed {input}",
                        call.call_id, decided["updatedInput"]
                    ));
                }
                self.answered(call.requester, &event("PostToolUse"), rng, tally);
                Answer::Allowed
            }
            Some("ask") => Answer::Asked,
            Some("deny") if reason.contains("already handed") => Answer::ClaimedByKilled,
            _ => {
                tally.lock().unwrap().violations.push(format!(
                    "{} answered {answer}, which no rule of the policy gives",
                    call.call_id
                ));
                Answer::Asked
            }
        }
    }

    /// The transfers, each requester's in a row so that the ones in flight at once are mostly
    /// one requester's, racing for the same hour's total.
    fn plan(&self, rng: &mut Rng) -> Vec<Proposed> {
        let requesters = &REQUESTERS[..self.requesters.clamp(1, REQUESTERS.len())];
        (0..self.calls)
            .map(|i| Proposed {
                call_id: format!("toolu_campaign_{i:05}"),
                requester: requesters[i * requesters.len() / self.calls.max(1)],
                // USD 40 to USD 160: four to twelve fit in an hour's USD 500.
                cents: 4_000 + 1_000 * rng.below(13) as i64,
                answer: Answer::Asked,
            })
            .collect()
    }

    /// The whole campaign: the hooks (blocking), the sweep, then the verdict read from `store`.
    pub async fn run(self, store: Arc<dyn ItemStore>) -> WindowFigures {
        let started = Instant::now();
        let mut rng = Rng::new(self.seed);
        self.write_agent();
        let mut figures = WindowFigures {
            store: self.store.name(),
            seed: self.seed,
            calls: self.calls,
            requesters: self.requesters.clamp(1, REQUESTERS.len()),
            ..WindowFigures::default()
        };
        let plan = self.plan(&mut rng);
        let seeds: Vec<u64> = plan.iter().map(|_| rng.next()).collect();
        let campaign = Arc::new(self);
        let c = campaign.clone();
        let (proposed, tally) = tokio::task::spawn_blocking(move || {
            let tally = Mutex::new(Tally {
                lived: Duration::from_millis(300),
                ..Tally::default()
            });
            let next = AtomicUsize::new(0);
            let answers = Mutex::new(BTreeMap::new());
            std::thread::scope(|scope| {
                for _ in 0..c.parallel.max(1) {
                    scope.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(call) = plan.get(i) else { return };
                            let answer = c.propose(call, &mut Rng::new(seeds[i]), &tally);
                            answers.lock().unwrap().insert(i, answer);
                        }
                    });
                }
            });
            let answers = answers.into_inner().unwrap();
            let proposed: Vec<Proposed> = plan
                .into_iter()
                .enumerate()
                .map(|(i, call)| Proposed {
                    answer: answers[&i],
                    ..call
                })
                .collect();
            (proposed, tally.into_inner().unwrap())
        })
        .await
        .unwrap();
        figures.processes = tally.processes;
        figures.killed = tally.killed;
        figures.violations = tally.violations;
        let count = |answer| proposed.iter().filter(|p| p.answer == answer).count();
        figures.allowed = count(Answer::Allowed);
        figures.waited = count(Answer::Asked);
        figures.claimed_by_killed = count(Answer::ClaimedByKilled);

        let c = campaign.clone();
        figures = tokio::task::spawn_blocking(move || {
            c.settle(&mut figures);
            figures
        })
        .await
        .unwrap();
        campaign.judge(&store, &proposed, &mut figures).await;
        figures.elapsed = started.elapsed();
        figures
    }

    /// The sweep with the clock a day ahead, past every deadline and lease, until it finds
    /// nothing more to do: the waiting transfers expire, and a claim nobody reported is an
    /// unknown outcome for the recovery owner.
    fn settle(&self, figures: &mut WindowFigures) {
        let run = |args: &[&str], what: &str| {
            let output = self
                .command(args)
                .arg("--json")
                .output()
                .expect("countersign runs");
            figures.processes += 1;
            if !output.status.success() {
                let stderr = String::from_utf8_lossy(&output.stderr);
                figures
                    .violations
                    .push(format!("{what} failed: {}", stderr.trim()));
                return None;
            }
            Some(serde_json::from_slice(&output.stdout).unwrap_or(Value::Null))
        };
        self.store.settle("1d", 10, run, |_| {});
    }

    /// Reads every call and every window slot, and names every rule broken.
    async fn judge(
        &self,
        store: &Arc<dyn ItemStore>,
        proposed: &[Proposed],
        figures: &mut WindowFigures,
    ) {
        let agents = self.agent_dir().display().to_string();
        let setup = Setup::load(Some(&agents), None).expect("the campaign's setup");
        let engine = reading_engine(store, &setup);
        let tenant = TenantId::parse("acme").unwrap();
        let agent = AgentName::parse("payments").unwrap();
        let mut violations = Vec::new();
        // action id -> (requester, amount, whether it counts in its window)
        let mut calls: BTreeMap<String, (&str, i64, bool)> = BTreeMap::new();
        let mut allowed_cents: BTreeMap<&str, i64> = BTreeMap::new();
        for call in proposed {
            let id = &call.call_id;
            let run = match engine.call_named(&tenant, &agent, id).await {
                Ok(Some(run)) => run,
                Ok(None) => {
                    violations.push(format!("{id} was never stored"));
                    continue;
                }
                Err(e) => {
                    violations.push(format!("{id}: unreadable: {e}"));
                    continue;
                }
            };
            let history = match engine.history(&tenant, &run).await {
                Ok(history) => history,
                Err(e) => {
                    violations.push(format!("{id}: unreadable: {e}"));
                    continue;
                }
            };
            let action = match history.actions.as_slice() {
                [action] => action,
                actions => {
                    violations.push(format!(
                        "{id} ({:?}) is {} with {} action versions, not one",
                        call.answer,
                        history.run.status.as_str(),
                        actions.len()
                    ));
                    continue;
                }
            };
            let expected = match call.answer {
                Answer::Allowed => ActionStatus::Succeeded,
                Answer::Asked => ActionStatus::Expired,
                Answer::ClaimedByKilled => ActionStatus::Unknown,
            };
            if action.status != expected || action.args.int("amount_cents") != Some(call.cents) {
                violations.push(format!(
                    "{id} ({:?}) is {} for {:?} cents, not {} for {}",
                    call.answer,
                    action.status.as_str(),
                    action.args.int("amount_cents"),
                    expected.as_str(),
                    call.cents
                ));
            }
            let counts = !matches!(
                action.status,
                ActionStatus::Rejected | ActionStatus::Expired | ActionStatus::Cancelled
            );
            let by_a_person = action
                .authorized_by
                .iter()
                .any(|actor| matches!(actor, Actor::Person { .. }));
            if counts && !by_a_person {
                *allowed_cents.entry(call.requester).or_default() += call.cents;
            }
            calls.insert(action.id.to_string(), (call.requester, call.cents, counts));
        }
        for (requester, cents) in &allowed_cents {
            figures.most_allowed_cents = figures.most_allowed_cents.max(*cents);
            if *cents > HOURLY_LIMIT_CENTS {
                violations.push(format!(
                    "{requester} was allowed {cents} cents without a person, past the hour's {HOURLY_LIMIT_CENTS}"
                ));
            }
        }
        // Each requester's hour, and the agent's: one slot per call, none for a call that does
        // not exist, voided exactly when the call stopped counting, with the call's amount.
        let mut partitions: Vec<(String, Option<&str>)> = REQUESTERS
            .iter()
            .map(|r| (format!("sent_1h#requester#{r}"), Some(*r)))
            .collect();
        partitions.push(("all_1h#agent#payments".into(), None));
        for (window_subject, requester) in partitions {
            let (window, subject) = window_subject.split_once('#').unwrap();
            let pk = keys::history_pk(&tenant, &agent, window, subject);
            let slots = query_all(store.as_ref(), &pk, keys::HISTORY_SLOT_PREFIX)
                .await
                .expect("the window's slots read");
            figures.slots += slots.len();
            let mut seen = BTreeSet::new();
            for slot in &slots {
                let body: Value = serde_json::from_str(&slot.body).expect("a slot's body");
                let action = body["action_id"].as_str().unwrap_or_default().to_string();
                let (void, amount) = (
                    body["void"].as_bool().unwrap_or(false),
                    body["amount"].as_i64().unwrap_or(0),
                );
                let Some(&(owner, cents, counts)) = calls.get(&action) else {
                    violations.push(format!("{pk} {}: no call {action} exists", slot.sk));
                    continue;
                };
                if !seen.insert(action.clone()) {
                    violations.push(format!("{pk}: {action} counted twice"));
                }
                if requester.is_some_and(|r| r != owner) {
                    violations.push(format!("{pk}: {action} is {owner}'s call"));
                }
                let wanted_amount = if window == "sent_1h" && counts {
                    cents
                } else {
                    0
                };
                if void == counts || amount != wanted_amount {
                    violations.push(format!(
                        "{pk} {}: {action} is {} with {amount}, its call {} {cents}",
                        slot.sk,
                        if void { "void" } else { "counted" },
                        if counts { "counts" } else { "no longer counts" }
                    ));
                }
            }
            for (action, (owner, _, _)) in &calls {
                if requester.is_none_or(|r| r == *owner) && !seen.contains(action) {
                    violations.push(format!("{pk}: no slot for {action}"));
                }
            }
        }
        figures.violations.extend(violations);
    }
}
