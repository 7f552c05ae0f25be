//! The lifecycle, driven as fast as the engine goes: start (the run pauses on a $250
//! reimbursement), a finance approver approves, the run resumes, pays and finishes. On the
//! embedded store the decision resumes the run in the deciding process; on DynamoDB it queues
//! the resume message on SQS and the bench's consumers take it, as the resume function does.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use shared::domain::approval::{Choice, DecisionRequest};
use shared::domain::ids::DecisionId;
use shared::domain::run::RunStatus;
use shared::engine::{ResumeReport, RunReport};
use shared::example::expense::{Ledger, SettlementOutcome};
use tokio::task::JoinSet;

use crate::BenchError;
use crate::meter::{Phase, within};
use crate::rig::Rig;
use crate::script::{self, PROPOSED_CENTS, claim_id};

/// Items of each kind one sweep touches at most: the sweep function's default budget.
pub const SWEEP_BUDGET: usize = 200;
/// How long the consumers wait for a resume message before they call the queue stalled.
const QUEUE_PATIENCE: Duration = Duration::from_secs(30);

/// How the approver's decision reaches the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deciding {
    /// Shown the approval first (the review page's read), the decision brings back the
    /// snapshot it came with: the engine then need not read the approval.
    FromSnapshot,
    /// Without a snapshot, as the CLI and Slack's buttons decide: the engine reads the
    /// approval first.
    ReadingFirst,
}

#[derive(Debug, Default)]
pub struct Samples {
    pub start: Vec<Duration>,
    pub decide: Vec<Duration>,
    pub resume: Vec<Duration>,
}

fn failed(what: String) -> impl FnOnce(shared::engine::EngineError) -> BenchError {
    move |e| BenchError::Run(format!("{what}: {e}"))
}

/// Runs the lifecycles of claims `range`, `concurrency` at a time, and returns how long they
/// took with each step's latencies.
pub async fn lifecycles(
    rig: &Arc<Rig>,
    range: Range<usize>,
    concurrency: usize,
    deciding: Deciding,
) -> Result<(Duration, Samples), BenchError> {
    let total = range.len();
    let next = Arc::new(AtomicUsize::new(range.start));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let finished = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (rig, next, samples) = (rig.clone(), next.clone(), samples.clone());
        workers.spawn(async move { decide_each(&rig, &next, range.end, &samples, deciding).await });
    }
    if rig.queue.is_some() {
        for _ in 0..concurrency.max(1) {
            let (rig, samples, finished) = (rig.clone(), samples.clone(), finished.clone());
            workers.spawn(async move { consume(&rig, total, &finished, &samples).await });
        }
    }
    join(workers).await?;
    let elapsed = began.elapsed();
    let samples = std::mem::take(&mut *samples.lock().expect("samples lock"));
    Ok((elapsed, samples))
}

async fn join(mut workers: JoinSet<Result<(), BenchError>>) -> Result<(), BenchError> {
    while let Some(joined) = workers.join_next().await {
        let outcome = joined.map_err(|e| BenchError::Run(format!("a bench task stopped: {e}")))?;
        if let Err(error) = outcome {
            workers.abort_all();
            return Err(error);
        }
    }
    Ok(())
}

