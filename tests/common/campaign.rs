//! The fault campaign: many approvals opened by the expense agent, then deciders (`countersign
//! review approve/reject/edit`, several racing on one approval) and, on DynamoDB, resume workers
//! (`countersign worker`), each a real process, SIGKILLed at seeded random moments while others
//! race them. On DynamoDB a few approved runs' resume messages first go through a crash loop:
//! five workers receive each and are killed before their first write, so it ends in the
//! dead-letter queue. Then the sweep runs with the clock moved past every lease and deadline
//! (`--clock-offset`, a debug-build testing aid), nobody moves a dead letter back, and the
//! outcome is judged from the store itself: the runs, actions and approvals the engine recorded,
//! and the ledger the tools wrote.
//!
//! `tests/fault_campaign.rs` runs it in CI; `scripts/fault-campaign` runs it longer.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::Value;
use shared::agents::Environment;
use shared::deploy::{self, Backing, Setup};
use shared::domain::action::ActionStatus;
use shared::domain::approval::ApprovalStatus;
use shared::domain::ids::{RunId, TenantId};
use shared::domain::run::RunStatus;
use shared::engine::{Delivery, Engine};
use shared::example::expense::{Ledger, SettlementOutcome};
use shared::ports::clock::SystemClock;
use shared::ports::scheduler::SweepOnly;
use shared::ports::store::ItemStore;

/// A small seeded generator (SplitMix64): the same seed makes the same choices and kill delays.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len() as u64) as usize]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to.saturating_sub(from) + 1))
    }
}

/// Which store the processes share.
pub enum Store {
    /// The SQLite file in the state directory; a decision resumes its run in the deciding process.
    Embedded,
    /// DynamoDB and SQS (the environment points the processes at them); `countersign worker`
    /// processes resume the runs.
    DynamoDb {
        env: Vec<(&'static str, String)>,
        /// The queue's own dead-letter queue, which nobody moves messages back from.
        dead_letters: DeadLetters,
    },
}

impl Store {
    pub fn name(&self) -> &'static str {
        match self {
            Store::Embedded => "the embedded store (SQLite)",
            Store::DynamoDb { .. } => "DynamoDB and SQS (serial moto)",
        }
    }

    /// `countersign ARGS` on the state directory `state` and this store, with nothing of the
    /// environment it runs in: no model key, agents, people, clock offset or notifications.
    pub fn countersign(&self, state: &Path, args: &[&str]) -> Command {
        let mut command = crate::common::countersign(state);
        command.args(args).env("RUST_LOG", "error");
        match self {
            Store::Embedded => {
                command.env("COUNTERSIGN_STORE", "embedded");
            }
            Store::DynamoDb { env, .. } => {
                command.envs(env.iter().map(|(k, v)| (k, v)));
            }
        }
        command
    }

    /// Settles what the processes left: the sweep (`review expire` with the clock `offset`
    /// ahead) until it finds nothing more to do, at most `rounds` times, then on DynamoDB
    /// `worker --once` until no message is left to resume. `run` runs each command to its
    /// end and answers its JSON, or `None` once one failed (which ends the settling); each
    /// sweep's report goes to `swept`.
    pub fn settle(
        &self,
        offset: &str,
        rounds: usize,
        mut run: impl FnMut(&[&str], &str) -> Option<Value>,
        mut swept: impl FnMut(&Value),
    ) {
        for _ in 0..rounds {
            let Some(answer) = run(&["review", "expire", "--clock-offset", offset], "the sweep")
            else {
                return;
            };
            let report = &answer["sweep"];
            swept(report);
            let did = ["expired", "reconciled", "abandoned", "redriven"]
                .iter()
                .map(|field| report[field].as_array().map_or(0, Vec::len))
                .sum::<usize>()
                + report["redelivered"].as_u64().unwrap_or(0) as usize;
            if did == 0 {
                break;
            }
        }
        if let Store::DynamoDb { .. } = self {
            for _ in 0..50 {
                let Some(worked) = run(&["worker", "--once"], "worker --once") else {
                    return;
                };
                if worked["resumed"].as_array().is_none_or(Vec::is_empty) {
                    break;
                }
            }
        }
    }
}

