//! Deciding where reviewers are: every notice and reminder links to its approval on the review
//! page when the page's public address is configured, and carries no link when it is not; with
//! a Slack app, a notice's Approve and Reject buttons decide through `POST /slack/interactions`,
//! signed as Slack signs its requests, served over loopback, each answer an ephemeral message
//! posted to a loopback stand-in for Slack's `response_url`.

#[macro_use]
mod harness;
// Only the receiver of the shared notification helpers is used here.
#[allow(dead_code)]
#[path = "harness/notices.rs"]
mod notices;

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::Duration;
use serde_json::{Value, json};
use shared::adapters::slack::{SigningSecret, SlackApp, sign};
use shared::adapters::webhook::{Webhooks, public_url};
use shared::api::{Authenticate, BearerJwt};
use shared::domain::approval::{Approval, ApprovalStatus, Choice};
use shared::domain::ids::ActionVersion;
use shared::domain::money::Amount;
use shared::engine::Engine;
use shared::example::expense::OfflineExpenseAgent;
use shared::ports::clock::Clock;
use shared::ports::notifier::Notifier;

use harness::{Embedded, Harness, Process, acme, approve, decision};
use notices::{Received, Receiver};

const QUICK: StdDuration = StdDuration::from_millis(500);

async fn posting_with_link(h: &Harness, receiver: &Receiver, link_to: Option<&str>) -> Process {
    let webhooks = Webhooks::new(&[receiver.url().to_string()], QUICK)
        .unwrap()
        .with_public_url(link_to.map(|url| public_url(url).unwrap()));
    let notifier: Arc<dyn Notifier> = Arc::new(webhooks);
    h.process_configured(
        Arc::new(OfflineExpenseAgent),
        |store| store,
        |b| b.notifier(notifier),
    )
    .await
}