async fn decide_each(
    rig: &Rig,
    next: &AtomicUsize,
    end: usize,
    samples: &Mutex<Samples>,
    deciding: Deciding,
) -> Result<(), BenchError> {
    loop {
        let n = next.fetch_add(1, Ordering::SeqCst);
        if n >= end {
            return Ok(());
        }
        let claim = claim_id(n);
        let began = Instant::now();
        let report = within(Phase::Start, rig.engine.start(script::task(&rig.tenant, n)))
            .await
            .map_err(failed(format!("start {claim}")))?;
        let start = began.elapsed();
        let approval = only_approval(&claim, &report)?;
        let request = DecisionRequest {
            decision_id: DecisionId::parse(&format!("bench-{n}")).expect("a decision id"),
            action_version: approval.action_version,
            choice: Choice::Approve,
        };
        let snapshot = match deciding {
            Deciding::FromSnapshot => {
                let review = rig.engine.approval_shown(&rig.tenant, &approval.id);
                let shown = within(Phase::Review, review)
                    .await
                    .map_err(failed(format!("show {claim}")))?;
                Some(shown.snapshot)
            }
            Deciding::ReadingFirst => None,
        };
        let began = Instant::now();
        let decided = within(
            Phase::Decide,
            rig.engine
                .decide_shown(&rig.approver, &approval.id, request, snapshot.as_deref()),
        )
        .await
        .map_err(failed(format!("approve {claim}")))?;
        let decide = began.elapsed();
        if rig.queue.is_none() {
            let status = decided.run.as_ref().map(|r| r.status);
            if status != Some(RunStatus::Done) {
                return Err(BenchError::Run(format!(
                    "{claim}: after the approval the run is {status:?}, not done"
                )));
            }
        }
        let mut samples = samples.lock().expect("samples lock");
        samples.start.push(start);
        samples.decide.push(decide);
    }
}

fn only_approval<'a>(
    claim: &str,
    report: &'a RunReport,
) -> Result<&'a shared::domain::approval::Approval, BenchError> {
    match (report.status, report.approvals.as_slice()) {
        (RunStatus::AwaitingApproval, [approval]) => Ok(approval),
        (status, approvals) => Err(BenchError::Run(format!(
            "{claim} should pause on one approval; it is {status} with {}",
            approvals.len()
        ))),
    }
}