/// A resume queue and its dead-letter queue: a message workers received `max_receives` times
/// and never deleted goes there (template.yaml's maxReceiveCount), and its alarm fires.
pub struct DeadLetters {
    pub sqs: aws_sdk_sqs::Client,
    pub queue_url: String,
    pub dlq_url: String,
    pub max_receives: usize,
}

impl DeadLetters {
    /// How many messages of the queue at `url` are visible, and how many were received and
    /// are not yet back.
    async fn counts(&self, url: &str) -> (usize, usize) {
        let attributes = self
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .expect("the queue answers")
            .attributes
            .unwrap_or_default();
        let count = |name: &QueueAttributeName| {
            attributes
                .get(name)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        (
            count(&QueueAttributeName::ApproximateNumberOfMessages),
            count(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }

    /// Messages waiting in the dead-letter queue, which its alarm counts.
    pub async fn dead(&self) -> usize {
        self.counts(&self.dlq_url).await.0
    }

    /// Waits until the resume queue holds `visible` messages to receive and `received` ones
    /// not yet back; panics naming `what` after a while.
    async fn wait_for(&self, visible: usize, received: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let counts = self.counts(&self.queue_url).await;
            if counts == (visible, received) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the queue holds {counts:?} (visible, received), not ({visible}, {received})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A TCP endpoint that takes connections and never answers: a worker whose store is this one
/// receives its messages and then waits, before any write, until it is killed.
struct Unanswering {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepting: Option<std::thread::JoinHandle<()>>,
}

impl Unanswering {
    fn open() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let accepting = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((connection, _)) => held.push(connection),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            addr,
            stop,
            accepting: Some(accepting),
        }
    }
}

impl Drop for Unanswering {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

pub struct Campaign {
    /// Approvals the expense agent opens (one claim each).
    pub approvals: usize,
    pub seed: u64,
    pub store: Store,
    /// Where the state directory and the generated claims file live.
    pub dir: PathBuf,
    /// Approvals being decided at once (each by several racing processes).
    pub parallel: usize,
    /// Share of deciders SIGKILLed at a random moment of their life.
    pub kill_share: f64,
    /// Resume workers kept alive at once on DynamoDB, each killed at a random moment.
    pub workers: usize,
    /// Approved runs whose resume message goes through a crash loop on DynamoDB.
    pub crash_loops: usize,
}

/// What a campaign did and found.
#[derive(Debug, Default)]
pub struct Figures {
    pub store: &'static str,
    pub seed: u64,
    pub runs: usize,
    /// Approval records: the agent's, and the new versions edits opened.
    pub approvals: usize,
    pub processes: usize,
    pub killed: usize,
    pub killed_deciders: usize,
    pub killed_workers: usize,
    /// Decide commands that ended with an accepted decision.
    pub decisions: usize,
    /// Decide commands refused (lost a race, already decided, expired...).
    pub refused: usize,
    pub payments: usize,
    pub declines: usize,
    pub approved: usize,
    pub rejected: usize,
    pub expired: usize,
    pub superseded: usize,
    /// Actions the sweep settled by asking the tool (a worker or decider killed mid-call).
    pub reconciled: usize,
    /// Runs the sweep failed because their driver died (lease ran out).
    pub abandoned: usize,
    /// Runs the sweep drove again because their driver died mid-turn (lease ran out).
    pub redriven: usize,
    /// Resume messages the sweep found undelivered and sent again.
    pub redelivered: usize,
    pub sweep_rounds: usize,
    /// Resume messages the sweep sent again under a deduplication id of their own.
    pub resent: usize,
    /// Resume messages the sweep stopped sending again, leaving their runs to a person.
    pub resumes_given_up: usize,
    /// Approved runs whose resume message five killed workers received on purpose.
    pub crash_looped: usize,
    /// Resume messages in the dead-letter queue at the end (nobody moved one back).
    pub dead_lettered: usize,
    pub runs_stuck: usize,
    /// Every broken rule, in words; the campaign passes when this is empty.
    pub violations: Vec<String>,
    pub elapsed: Duration,
    /// How long opening, racing and settling took.
    pub phases: [Duration; 3],
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault campaign on {} (seed {}), {:.0?}:",
            self.store, self.seed, self.elapsed
        )?;
        writeln!(
            f,
            "  processes: {} started, {} SIGKILLed ({} deciders, {} resume workers)",
            self.processes, self.killed, self.killed_deciders, self.killed_workers
        )?;
        writeln!(
            f,
            "  approvals: {} for {} runs; decisions: {} accepted, {} refused",
            self.approvals, self.runs, self.decisions, self.refused
        )?;
        writeln!(
            f,
            "  approvals ended: {} approved, {} rejected, {} expired, {} superseded by edits",
            self.approved, self.rejected, self.expired, self.superseded
        )?;
        writeln!(
            f,
            "  ledger: {} payments, {} declines",
            self.payments, self.declines
        )?;
        writeln!(
            f,
            "  sweep ({} rounds): {} unknown outcomes reconciled, {} abandoned runs failed, {} driven again, {} resume messages redelivered",
            self.sweep_rounds, self.reconciled, self.abandoned, self.redriven, self.redelivered
        )?;
        if self.dead_lettered + self.resent + self.resumes_given_up > 0 {
            writeln!(
                f,
                "  resume messages: {} dead-lettered ({} crash-looped on purpose), none moved back; {} sent again by the sweep, {} given up",
                self.dead_lettered, self.crash_looped, self.resent, self.resumes_given_up
            )?;
        }
        writeln!(
            f,
            "  time: {:.1?} opening, {:.1?} racing and killing, {:.1?} settling",
            self.phases[0], self.phases[1], self.phases[2]
        )?;
        writeln!(
            f,
            "  runs stuck: {}; rules broken: {}",
            self.runs_stuck,
            self.violations.len()
        )?;
        for violation in &self.violations {
            writeln!(f, "    {violation}")?;
        }
        Ok(())
    }
}

/// A run the agent opened, and the approval it waits on.
#[derive(Debug, Clone)]
struct Opened {
    run: String,
    approval: String,
    tool: String,
    quorum: u64,
}

/// What the kind of each generated claim makes the agent propose.
#[derive(Clone, Copy)]
enum Kind {
    /// Lodging within its limit, above $75: one finance approver.
    One,
    /// Lodging capped at $750: two finance approvers.
    Two,
    /// A category the policy does not cover: a decline, which a person approves.
    Decline,
}

fn claim_id(i: usize) -> String {
    format!("c-{}", 10_000 + i)
}

/// A claims file with one claim per approval, none similar to another (each amount differs).
fn claims_toml(count: usize, rng: &mut Rng) -> String {
    let employees = ["ana", "ben", "chen"];
    let mut out = String::new();
    for i in 0..count {
        let kind = match rng.below(10) {
            0..=5 => Kind::One,
            6..=8 => Kind::Two,
            _ => Kind::Decline,
        };
        let (category, cents, nights) = match kind {
            Kind::One => ("lodging", 15_000 + i, Some(1)),
            Kind::Two => ("lodging", 80_000 + i, Some(3)),
            Kind::Decline => ("training", 30_000 + i, None),
        };
        out.push_str(&format!(
            "[[claims]]\nid = \"{}\"\ntenant = \"acme\"\nemployee = \"{}\"\ncategory = \"{category}\"\n\
             amount = \"${}.{:02}\"\n{}date = \"2026-10-{:02}\"\nmerchant = \"Merchant {i}\"\n\
             description = \"Fault campaign claim {i}\"\n\n",
            claim_id(i),
            rng.pick(&employees),
            cents / 100,
            cents % 100,
            nights.map(|n| format!("nights = {n}\n")).unwrap_or_default(),
            1 + i % 28,
        ));
    }
    out
}

impl Campaign {
    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn claims(&self) -> PathBuf {
        self.dir.join("claims.toml")
    }

    /// `countersign` on this campaign's state, claims and store, with the shipped agents.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = self.store.countersign(&self.state(), args);
        command.arg("--claims").arg(self.claims());
        command
    }

    /// Runs a command to its end and parses its `--json` answer.
    fn json(&self, args: &[&str]) -> (i32, Value, String) {
        let output = self
            .command(args)
            .arg("--json")
            .output()
            .expect("countersign runs");
        let json = serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim())
            .unwrap_or(Value::Null);
        (
            output.status.code().unwrap_or(-1),
            json,
            String::from_utf8_lossy(&output.stderr).into(),
        )
    }

