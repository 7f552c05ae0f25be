//! The engine's scenarios, end to end over a real item store: the expense agent proposes, people
//! decide (sometimes from another process, sometimes late), and the approved call runs once.
//!
//! One test binary (one link), a module a subject. Each scenario is a function of the harness,
//! instantiated per backend at the bottom of its module. The race scenarios run on both stores
//! too; on DynamoDB they need the local stack's serial mode, since moto is not safe under
//! concurrency otherwise.

#[macro_use]
#[path = "../harness/mod.rs"]
mod harness;
#[path = "../harness/dynamodb.rs"]
mod dynamodb_backend;
#[path = "../support/mod.rs"]
mod support;

/// Each scenario listed, as a test on the embedded store and one on DynamoDB (moto over HTTP).
macro_rules! on_both_stores {
    ([$($scenario:ident),* $(,)?]) => {
        on_backend!(embedded, Embedded::fresh(), [$($scenario),*]);
        on_backend!(dynamodb, DynamoDb::fresh("scenario").await, [$($scenario),*]);
    };
}

mod claims;
mod crashes;
mod decisions;
mod edits;
mod environment;
mod expiry;
mod figures;
mod gate;
mod history;
mod limits;
mod open_approvals;
mod pages;
mod policy_rules;
mod races;
mod recovery;
mod resume;
mod snapshots;
mod tenants;
mod turns;

use std::future::Future;
use std::slice::from_ref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration as StdDuration;

use chrono::Duration;
use shared::domain::action::{Action, ActionStatus, ToolOutcome};
use shared::domain::approval::{Approval, ApprovalStatus, Choice, DecisionEffect, DecisionRequest};
use shared::domain::audit::{AuditEntry, AuditEvent};
use shared::domain::identity::{Actor, Identity};
use shared::domain::ids::{ActionVersion, ApprovalId, PersonId, Role, TenantId};
use shared::domain::run::{Run, RunStatus};
use shared::engine::records::{IndexShards, keys};
use shared::engine::{
    DecisionReport, Delivery, EngineError, ErrorKind, History, ResumeReport, RunReport,
};
use shared::example::expense::task_for;
use shared::testing::JsonLog;
use tokio::sync::Barrier;

use serde_json::json;

use dynamodb_backend::DynamoDb;
use harness::{
    AnswerLost, Around, Counted, Embedded, Gate, Hangs, Harness, Process, QueueDown,
    ReconcilesTogether, RecordingQueue, RefusesWrites, Script, Slow, Stalls, acme, approve,
    decision, edit, event_names, on_reimburse, paid, reject, results_after_turn, resume_message,
    scripted_task, start_of_test, told_about,
};

fn person(name: &str) -> PersonId {
    PersonId::parse(name).unwrap()
}

fn finance() -> Role {
    Role::parse("finance").unwrap()
}

fn v(n: u32) -> ActionVersion {
    ActionVersion::new(n).unwrap()
}

/// A scripted call of reimburse: `cents` on `claim`.
fn reimburse(claim: &str, cents: i64) -> (&'static str, serde_json::Value) {
    (
        "reimburse",
        json!({"claim_id": claim, "amount_cents": cents}),
    )
}

/// A scripted call of decline: `claim`, for `reason`.
fn decline(claim: &str, reason: &str) -> (&'static str, serde_json::Value) {
    ("decline", json!({"claim_id": claim, "reason": reason}))
}

/// A payment as [`paid`] lists it: `cents` on `claim`, by version `version` of the approval's
/// action.
fn payment(claim: &str, cents: i64, approval: &Approval, version: u32) -> (String, i64, String) {
    (
        claim.to_string(),
        cents,
        format!("{}:{version}", approval.action_id),
    )
}

/// The action `approval` asks about, as the history holds it.
fn action_of<'a>(history: &'a History, approval: &Approval) -> &'a Action {
    history
        .actions
        .iter()
        .find(|a| a.id == approval.action_id)
        .expect("the approval's action is in the history")
}