fn section_text(body: &serde_json::Value) -> String {
    body["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "section")
        .and_then(|b| b["text"]["text"].as_str())
        .expect("a section block")
        .to_string()
}

#[tokio::test]
async fn every_notice_and_reminder_links_to_its_approval_on_the_review_page() {
    let h = Harness::new(Embedded::fresh()).await;
    let receiver = Receiver::ok().await;
    let p = posting_with_link(&h, &receiver, Some("https://review.acme.example/")).await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    h.clock.set(harness::start_of_test() + Duration::hours(23));
    let swept = p.sweep(100).await.unwrap();
    assert_eq!(swept.notices.sent, 1, "{swept:?}");

    let requests = receiver.requests();
    let kinds: Vec<&str> = requests.iter().map(|r| r.notice()).collect();
    assert_eq!(kinds, ["approval_requested", "reminder"]);
    let link = format!("https://review.acme.example/#approval={}", approval.id);
    for request in &requests {
        let details = section_text(&request.body);
        assert!(
            details.contains(&format!("*Review:* <{link}|Open it on the review page>")),
            "{details}"
        );
        assert_eq!(request.body["countersign"]["review_url"], link.as_str());
    }
}

#[tokio::test]
async fn without_a_public_address_a_notice_carries_no_link() {
    let h = Harness::new(Embedded::fresh()).await;
    let receiver = Receiver::ok().await;
    let p = posting_with_link(&h, &receiver, None).await;
    h.start_paused(&p, "c-102").await;

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let details = section_text(&requests[0].body);
    assert!(!details.contains("*Review:*"), "{details}");
    assert!(!details.contains("#approval="), "{details}");
    assert!(requests[0].body["countersign"]["review_url"].is_null());
}

// ---------------------------------------------------------------------------------------------
// Approve and reject from Slack
// ---------------------------------------------------------------------------------------------

const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// The decision API with a Slack app, on loopback; notices (with buttons) go to `notices`, and
/// answers to clicks to `slack`, the stand-in for Slack's `response_url` host.
struct SlackSetup {
    h: Harness,
    engine: Arc<Engine>,
    api: String,
    notices: Receiver,
    slack: Receiver,
    http: reqwest::Client,
}

impl SlackSetup {
    async fn new() -> Self {
        let h = Harness::new(Embedded::fresh()).await;
        let notices = Receiver::ok().await;
        let slack = Receiver::ok().await;
        let webhooks = Webhooks::new(&[notices.url().to_string()], QUICK)
            .unwrap()
            .with_buttons(true);
        let notifier: Arc<dyn Notifier> = Arc::new(webhooks);
        let Process { engine, .. } = h
            .process_configured(
                Arc::new(OfflineExpenseAgent),
                |store| store,
                |b| b.notifier(notifier),
            )
            .await;
        let engine = Arc::new(engine);
        let hooks = format!("http://{}/", slack.host());
        let app = SlackApp::new(
            SigningSecret::new(SECRET).unwrap(),
            h.directory.clone(),
            &hooks,
        )
        .unwrap();
        let auth: Arc<dyn Authenticate> = Arc::new(BearerJwt::hs256(&[7; 32]).unwrap());
        let router = shared::api::router_with_slack(engine.clone(), auth, Some(Arc::new(app)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self {
            h,
            engine,
            api,
            notices,
            slack,
            http: reqwest::Client::new(),
        }
    }

    /// The button `label` ("Approve", "Reject") of the last notice posted for `approval`.
    fn button(&self, approval: &Approval, label: &str) -> Value {
        let posted: Vec<Received> = self
            .notices
            .requests()
            .into_iter()
            .filter(|r| r.approval_id() == approval.id.as_str())
            .collect();
        let last = posted.last().expect("a notice of this approval");
        let actions = last.body["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("the notice carries buttons")
            .clone();
        actions["elements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["text"]["text"].as_str().unwrap().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} button in {actions}"))
            .clone()
    }

    /// The form Slack posts when `user` clicks `button`, as its block_actions payload documents.
    fn click_body(&self, button: &Value, user: &str) -> String {
        let payload = json!({
            "type": "block_actions",
            "user": {"id": user, "username": user.to_lowercase(), "team_id": "T0ACME001"},
            "api_app_id": "A0COUNTER1",
            "token": "legacy-verification-token-unused",
            "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "C0REVIEW1", "is_ephemeral": false},
            "trigger_id": "1234567890.0987654321.abcdef",
            "team": {"id": "T0ACME001", "domain": "acme"},
            "channel": {"id": "C0REVIEW1", "name": "approvals"},
            "response_url": format!("{}?click={user}", self.slack.url()),
            "actions": [{
                "type": "button",
                "block_id": "countersign.decide",
                "action_id": button["action_id"],
                "text": button["text"],
                "value": button["value"],
                "style": button["style"],
                "action_ts": "1700000001.000200",
            }],
        });
        serde_urlencoded::to_string([("payload", payload.to_string())]).unwrap()
    }

    /// Posts `body` to /slack/interactions with the given timestamp and signature headers.
    async fn post(&self, body: &str, timestamp: &str, signature: &str) -> (u16, Value) {
        let reply = self
            .http
            .post(format!("{}/slack/interactions", self.api))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", timestamp)
            .header("x-slack-signature", signature)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = reply.status().as_u16();
        (status, reply.json().await.unwrap())
    }

    /// `body` signed now, as Slack signs it.
    async fn signed(&self, body: &str) -> (u16, Value) {
        let now = self.h.clock.now().timestamp().to_string();
        let signature = sign(&SigningSecret::new(SECRET).unwrap(), &now, body.as_bytes());
        self.post(body, &now, &signature).await
    }

    /// `user` clicks `label` on the last notice of `approval`; the ephemeral answer's text.
    async fn click(&self, approval: &Approval, label: &str, user: &str) -> String {
        let body = self.click_body(&self.button(approval, label), user);
        let (status, answer) = self.signed(&body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["response_type"], "ephemeral", "{answer}");
        assert_eq!(answer["replace_original"], false, "{answer}");
        let text = answer["text"].as_str().unwrap().to_string();
        let told = self.slack.requests();
        let last = told.last().expect("the answer went to the response_url");
        assert_eq!(last.body, answer, "the response_url got the same message");
        text
    }

    async fn stored(&self, approval: &Approval) -> Approval {
        self.engine.approval(&acme(), &approval.id).await.unwrap()
    }
}

#[tokio::test]
async fn a_signed_click_on_approve_decides_as_the_mapped_person_once() {
    let s = SlackSetup::new().await;
    let (report, approval) = s.h.start_paused(&s.engine, "c-102").await;
    let approve = s.button(&approval, "Approve");
    assert_eq!(
        approve["action_id"],
        format!("countersign.approve.{}.v1", approval.id)
    );
    let bound: Value = serde_json::from_str(approve["value"].as_str().unwrap()).unwrap();
    assert_eq!(bound["version"], 1);
    assert_eq!(bound["args_hash"], approval.args_hash.as_str());

    let text = s.click(&approval, "Approve", "U0DANA001").await;
    assert_eq!(
        text,
        format!("You approved reimburse version 1 ({}).", approval.id)
    );
    let stored = s.stored(&approval).await;
    assert_eq!(stored.status, ApprovalStatus::Approved);
    assert_eq!(stored.decisions.len(), 1);
    let decided = &stored.decisions[0];
    assert_eq!(decided.by.as_str(), "dana");
    assert_eq!(
        decided.decision_id.as_str(),
        format!("countersign.approve.{}.v1.U0DANA001", approval.id)
    );

    // A double click, or Slack retrying the request: the same decision, recorded once.
    let again = s.click(&approval, "Approve", "U0DANA001").await;
    assert!(
        again.starts_with("Already recorded: You approved"),
        "{again}"
    );
    assert_eq!(s.stored(&approval).await.decisions.len(), 1);
    let history = s.engine.history(&acme(), &report.run_id).await.unwrap();
    let decisions = history
        .entries
        .iter()
        .filter(|e| e.event.name() == "decision")
        .count();
    assert_eq!(decisions, 1);
}

#[tokio::test]
async fn a_bad_signature_an_old_timestamp_and_a_replay_are_refused_and_change_nothing() {
    let s = SlackSetup::new().await;
    let (_, approval) = s.h.start_paused(&s.engine, "c-102").await;
    let body = s.click_body(&s.button(&approval, "Approve"), "U0DANA001");
    let secret = SigningSecret::new(SECRET).unwrap();
    let now = s.h.clock.now().timestamp();

    let wrong_key = SigningSecret::new("not-the-app-signing-secret").unwrap();
    let forged = sign(&wrong_key, &now.to_string(), body.as_bytes());
    let tampered = body.replace("U0DANA001", "U0ERIN001");
    let signed_now = sign(&secret, &now.to_string(), body.as_bytes());
    let old = (now - 301).to_string();
    let signed_old = sign(&secret, &old, body.as_bytes());
    for (what, body, timestamp, signature) in [
        ("another key", body.as_str(), now.to_string(), forged),
        (
            "a changed body",
            tampered.as_str(),
            now.to_string(),
            signed_now.clone(),
        ),
        (
            "no signature",
            body.as_str(),
            now.to_string(),
            String::new(),
        ),
        (
            "a timestamp over 5 minutes old",
            body.as_str(),
            old,
            signed_old,
        ),
    ] {
        let (status, answer) = s.post(body, &timestamp, &signature).await;
        assert_eq!(status, 401, "{what}: {answer}");
        assert_eq!(
            answer["error"]["code"], "slack_signature",
            "{what}: {answer}"
        );
    }

    // A request Slack really signed, sent again six minutes later.
    s.h.clock.set(s.h.clock.now() + Duration::minutes(6));
    let (status, answer) = s.post(&body, &now.to_string(), &signed_now).await;
    assert_eq!(status, 401, "the replay: {answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than five minutes old"),
        "{answer}"
    );

    let stored = s.stored(&approval).await;
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert!(stored.decisions.is_empty(), "nothing was decided");
    assert!(
        s.slack.requests().is_empty(),
        "nobody was answered in Slack"
    );
}

#[tokio::test]
async fn every_refusal_is_told_in_slack_as_an_ephemeral_message() {
    let s = SlackSetup::new().await;
    let (_, c102) = s.h.start_paused(&s.engine, "c-102").await;
    let expect = |text: String, code: &str| {
        assert!(
            text.starts_with(&format!("Not decided ({code}): ")),
            "{text}"
        );
    };

    expect(s.click(&c102, "Approve", "U0BEN0001").await, "own_request");
    expect(s.click(&c102, "Approve", "U0CHEN001").await, "missing_role");
    expect(
        s.click(&c102, "Approve", "U0NOBODY1").await,
        "unknown_person",
    );
    expect(s.click(&c102, "Approve", "U0ZOE0001").await, "not_found");
    assert!(s.stored(&c102).await.decisions.is_empty());

    s.click(&c102, "Reject", "U0DANA001").await;
    let rejected = s.stored(&c102).await;
    assert_eq!(rejected.status, ApprovalStatus::Rejected);
    assert_eq!(
        rejected.decisions[0].choice,
        Choice::Reject {
            reason: "Rejected in Slack by dana, without a reason.".into()
        }
    );
    expect(
        s.click(&c102, "Approve", "U0ERIN001").await,
        "already_decided",
    );

    let (_, c104) = s.h.start_paused(&s.engine, "c-104").await;
    s.h.clock.set(c104.expires_at + Duration::seconds(1));
    expect(s.click(&c104, "Approve", "U0DANA001").await, "expired");
    assert_eq!(s.stored(&c104).await.status, ApprovalStatus::Expired);
    assert_eq!(s.stored(&c102).await.decisions.len(), 1);
}

#[tokio::test]
async fn a_button_for_version_1_after_an_edit_made_version_2_is_refused_as_stale() {
    let s = SlackSetup::new().await;
    let (_, first) = s.h.start_paused(&s.engine, "c-105").await;
    let version_1 = s.button(&first, "Approve");
    let edit = Choice::Edit {
        amount: Amount::from_dollars(600),
        note: None,
    };
    let edited = s
        .engine
        .decide(
            &s.h.person("dana"),
            &first.id,
            decision("d-edit", ActionVersion::FIRST, edit),
        )
        .await
        .unwrap();
    let second = edited
        .next_approval
        .expect("version 2 waits for a second approver");
    assert_eq!(second.action_version.get(), 2);

    let (status, answer) = s.signed(&s.click_body(&version_1, "U0ERIN001")).await;
    assert_eq!(status, 200);
    let text = answer["text"].as_str().unwrap();
    assert!(text.starts_with("Not decided (superseded): "), "{text}");
    assert_eq!(
        s.stored(&second).await.decisions.len(),
        1,
        "only dana's edit"
    );

    // A button whose arguments differ from the ones waiting is stale too.
    let mut forged = s.button(&second, "Approve");
    let mut bound: Value = serde_json::from_str(forged["value"].as_str().unwrap()).unwrap();
    bound["args_hash"] = json!(first.args_hash.as_str());
    forged["value"] = json!(bound.to_string());
    let (_, answer) = s.signed(&s.click_body(&forged, "U0ERIN001")).await;
    let text = answer["text"].as_str().unwrap();
    assert!(text.starts_with("Not decided (stale_version): "), "{text}");

    // The notice of version 2 carries version 2's buttons, which decide it.
    let text = s.click(&second, "Approve", "U0ERIN001").await;
    assert!(
        text.starts_with("You approved reimburse version 2"),
        "{text}"
    );
    assert_eq!(s.stored(&second).await.status, ApprovalStatus::Approved);
}

#[tokio::test]
async fn a_decision_in_the_api_is_the_same_as_in_slack() {
    // The page's decision and a click are one engine call: a click after the page decided is
    // refused, and what the page decided stands.
    let s = SlackSetup::new().await;
    let (_, approval) = s.h.start_paused(&s.engine, "c-102").await;
    s.engine
        .decide(&s.h.person("erin"), &approval.id, approve("d-page"))
        .await
        .unwrap();
    let text = s.click(&approval, "Approve", "U0DANA001").await;
    assert!(
        text.starts_with("Not decided (already_decided): "),
        "{text}"
    );
    let stored = s.stored(&approval).await;
    assert_eq!(stored.decisions.len(), 1);
    assert_eq!(stored.decisions[0].by.as_str(), "erin");
}