    /// The whole campaign: processes first (blocking), then the verdict read from `store`.
    pub async fn run(self, store: Arc<dyn ItemStore>) -> Figures {
        let started = Instant::now();
        let mut rng = Rng::new(self.seed);
        std::fs::create_dir_all(&self.dir).expect("the campaign's directory");
        std::fs::write(self.claims(), claims_toml(self.approvals, &mut rng))
            .expect("the claims file");
        let campaign = Arc::new(self);
        let mut figures = Figures {
            store: campaign.store.name(),
            seed: campaign.seed,
            ..Figures::default()
        };

        let mut phase = Instant::now();
        let c = campaign.clone();
        let opened = tokio::task::spawn_blocking(move || c.open()).await.unwrap();
        figures.phases[0] = phase.elapsed();
        phase = Instant::now();
        figures.processes += opened.len();
        figures.runs = opened.len();

        let looped = match &campaign.store {
            Store::DynamoDb { dead_letters, .. } => {
                campaign
                    .crash_loop(&opened, dead_letters, &mut figures)
                    .await
            }
            Store::Embedded => vec![],
        };
        let racing: Vec<Opened> = opened
            .iter()
            .filter(|o| !looped.iter().any(|l| l.run == o.run))
            .cloned()
            .collect();
        let c = campaign.clone();
        let mut figures = tokio::task::spawn_blocking(move || {
            c.race(&racing, &mut rng, &mut figures);
            figures
        })
        .await
        .unwrap();
        figures.phases[1] = phase.elapsed();
        phase = Instant::now();

        // The sweep, with the clock moved past every lease and deadline, until every run ended
        // (or rounds run out: then what is left is reported stuck).
        let mut verdict = Verdict::default();
        for round in 1..=8 {
            figures.sweep_rounds = round;
            let c = campaign.clone();
            figures = tokio::task::spawn_blocking(move || {
                c.settle(round, &mut figures);
                figures
            })
            .await
            .unwrap();
            verdict = campaign.judge(&store, &opened, &looped).await;
            if verdict.runs_stuck == 0 && verdict.violations.is_empty() {
                break;
            }
            if matches!(campaign.store, Store::DynamoDb { .. }) {
                // A killed worker's message comes back after the queue's visibility timeout.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        figures.phases[2] = phase.elapsed();
        if let Store::DynamoDb { dead_letters, .. } = &campaign.store {
            figures.dead_lettered = dead_letters.dead().await;
        }
        figures.approvals = verdict.approvals;
        figures.payments = verdict.payments;
        figures.declines = verdict.declines;
        figures.approved = verdict.approved;
        figures.rejected = verdict.rejected;
        figures.expired = verdict.expired;
        figures.superseded = verdict.superseded;
        figures.runs_stuck = verdict.runs_stuck;
        figures.violations.extend(verdict.violations);
        figures.elapsed = started.elapsed();
        figures
    }

    /// A crash loop: approves `crash_loops` (at most a worker's batch of 10) of the opened
    /// approvals that one person decides, then has each resume message received by five
    /// workers killed before their first write (their store never answers), so its next
    /// receive moves it to the dead-letter queue.
    /// Between the second and third, the sweep finds the messages not acted on and hands them
    /// over again under their writers' deduplication ids, which the queue drops (the first are
    /// still there), as SQS does within its five minutes whatever became of the first. Returns
    /// the runs whose messages looped; the race leaves them alone.
    async fn crash_loop(
        &self,
        opened: &[Opened],
        dead_letters: &DeadLetters,
        figures: &mut Figures,
    ) -> Vec<Opened> {
        let looped: Vec<Opened> = opened
            .iter()
            .filter(|o| o.quorum == 1)
            .take(self.crash_loops.min(10))
            .cloned()
            .collect();
        for o in &looped {
            let (exit, _, stderr) = self.json(&["review", "approve", &o.approval, "--as", "dana"]);
            assert_eq!(exit, 0, "approving {}: {stderr}", o.approval);
            figures.processes += 1;
            figures.decisions += 1;
        }
        let n = looped.len();
        let store = Unanswering::open();
        for receive in 1..=dead_letters.max_receives {
            dead_letters
                .wait_for(n, 0, "the messages back after their visibility timeout")
                .await;
            let mut worker = self
                .command(&["worker"])
                .env(
                    "AWS_ENDPOINT_URL_DYNAMODB",
                    format!("http://{}", store.addr),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("countersign starts");
            figures.processes += 1;
            dead_letters
                .wait_for(0, n, "the worker received the messages")
                .await;
            worker.kill().expect("SIGKILL");
            let _ = worker.wait();
            figures.killed += 1;
            figures.killed_workers += 1;
            if receive == 2 {
                let (exit, swept, stderr) =
                    self.json(&["review", "expire", "--clock-offset", "1m"]);
                assert_eq!(exit, 0, "the sweep: {stderr}");
                figures.processes += 1;
                figures.redelivered += swept["sweep"]["redelivered"].as_u64().unwrap_or(0) as usize;
                dead_letters
                    .wait_for(n, 0, "the queue dropped the copies the sweep handed over")
                    .await;
            }
        }
        figures.crash_looped = n;
        looped
    }

    /// The expense agent opens one approval per claim, a few processes at a time.
    fn open(&self) -> Vec<Opened> {
        let next = AtomicUsize::new(0);
        let opened = std::sync::Mutex::new(BTreeMap::new());
        std::thread::scope(|scope| {
            for _ in 0..self.parallel.clamp(1, 4) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= self.approvals {
                            return;
                        }
                        let (exit, run, stderr) = self.json(&["agent", &claim_id(i)]);
                        assert_eq!(exit, 0, "agent {} failed: {stderr}", claim_id(i));
                        assert_eq!(run["status"], "awaiting_approval", "{run}");
                        let approval = &run["approvals"][0];
                        opened.lock().unwrap().insert(
                            i,
                            Opened {
                                run: run["run_id"].as_str().unwrap().to_string(),
                                approval: approval["id"].as_str().unwrap().to_string(),
                                tool: approval["tool"].as_str().unwrap().to_string(),
                                quorum: approval["quorum"].as_u64().unwrap(),
                            },
                        );
                    }
                });
            }
        });
        opened.into_inner().unwrap().into_values().collect()
    }

    /// The racers for one approval: two to four deciders, approving, rejecting or editing.
    fn racers(&self, opened: &Opened, rng: &mut Rng) -> Vec<Vec<String>> {
        let ap = opened.approval.as_str();
        let approve = |who: &'static str| vec!["review", "approve", ap, "--as", who];
        let reject = |who: &'static str| {
            vec![
                "review",
                "reject",
                ap,
                "--reason",
                "Not this one",
                "--as",
                who,
            ]
        };
        let edit = |who: &'static str, amount: &'static str| {
            vec![
                "review", "edit", ap, "--amount", amount, "--note", "Lower", "--as", who,
            ]
        };
        let choices: Vec<Vec<&str>> = match (opened.tool.as_str(), opened.quorum) {
            ("reimburse", 1) => vec![
                approve("dana"),
                approve("erin"),
                reject("dana"),
                reject("erin"),
                edit("dana", "100"),
            ],
            ("reimburse", _) => vec![
                approve("dana"),
                approve("erin"),
                approve("dana"),
                approve("erin"),
                reject("erin"),
                edit("dana", "400"),
                edit("erin", "600"),
            ],
            _ => vec![approve("dana"), approve("erin"), reject("dana")],
        };
        let count = 2 + rng.below(3) as usize;
        (0..count)
            .map(|_| rng.pick(&choices).iter().map(|s| s.to_string()).collect())
            .collect()
    }

    /// Deciders race on every approval, resume workers take the queue (DynamoDB), and a share
    /// of them is SIGKILLed at random moments while the others go on.
    fn race(&self, opened: &[Opened], rng: &mut Rng, figures: &mut Figures) {
        let mut groups: Vec<Vec<Vec<String>>> =
            opened.iter().map(|o| self.racers(o, rng)).collect();
        rng.shuffle(&mut groups);
        let mut groups = groups.into_iter();

        struct Live {
            child: Child,
            started: Instant,
            kill_at: Option<Instant>,
            worker: bool,
        }
        let spawn = |args: &[String]| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            self.command(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("countersign starts")
        };
        let workers = match self.store {
            Store::Embedded => 0,
            Store::DynamoDb { .. } => self.workers,
        };
        /// Whatever is still alive when the race ends early (a failed assertion) is killed too.
        struct Reaper(Vec<Live>);
        impl Drop for Reaper {
            fn drop(&mut self) {
                for l in &mut self.0 {
                    let _ = l.child.kill();
                    let _ = l.child.wait();
                }
            }
        }
        let mut reaper = Reaper(Vec::new());
        let live = &mut reaper.0;
        // How long a decider that decides lives when left alone: kills land anywhere in one and a
        // half of it, before, during and after its commit and the resume.
        let (mut lived, mut finished) = (Duration::from_millis(150), 0u32);
        let mut exits: BTreeMap<i32, usize> = BTreeMap::new();
        let mut deciding = true;
        while deciding || live.iter().any(|l| !l.worker) {
            let deciders = live.iter().filter(|l| !l.worker).count();
            if deciding && deciders < self.parallel * 2 {
                match groups.next() {
                    Some(group) => {
                        for racer in group {
                            let window = lived.as_millis() as u64 * 3 / 2;
                            let kill_at = rng
                                .chance(self.kill_share)
                                .then(|| Instant::now() + rng.millis(0, window));
                            live.push(Live {
                                child: spawn(&racer),
                                started: Instant::now(),
                                kill_at,
                                worker: false,
                            });
                            figures.processes += 1;
                        }
                    }
                    None => deciding = false,
                }
            }
            while deciding && live.iter().filter(|l| l.worker).count() < workers {
                live.push(Live {
                    child: spawn(&["worker".to_string()]),
                    started: Instant::now(),
                    kill_at: Some(Instant::now() + rng.millis(200, 2_500)),
                    worker: true,
                });
                figures.processes += 1;
            }
            let now = Instant::now();
            live.retain_mut(|l| {
                if let Some(status) = l.child.try_wait().expect("waiting on a child") {
                    let code = status.code().unwrap_or(-1);
                    *exits.entry(code).or_default() += 1;
                    if !l.worker {
                        match code {
                            0 => {
                                figures.decisions += 1;
                                let took = now - l.started;
                                finished += 1;
                                lived = (lived * (finished - 1) + took) / finished;
                            }
                            _ => figures.refused += 1,
                        }
                    }
                    return false;
                }
                let stop_workers = l.worker && !deciding;
                if stop_workers || l.kill_at.is_some_and(|at| at <= now) {
                    l.child.kill().expect("SIGKILL");
                    let _ = l.child.wait();
                    figures.killed += 1;
                    match l.worker {
                        true => figures.killed_workers += 1,
                        false => figures.killed_deciders += 1,
                    }
                    return false;
                }
                true
            });
            std::thread::sleep(Duration::from_millis(2));
        }
        for l in live.iter_mut() {
            l.child.kill().expect("SIGKILL");
            let _ = l.child.wait();
            figures.killed += 1;
            figures.killed_workers += 1;
        }
        live.clear();
        // Refusals exit 1 (lost a race, decided, expired) or 2 (bad input: none is sent); a
        // panic (101) or any other end is a bug.
        for (code, count) in &exits {
            if !matches!(code, 0 | 1) {
                figures.violations.push(format!(
                    "{count} processes exited with status {code} (not killed by the campaign)"
                ));
            }
        }
    }

    /// One round of the sweep with the clock `round` times three days ahead (past every
    /// deadline, lease and recheck the round before left), and on DynamoDB the workers that
    /// take what it queued.
    fn settle(&self, round: usize, figures: &mut Figures) {
        let offset = format!("{}d", 3 * round);
        let mut reports = Vec::new();
        self.store.settle(
            &offset,
            20,
            |args, what| self.settling(args, what, figures),
            |report| reports.push(report.clone()),
        );
        for report in reports {
            let count = |field: &str| report[field].as_array().map_or(0, Vec::len);
            figures.reconciled += count("reconciled");
            figures.abandoned += count("abandoned");
            figures.redriven += count("redriven");
            figures.redelivered += report["redelivered"].as_u64().unwrap_or(0) as usize;
            figures.resent += count("resent");
            figures.resumes_given_up += count("resumes_given_up");
        }
    }

    /// One settling process: counted, and its JSON answer, or `None` with a violation naming
    /// `what` failed.
    fn settling(&self, args: &[&str], what: &str, figures: &mut Figures) -> Option<Value> {
        let (exit, answer, stderr) = self.json(args);
        figures.processes += 1;
        if exit != 0 {
            figures
                .violations
                .push(format!("{what} failed (exit {exit}): {stderr}"));
            return None;
        }
        Some(answer)
    }

    /// Reads every run's records and the ledger, and names every rule broken; the runs whose
    /// messages looped must have run their approved call once, with its key, and finished.
    async fn judge(
        &self,
        store: &Arc<dyn ItemStore>,
        opened: &[Opened],
        looped: &[Opened],
    ) -> Verdict {
        let setup = Setup::load(None, Some(&self.claims())).expect("the campaign's setup");
        let engine = reading_engine(store, &setup);
        let tenant = TenantId::parse("acme").unwrap();
        let mut verdict = Verdict::default();
        // action_id:version -> (approval status, the amount it was approved for)
        let mut decided: BTreeMap<String, (ApprovalStatus, Option<i64>)> = BTreeMap::new();
        let mut succeeded = BTreeSet::new();
        // The key each looped run's approved call must have been settled with, once.
        let mut healed: BTreeMap<String, String> = BTreeMap::new();
        for o in opened {
            let run_id = RunId::parse(&o.run).unwrap();
            let history = match engine.history(&tenant, &run_id).await {
                Ok(history) => history,
                Err(e) => {
                    verdict
                        .violations
                        .push(format!("{}: unreadable: {e}", o.run));
                    continue;
                }
            };
            if looped.iter().any(|l| l.run == o.run) {
                let approved = history.actions.iter().find(|a| {
                    a.approval_id.as_ref().map(|id| id.as_str()) == Some(o.approval.as_str())
                });
                match (history.run.status, approved) {
                    (RunStatus::Done, Some(action)) => {
                        healed.insert(action.key(), o.run.clone());
                    }
                    (status, _) => verdict.violations.push(format!(
                        "{} (its resume crash-looped) is {} without its approved call",
                        o.run,
                        status.as_str()
                    )),
                }
            }
            if !matches!(
                history.run.status,
                RunStatus::Done | RunStatus::Failed | RunStatus::Cancelled
            ) {
                verdict.runs_stuck += 1;
                verdict
                    .violations
                    .push(format!("{} is {}", o.run, history.run.status.as_str()));
            }
            for approval in &history.approvals {
                verdict.approvals += 1;
                match approval.status {
                    ApprovalStatus::Approved => verdict.approved += 1,
                    ApprovalStatus::Rejected => verdict.rejected += 1,
                    ApprovalStatus::Expired => verdict.expired += 1,
                    ApprovalStatus::Superseded => verdict.superseded += 1,
                    _ => {}
                }
            }
            for action in &history.actions {
                match action.status {
                    ActionStatus::Executing | ActionStatus::Unknown | ActionStatus::Approved => {
                        verdict.violations.push(format!(
                            "{} of {} is {}",
                            action.key(),
                            o.run,
                            action.status.as_str()
                        ));
                    }
                    // The calls that settle a claim; the reads settle nothing.
                    ActionStatus::Succeeded
                        if matches!(action.tool.as_str(), "reimburse" | "decline") =>
                    {
                        succeeded.insert(action.key());
                    }
                    _ => {}
                }
                if let Some(approval) = history
                    .approvals
                    .iter()
                    .find(|a| Some(&a.id) == action.approval_id.as_ref())
                {
                    decided.insert(
                        action.key(),
                        (approval.status, action.args.int("amount_cents")),
                    );
                }
            }
        }
        let settlements = Ledger::new(store.clone())
            .all(&tenant)
            .await
            .expect("the ledger reads");
        let mut per_claim: BTreeMap<&str, usize> = BTreeMap::new();
        let mut settled_keys = BTreeSet::new();
        for s in &settlements {
            *per_claim.entry(s.claim_id.as_str()).or_default() += 1;
            settled_keys.insert(s.idempotency_key.clone());
            let paid = match &s.outcome {
                SettlementOutcome::Paid { amount } => {
                    verdict.payments += 1;
                    Some(amount.cents())
                }
                SettlementOutcome::Declined { .. } => {
                    verdict.declines += 1;
                    None
                }
            };
            match decided.get(&s.idempotency_key) {
                Some((ApprovalStatus::Approved, approved)) => {
                    if paid.is_some() && paid != *approved {
                        verdict.violations.push(format!(
                            "{} paid {paid:?} cents, approved for {approved:?}",
                            s.claim_id
                        ));
                    }
                }
                Some((status, _)) => verdict.violations.push(format!(
                    "{} settled by {} whose approval is {}",
                    s.claim_id,
                    s.idempotency_key,
                    status.as_str()
                )),
                None => verdict.violations.push(format!(
                    "{} settled by {}, which no approval let run",
                    s.claim_id, s.idempotency_key
                )),
            }
            if !succeeded.contains(&s.idempotency_key) {
                verdict.violations.push(format!(
                    "{} settled by {}, but the engine did not record that call as succeeded",
                    s.claim_id, s.idempotency_key
                ));
            }
        }
        for (key, run) in &healed {
            let settled = settlements
                .iter()
                .filter(|s| &s.idempotency_key == key)
                .count();
            if settled != 1 {
                verdict.violations.push(format!(
                    "{run} (its resume crash-looped): its approved call {key} settled {settled} times"
                ));
            }
        }
        for (claim, count) in per_claim {
            if count > 1 {
                verdict
                    .violations
                    .push(format!("{claim} settled {count} times"));
            }
        }
        for key in &succeeded {
            if !settled_keys.contains(key) {
                verdict.violations.push(format!(
                    "{key} recorded as succeeded, but the ledger has no settlement from it"
                ));
            }
        }
        verdict
    }
}

#[derive(Debug, Default)]
struct Verdict {
    approvals: usize,
    approved: usize,
    rejected: usize,
    expired: usize,
    superseded: usize,
    payments: usize,
    declines: usize,
    runs_stuck: usize,
    violations: Vec<String>,
}

/// An engine over `store` and `setup` that only reads: the judge's, after the processes ended.
pub fn reading_engine(store: &Arc<dyn ItemStore>, setup: &Setup) -> Engine {
    let backing = Backing {
        store: store.clone(),
        delivery: Delivery::InProcess,
        scheduler: Arc::new(SweepOnly),
        clock: Arc::new(SystemClock),
    };
    deploy::engine(backing, setup, false, Environment::WhenRun).expect("an engine to read with")
}

/// Where a campaign keeps its state: under the system's temporary directory, unique per run.
pub fn scratch(name: &str) -> PathBuf {
    crate::common::fresh_path(&format!("countersign-fault-{name}"))
}

/// A number from the environment (the script's arguments), or the default.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        _ => default,
    }
}

/// Removes a directory tree, ignoring what is already gone.
pub fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