/// Asserts the model was told of its last `tool` call as an error saying `saying`.
fn assert_told_error(run: &Run, tool: &str, saying: &str) {
    let told = told_about(run, tool);
    assert!(told.is_error, "{told:?}");
    assert!(told.content.contains(saying), "{}", told.content);
}

/// What the model was told of its last `tool` call, which did not run: an answer, not an
/// error, starting "Not executed:".
fn told_not_executed(run: &Run, tool: &str) -> String {
    let told = told_about(run, tool);
    assert!(!told.is_error, "not running is an answer, not an error");
    assert!(
        told.content.starts_with("Not executed:"),
        "{}",
        told.content
    );
    told.content
}

/// Asserts `approval` is stored as `status`, with no decision recorded, and nothing is paid.
async fn assert_undecided(h: &Harness, p: &Process, approval: &Approval, status: ApprovalStatus) {
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, status);
    assert!(stored.decisions.is_empty(), "{stored:?}");
    assert!(h.payments().await.is_empty(), "nothing is paid");
}

/// c-102 started on a process whose reimburse calls take effect but lose their answers: the
/// calls made, the process, the run and its approval.
async fn paused_where_answers_are_lost(
    h: &Harness,
) -> (Arc<AtomicUsize>, Process, RunReport, Approval) {
    let calls = Arc::new(AtomicUsize::new(0));
    let p = h
        .reimbursing_through(AnswerLost(Counted::new(&calls)))
        .await;
    let (report, approval) = h.start_paused(&p, "c-102").await;
    (calls, p, report, approval)
}

/// A process that delivers resume messages to a queue that only records them, and c-102
/// started on it and approved by dana: the process, the queue (its one message published), the
/// run and the approval.
async fn approved_through_a_queue(
    h: &Harness,
) -> (Process, Arc<RecordingQueue>, RunReport, Approval) {
    let queue = Arc::new(RecordingQueue::default());
    let decider = h
        .process_with(|tools| tools, Delivery::Queue(queue.clone()))
        .await;
    let (report, approval) = h.start_paused(&decider, "c-102").await;
    h.decided(&decider, "dana", &approval.id, approve("d-1"))
        .await;
    assert_eq!(queue.published(), [resume_message(&approval)]);
    (decider, queue, report, approval)
}

/// How many entries each shard of a sharded index holds, whatever they are due.
async fn per_shard(p: &Process, index: &str, shards: IndexShards) -> Vec<usize> {
    let shards = p.index_shards(index, shards).await;
    shards.iter().map(Vec::len).collect()
}

/// Asserts `refused` is the refusal `code`, of `kind`.
#[track_caller]
fn assert_refusal(refused: &EngineError, code: &str, kind: ErrorKind) {
    assert_eq!((refused.code(), refused.kind()), (code, kind), "{refused}");
}

/// How many audit entries bear each of `names`.
fn times<const N: usize>(entries: &[AuditEntry], names: [&str; N]) -> [usize; N] {
    let all = event_names(entries);
    names.map(|name| all.iter().filter(|n| **n == name).count())
}

/// Runs `one` and `other` each on a task of its own, released at the same moment.
async fn at_once<A, B>(one: A, other: B) -> (A::Output, B::Output)
where
    A: Future + Send + 'static,
    A::Output: Send + 'static,
    B: Future + Send + 'static,
    B::Output: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(2));
    let (one, other) = {
        let (b1, b2) = (barrier.clone(), barrier);
        (
            tokio::spawn(async move {
                b1.wait().await;
                one.await
            }),
            tokio::spawn(async move {
                b2.wait().await;
                other.await
            }),
        )
    };
    (one.await.unwrap(), other.await.unwrap())
}

/// `who` deciding `request` on `approval` through `process`, as a future that owns what it needs
/// (for a task of its own).
fn deciding(
    process: &Arc<Process>,
    who: Identity,
    approval: &ApprovalId,
    request: DecisionRequest,
) -> impl Future<Output = Result<DecisionReport, EngineError>> + Send + 'static {
    let (process, approval) = (process.clone(), approval.clone());
    async move { process.decide(&who, &approval, request).await }
}
