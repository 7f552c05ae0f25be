//! The start function on a direct invoke and on an API Gateway POST /runs, over the embedded store.

#[path = "../../fixtures/apigw.rs"]
mod apigw;
#[path = "../../../shared/tests/harness/mod.rs"]
mod harness;

use std::sync::Arc;

use apigw::{http_event, status_and_body};
use harness::{Embedded, Harness, RecordingQueue};
use lambda_http::Context;
use serde_json::json;
use shared::domain::run::RunStatus;
use shared::engine::{Delivery, ResumeReport};
use shared::ports::queue::{QueueMessage, ResumeQueue};

async fn start(h: &Harness) -> start::Start {
    start_sending_to(h, Arc::new(RecordingQueue::default())).await
}

/// The start function as deployed: the runs `POST /runs` accepts go to `queue`.
async fn start_sending_to(h: &Harness, queue: Arc<dyn ResumeQueue>) -> start::Start {
    let process = h.process_with(|tools| tools, Delivery::Queue(queue)).await;
    start::Start::new(
        Arc::new(process.engine),
        Arc::new(shared::api::GatewayClaims::default()),
        h.claims.clone(),
    )
}

/// `POST /runs` through API Gateway: ana's expense claim c-101, which is paid without a person.
/// It must be accepted (202): the answer's body.
async fn ana_posts_c101(start: &start::Start) -> serde_json::Value {
    let event = http_event(
        "POST",
        "/runs",
        Some(json!({"claim_id": "c-101"})),
        "ana",
        "acme",
        &["employee"],
    );
    let response = start.handle(event, Context::default()).await.unwrap();
    let (status, body) = status_and_body(&response);
    assert_eq!(status, 202, "{body}");
    body
}

/// What the resume function does with each drive message `queue` holds, as another process:
/// the run driven until it is done, failed or paused.
async fn drive_queued(h: &Harness, queue: &RecordingQueue) -> Vec<shared::engine::RunReport> {
    let resume = h.process().await;
    let mut driven = Vec::new();
    for message in queue.drives() {
        match resume.consume(&QueueMessage::Drive(message)).await.unwrap() {
            ResumeReport::Continued { run } => driven.push(run),
            other => panic!("not driven: {other:?}"),
        }
    }
    driven
}

/// The run whose id `answer` gives, read by another process.
async fn run_named_by(h: &Harness, answer: &serde_json::Value) -> shared::domain::run::Run {
    let reader = h.process().await;
    let id = serde_json::from_value(answer["run_id"].clone()).unwrap();
    h.run(&reader, &id).await
}

#[tokio::test]
async fn a_direct_invoke_starts_the_run_and_returns_where_it_paused() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let event: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/direct-invoke.json")).unwrap();

    let report = start.handle(event, Context::default()).await.unwrap();

    assert_eq!(report["status"], "awaiting_approval");
    assert_eq!(report["approvals"][0]["args"]["amount_cents"], 25_000);
    let approval = &report["approvals"][0];
    let granted = chrono::DateTime::parse_from_rfc3339(approval["expires_at"].as_str().unwrap())
        .unwrap()
        - chrono::DateTime::parse_from_rfc3339(approval["created_at"].as_str().unwrap()).unwrap();
    assert_eq!(
        granted,
        chrono::TimeDelta::hours(2),
        "the invoke's ttl overrides the policy's 24h"
    );
}

#[tokio::test]
async fn a_direct_invoke_for_an_unknown_claim_or_with_extra_fields_is_refused() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let unknown = start
        .handle(json!({"claim_id": "c-999"}), Context::default())
        .await
        .unwrap_err();
    assert!(unknown.to_string().contains("claim c-999"), "{unknown}");
    let extra = start
        .handle(
            json!({"claim_id": "c-102", "requested_by": "dana"}),
            Context::default(),
        )
        .await
        .unwrap_err();
    assert!(extra.to_string().contains("requested_by"), "{extra}");
}

