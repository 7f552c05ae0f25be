//! The sweep handler on the events its schedules send, over the embedded store.

#[path = "../../../shared/tests/harness/mod.rs"]
mod harness;

use chrono::TimeDelta;
use harness::{Embedded, Harness};
use serde_json::Value;
use shared::adapters::emf::{Emf, Printed, rule_broken};
use shared::domain::run::RunStatus;

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[tokio::test]
async fn a_deadline_schedule_expires_what_is_overdue_and_the_run_is_told() {
    let h = Harness::new(Embedded::fresh()).await;
    let (engine, report, approval) = h.paused_on("c-102").await;
    h.clock.advance(TimeDelta::hours(25));

    let deadline = fixture(include_str!("fixtures/scheduler-deadline.json"));
    let swept = sweep::handle(&engine, deadline, 50, None).await.unwrap();

    assert_eq!(swept.expired, vec![approval.id]);
    let run = h.run(&engine, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert!(run.answer.unwrap().contains("expired"));
    assert!(h.payments().await.is_empty());
}

#[tokio::test]
async fn the_recurring_schedule_and_a_plain_scheduled_event_each_run_one_sweep() {
    let h = Harness::new(Embedded::fresh()).await;
    let (engine, _, first) = h.paused_on("c-102").await;
    h.clock.advance(TimeDelta::hours(25));
    let (_, second) = h.start_paused(&engine, "c-104").await;

    let schedule = fixture(include_str!("fixtures/scheduler-recurring.json"));
    let recurring = sweep::handle(&engine, schedule, 50, None).await.unwrap();
    assert_eq!(recurring.expired, vec![first.id], "only what is overdue");

    h.clock.advance(TimeDelta::hours(25));
    let scheduled = fixture(include_str!("fixtures/eventbridge-scheduled-event.json"));
    let plain = sweep::handle(&engine, scheduled, 50, None).await.unwrap();
    assert_eq!(plain.expired, vec![second.id]);

    let again = sweep::handle(&engine, Value::Null, 50, None).await.unwrap();
    assert!(again.expired.is_empty(), "sweeping twice changes nothing");
}

#[tokio::test]
async fn one_invocation_touches_at_most_its_budget() {
    let h = Harness::new(Embedded::fresh()).await;
    let engine = h.process().await;
    for claim in ["c-102", "c-104", "c-105"] {
        h.start_paused(&engine, claim).await;
    }
    h.clock.advance(TimeDelta::hours(25));

    let first = sweep::handle(&engine, Value::Null, 2, None).await.unwrap();
    let second = sweep::handle(&engine, Value::Null, 2, None).await.unwrap();
    assert_eq!((first.expired.len(), second.expired.len()), (2, 1));
}

#[tokio::test]
async fn the_recurring_schedule_prints_the_gauges_and_an_approval_s_one_time_wakes_do_not() {
    let h = Harness::new(Embedded::fresh()).await;
    let (engine, _, _) = h.paused_on("c-102").await;
    h.clock.advance(TimeDelta::minutes(10));
    let printed = Printed::default();
    let gauges = Emf::to(printed.clone());

    for one_time in [
        include_str!("fixtures/scheduler-reminder.json"),
        include_str!("fixtures/scheduler-deadline.json"),
    ] {
        sweep::handle(&engine, fixture(one_time), 50, Some(&gauges))
            .await
            .unwrap();
        assert!(printed.lines().is_empty(), "{one_time} reads no gauges");
    }

    let schedule = fixture(include_str!("fixtures/scheduler-recurring.json"));
    sweep::handle(&engine, schedule, 50, Some(&gauges))
        .await
        .unwrap();
    let lines = printed.lines();
    assert_eq!(lines.len(), 1, "one line per tenant and agent: {lines:?}");
    assert_eq!(rule_broken(&lines[0]), None);
    assert_eq!(lines[0]["tenant"], "acme");
    assert_eq!(lines[0]["agent"], "expense");
    assert_eq!(lines[0]["countersign_approvals_waiting"], 1.0);
    assert_eq!(lines[0]["countersign_approval_oldest_wait_seconds"], 600.0);
    assert_eq!(lines[0]["countersign_unknown_outcomes"], 0.0);
}
