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

mod crashes;
mod decisions;
mod edits;
mod expiry;
mod races;
mod recovery;
mod resume;
mod turns;

use std::future::Future;
use std::slice::from_ref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration as StdDuration;

use chrono::Duration;
use shared::domain::action::{ActionStatus, ToolOutcome};
use shared::domain::approval::{ApprovalStatus, Choice, DecisionEffect};
use shared::domain::audit::AuditEvent;
use shared::domain::identity::Actor;
use shared::domain::ids::{ActionVersion, PersonId, Role, TenantId};
use shared::domain::run::RunStatus;
use shared::engine::records::{IndexShards, keys};
use shared::engine::{Delivery, ErrorKind, ResumeReport};
use shared::example::expense::task_for;

use serde_json::json;

use dynamodb_backend::DynamoDb;
use harness::{
    AnswerLost, Counted, Embedded, Gate, Hangs, Harness, Process, QueueDown, ReconcilesTogether,
    RecordingQueue, Script, Slow, Stalls, acme, addressed, approve, decision, edit, event_names,
    paid, reject, results_after_turn, resume_message, scripted_task, start_of_test, told_about,
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