#[tokio::test]
async fn post_runs_through_api_gateway_accepts_the_run_at_once_and_the_queue_drives_it() {
    let h = Harness::new(Embedded::fresh()).await;
    let queue = Arc::new(RecordingQueue::default());
    let start = start_sending_to(&h, queue.clone()).await;

    let body = ana_posts_c101(&start).await;

    // Accepted and stored; nothing of it ran in the request.
    assert_eq!(body["status"], "running");
    let id = body["run_id"].as_str().unwrap();
    assert_eq!(body["links"]["self"], format!("/runs/{id}"));
    assert_eq!(run_named_by(&h, &body).await.status, RunStatus::Running);
    assert!(h.payments().await.is_empty());
    let drives = queue.drives();
    assert_eq!(drives.len(), 1, "{drives:?}");
    assert_eq!((drives[0].run_id.as_str(), drives[0].drive), (id, 0));
    assert_eq!(
        QueueMessage::Drive(drives[0].clone()).deduplication_id(),
        format!("{id}:drive:0")
    );

    // The resume function drives it from that message: paid once, done.
    let driven = drive_queued(&h, &queue).await;
    assert_eq!(driven[0].status, RunStatus::Done);
    assert_eq!(run_named_by(&h, &body).await.status, RunStatus::Done);
    assert_eq!(h.payments().await.len(), 1);
}

#[tokio::test]
async fn post_runs_whose_drive_message_cannot_be_sent_is_still_accepted_for_the_sweep() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start_sending_to(&h, Arc::new(harness::QueueDown)).await;

    let body = ana_posts_c101(&start).await;

    assert_eq!(run_named_by(&h, &body).await.status, RunStatus::Running);
    // Once its lease runs out, the sweep drives it.
    h.clock.advance(chrono::Duration::minutes(16));
    let swept = h.process().await.sweep(100).await.unwrap();
    assert_eq!(swept.redriven.len(), 1, "{swept:?}");
    assert_eq!(run_named_by(&h, &body).await.status, RunStatus::Done);
    assert_eq!(h.payments().await.len(), 1);
}

#[tokio::test]
async fn a_direct_invoke_of_an_agents_task_starts_the_run_for_the_requester_it_names() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let event = json!({
        "agent": "expense",
        "task": "Process expense claim c-102.",
        "tenant": "acme",
        "requested_by": "erin",
        "ttl": "1h",
    });

    let report = start.handle(event, Context::default()).await.unwrap();

    assert_eq!(report["status"], "awaiting_approval", "{report}");
    let approval = &report["approvals"][0];
    assert_eq!(approval["tool"], "reimburse");
    assert_eq!(
        approval["requested_by"],
        json!(["erin", "ben"]),
        "the requester it names, and the claim's employee the definition names"
    );
    let run = run_named_by(&h, &report).await;
    assert_eq!(run.requested_by.as_str(), "erin");
    assert_eq!(run.status, RunStatus::AwaitingApproval);
}

#[tokio::test]
async fn a_malformed_direct_invoke_is_an_error_that_names_the_field_and_writes_nothing() {
    let h = Harness::new(Embedded::fresh()).await;
    let start = start(&h).await;
    let task = || {
        json!({
            "agent": "expense",
            "task": "Process expense claim c-102.",
            "tenant": "acme",
            "requested_by": "erin",
        })
    };
    let with = |field: &str, value: serde_json::Value| {
        let mut event = task();
        event[field] = value;
        event
    };
    let without = |field: &str| {
        let mut event = task();
        event.as_object_mut().unwrap().remove(field);
        event
    };
    for (event, named) in [
        (with("tenant", json!("acme/globex")), "tenant"),
        (with("tenant", json!("")), "tenant"),
        (with("requested_by", json!("erin dana")), "requested_by"),
        (with("agent", json!("../expense")), "agent"),
        (with("roles", json!(["finance"])), "roles"),
        (with("ttl", json!("soon")), "ttl"),
        (without("requested_by"), "requested_by"),
        (without("tenant"), "tenant"),
        (with("claim_id", json!("c-102")), "agent"),
    ] {
        let refused = start
            .handle(event.clone(), Context::default())
            .await
            .unwrap_err();
        assert!(
            matches!(refused, start::StartError::BadEvent(_)),
            "{event}: {refused}"
        );
        assert!(refused.to_string().contains(named), "{event}: {refused}");
    }
    for (event, says, why) in [
        (with("agent", json!("payroll")), "payroll", "no such agent"),
        (
            with("ttl", json!("30days")),
            "longer than",
            "the policy bounds a caller's ttl",
        ),
    ] {
        let refused = start
            .handle(event.clone(), Context::default())
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains(says),
            "{why}: {event}: {refused}"
        );
    }

    let reader = h.process().await;
    assert_eq!(reader.pending(&harness::acme()).await.unwrap(), []);
    assert!(h.payments().await.is_empty());
}