/// Takes resume messages off the queue as the resume function does (receive, resume, delete)
/// until `target` runs have finished, counting them in `finished`.
async fn consume(
    rig: &Rig,
    target: usize,
    finished: &AtomicUsize,
    samples: &Mutex<Samples>,
) -> Result<(), BenchError> {
    let queue = rig.queue.as_ref().expect("consumers run on a queue");
    let mut last_progress = Instant::now();
    while finished.load(Ordering::SeqCst) < target {
        if last_progress.elapsed() > QUEUE_PATIENCE {
            return Err(BenchError::Run(format!(
                "no resume message for {QUEUE_PATIENCE:?}: {} of {target} runs finished",
                finished.load(Ordering::SeqCst)
            )));
        }
        let batch = within(Phase::Resume, queue.receive(10, Duration::from_secs(1)))
            .await
            .map_err(|e| BenchError::Run(e.to_string()))?;
        for received in batch {
            let message = received
                .message
                .map_err(|why| BenchError::Run(format!("an unreadable resume message: {why}")))?;
            let began = Instant::now();
            let report = within(Phase::Resume, rig.engine.consume(&message))
                .await
                .map_err(failed(format!("resume {}", message.key())))?;
            let took = began.elapsed();
            within(Phase::Resume, queue.delete(&received.receipt_handle))
                .await
                .map_err(|e| BenchError::Run(e.to_string()))?;
            samples.lock().expect("samples lock").resume.push(took);
            last_progress = Instant::now();
            match report {
                ResumeReport::Continued { run } if run.status == RunStatus::Done => {
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                // A message delivered twice changes nothing: not an error, not a finished run.
                ResumeReport::Ignored { .. } => {}
                other => {
                    return Err(BenchError::Run(format!(
                        "{}: the run did not finish: {other:?}",
                        message.key()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Starts the runs of claims `range` and leaves them to expire: the clock moves past the last
/// deadline.
pub async fn leave_overdue(
    rig: &Arc<Rig>,
    range: Range<usize>,
    concurrency: usize,
) -> Result<(), BenchError> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let latest = Arc::new(Mutex::new(None));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (rig, next, latest, end) = (rig.clone(), next.clone(), latest.clone(), range.end);
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= end {
                    return Ok(());
                }
                let claim = claim_id(n);
                let report = within(Phase::Setup, rig.engine.start(script::task(&rig.tenant, n)))
                    .await
                    .map_err(failed(format!("start {claim}")))?;
                let deadline = only_approval(&claim, &report)?.expires_at;
                let mut latest = latest.lock().expect("deadline lock");
                *latest = Some(latest.map_or(deadline, |d: chrono::DateTime<_>| d.max(deadline)));
            }
        });
    }
    join(workers).await?;
    if let Some(deadline) = *latest.lock().expect("deadline lock") {
        rig.clock.move_past(deadline);
    }
    Ok(())
}

/// One sweep after another until one finds nothing overdue.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Swept {
    pub expired: usize,
    pub calls: usize,
    #[serde(serialize_with = "crate::report::as_ms")]
    pub elapsed: Duration,
}

pub async fn sweep_until_clear(rig: &Rig) -> Result<Swept, BenchError> {
    let began = Instant::now();
    let (mut expired, mut calls) = (0, 0);
    loop {
        let report = within(Phase::Sweep, rig.engine.sweep(SWEEP_BUDGET))
            .await
            .map_err(failed("sweep".into()))?;
        calls += 1;
        expired += report.expired.len();
        if report.expired.is_empty() {
            break;
        }
    }
    Ok(Swept {
        expired,
        calls,
        elapsed: began.elapsed(),
    })
}

/// On DynamoDB: consumes the resume messages the sweep queued until `runs` runs finished.
pub async fn drain(
    rig: &Arc<Rig>,
    runs: usize,
    concurrency: usize,
) -> Result<Option<Duration>, BenchError> {
    if rig.queue.is_none() {
        return Ok(None);
    }
    let began = Instant::now();
    let finished = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (rig, finished, samples) = (rig.clone(), finished.clone(), samples.clone());
        workers.spawn(async move { consume(&rig, runs, &finished, &samples).await });
    }
    join(workers).await?;
    Ok(Some(began.elapsed()))
}

/// What the ledger holds at the end, against what the bench paid.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerCheck {
    pub expected: usize,
    pub payments: usize,
    pub duplicate_claims: usize,
    pub duplicate_keys: usize,
    /// Payments of claims that were never approved (their approval expired), or unknown ones.
    pub unexpected: Vec<String>,
    /// Payments of another amount than the $250 approved.
    pub wrong_amounts: usize,
}

impl LedgerCheck {
    pub fn ok(&self) -> bool {
        self.payments == self.expected
            && self.duplicate_claims == 0
            && self.duplicate_keys == 0
            && self.unexpected.is_empty()
            && self.wrong_amounts == 0
    }

    pub fn problem(&self) -> String {
        format!(
            "the ledger is wrong: {} payments for {} approvals, {} claims paid twice, {} keys used twice, {} payments never approved {:?}, {} of another amount",
            self.payments,
            self.expected,
            self.duplicate_claims,
            self.duplicate_keys,
            self.unexpected.len(),
            self.unexpected.iter().take(5).collect::<Vec<_>>(),
            self.wrong_amounts
        )
    }
}

/// Reads every payment of the bench's tenant: exactly one per approved claim, of $250, none for
/// a claim whose approval expired, no claim and no idempotency key twice.
pub async fn check_ledger(rig: &Rig, approved: Range<usize>) -> Result<LedgerCheck, BenchError> {
    let payments = within(
        Phase::Setup,
        Ledger::new(rig.store.clone()).payments(&rig.tenant),
    )
    .await
    .map_err(|e| BenchError::Run(format!("reading the ledger: {e}")))?;
    let expected: BTreeSet<String> = approved.map(claim_id).collect();
    let mut claims = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut check = LedgerCheck {
        expected: expected.len(),
        payments: payments.len(),
        duplicate_claims: 0,
        duplicate_keys: 0,
        unexpected: Vec::new(),
        wrong_amounts: 0,
    };
    for payment in &payments {
        if !claims.insert(payment.claim_id.clone()) {
            check.duplicate_claims += 1;
        }
        if !keys.insert(payment.idempotency_key.clone()) {
            check.duplicate_keys += 1;
        }
        if !expected.contains(&payment.claim_id) {
            check.unexpected.push(payment.claim_id.clone());
        }
        match &payment.outcome {
            SettlementOutcome::Paid { amount } if amount.cents() == PROPOSED_CENTS => {}
            _ => check.wrong_amounts += 1,
        }
    }
    Ok(check)
}