/// An API Gateway event whose token's subject is an opaque id and whose `email` names the person.
fn event_with_email(
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
    opaque_sub: &str,
    email: &str,
    roles: &[&str],
) -> serde_json::Value {
    let mut event = http_event(method, path, body, opaque_sub, "acme", roles);
    event["requestContext"]["authorizer"]["jwt"]["claims"]["email"] = json!(email);
    event
}

#[tokio::test]
async fn with_the_person_claim_set_to_email_an_opaque_sub_still_cannot_approve_its_own_run() {
    let h = Harness::new(Embedded::fresh()).await;
    // The deployment names people by email, as an identity provider with opaque subjects needs.
    let auth: Arc<dyn shared::api::Authenticate> = Arc::new(
        shared::lambda::LambdaAuth::from_settings(|name| {
            (name == "COUNTERSIGN_PERSON_CLAIM").then(|| "email".to_string())
        })
        .unwrap(),
    );
    let queue = Arc::new(RecordingQueue::default());
    let start = start::Start::new(
        Arc::new(
            h.process_with(|tools| tools, Delivery::Queue(queue.clone()))
                .await
                .engine,
        ),
        auth.clone(),
        h.claims.clone(),
    );
    // The decide function, as another process over the same store.
    let decide = shared::lambda::with_gateway_claims(shared::api::router(
        Arc::new(h.process().await.engine),
        auth,
    ));
    let decide_as = |sub: &str, email: &str, approval: &str, id: &str| {
        let event = event_with_email(
            "POST",
            &format!("/approvals/{approval}/decisions"),
            Some(json!({"decision_id": id, "action_version": 1, "choice": "approve"})),
            sub,
            email,
            &["employee", "finance"],
        );
        let decide = decide.clone();
        async move {
            let response = shared::lambda::invoke(decide, event, Context::default())
                .await
                .unwrap();
            status_and_body(&response)
        }
    };

    // Given ben, signed in as an opaque subject, starts a run.
    let started = start
        .handle(
            event_with_email(
                "POST",
                "/runs",
                Some(json!({"agent": "expense", "task": "Process expense claim c-102."})),
                "0b6c5f3e-7a21-4a9e-9d2f-58e1c0a4b7d3",
                "ben@acme.example",
                &["employee"],
            ),
            Context::default(),
        )
        .await
        .unwrap();
    let (status, accepted) = status_and_body(&started);
    assert_eq!(status, 202, "{accepted}");
    drive_queued(&h, &queue).await;
    let read = event_with_email(
        "GET",
        &format!("/runs/{}", accepted["run_id"].as_str().unwrap()),
        None,
        "0b6c5f3e-7a21-4a9e-9d2f-58e1c0a4b7d3",
        "ben@acme.example",
        &["employee"],
    );
    let read = shared::lambda::invoke(decide.clone(), read, Context::default())
        .await
        .unwrap();
    let (status, report) = status_and_body(&read);
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["status"], "awaiting_approval", "{report}");
    let approval = report["approvals"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        report["approvals"][0]["requested_by"][0], "ben@acme.example",
        "the requester is the person claim, not the opaque sub: {report}"
    );

    // When a token with another opaque sub but ben's email decides: refused as his own request.
    let (status, own) = decide_as(
        "5d2e8a10-3c4b-4f6e-8a9d-0e1f2a3b4c5d",
        "ben@acme.example",
        &approval,
        "d-ben",
    )
    .await;
    assert_eq!(
        (status, own["error"]["code"].as_str()),
        (403, Some("own_request")),
        "{own}"
    );

    // Then a finance reviewer, named by email too, decides.
    let (status, decided) = decide_as(
        "7a9b0c1d-2e3f-4a5b-8c6d-7e8f9a0b1c2d",
        "dana@acme.example",
        &approval,
        "d-dana",
    )
    .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["decision"]["by"], "dana@acme.example");
    assert_eq!(decided["approval"]["status"], "approved");
}
