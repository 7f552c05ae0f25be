//! Deciding where reviewers are: every notice and reminder links to its approval on the review
//! page when the page's public address is configured, and carries no link when it is not; with
//! a Slack app, a notice's Approve and Reject buttons decide through `POST /slack/interactions`,
//! signed as Slack signs its requests, served over loopback, each answer an ephemeral message
//! posted to a loopback stand-in for Slack's `response_url`.

#[macro_use]
mod harness;
#[path = "harness/dynamodb.rs"]
mod dynamodb_backend;
mod support;
// Only the receiver of the shared notification helpers is used here.
#[allow(dead_code)]
#[path = "harness/notices.rs"]
mod notices;
#[path = "support/slack_form.rs"]
mod slack_form;
#[path = "support/slack_post.rs"]
mod slack_post;

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::Duration;
use serde_json::{Value, json};
use shared::adapters::slack::{SigningSecret, SlackApp, SlackChannel, WebApi as SlackWebApi, sign};
use shared::adapters::webhook::{Rendering, Webhooks, public_url};
use shared::api::{Authenticate, BearerJwt};
use shared::domain::approval::{Approval, ApprovalStatus, Choice};
use shared::domain::ids::ActionVersion;
use shared::domain::ids::{AgentName, PersonId};
use shared::domain::money::Amount;
use shared::domain::run::GateVia;
use shared::engine::{CallStatus, Engine, GateCall};
use shared::example::expense::OfflineExpenseAgent;
use shared::ports::clock::Clock;
use shared::ports::notifier::{Notifier, Several};
use shared::ports::store::{Item, ItemStore, Page, Query, StoreError, Write};

use harness::{Embedded, Harness, Process, acme, approve, decision};
use notices::{Received, Receiver};
use slack_form::interaction_form;
use slack_post::post_interaction;

const QUICK: StdDuration = StdDuration::from_millis(500);

/// Notices with a Slack app's buttons and no link.
const BUTTONS: Rendering = Rendering {
    public_url: None,
    buttons: true,
};

async fn posting_with_link(h: &Harness, receiver: &Receiver, link_to: Option<&str>) -> Process {
    let webhooks = Webhooks::new(&[receiver.url().to_string()], QUICK)
        .unwrap()
        .with_rendering(Rendering {
            public_url: link_to.map(|url| public_url(url).unwrap()),
            buttons: false,
        });
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
    /// The Web API stand-in the app opens edit forms with.
    web: WebApi,
    http: reqwest::Client,
}

impl SlackSetup {
    /// ben's c-102, paused on its approval.
    async fn c102_paused(&self) -> (shared::engine::RunReport, Approval) {
        self.h.start_paused(&self.engine, "c-102").await
    }

    async fn new() -> Self {
        Self::over(|store| store).await
    }

    /// [`SlackSetup::new`], its engine's store connection wrapped in `wrap`.
    async fn over(wrap: impl FnOnce(Arc<dyn ItemStore>) -> Arc<dyn ItemStore>) -> Self {
        let h = Harness::new(Embedded::fresh()).await;
        let notices = Receiver::ok().await;
        let slack = Receiver::ok().await;
        let webhooks = Webhooks::new(&[notices.url().to_string()], QUICK)
            .unwrap()
            .with_rendering(BUTTONS);
        let notifier: Arc<dyn Notifier> = Arc::new(webhooks);
        let Process { engine, .. } = h
            .process_configured(Arc::new(OfflineExpenseAgent), wrap, |b| {
                b.notifier(notifier)
            })
            .await;
        let engine = Arc::new(engine);
        let hooks = format!("http://{}/", slack.host());
        let web = WebApi::start(0).await;
        let app = SlackApp::new(
            SigningSecret::new(SECRET).unwrap(),
            h.directory.clone(),
            &hooks,
        )
        .unwrap()
        .with_web_api(Some(
            SlackWebApi::new(&web.url, "xoxb-countersign-test", QUICK).unwrap(),
        ));
        let auth: Arc<dyn Authenticate> = Arc::new(BearerJwt::hs256(&[7; 32]).unwrap());
        let router = shared::api::router_with_slack(
            engine.clone(),
            auth,
            Some(Arc::new(app)),
            shared::api::mcp::Settings::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self {
            h,
            engine,
            api,
            notices,
            slack,
            web,
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

    /// [`SlackSetup::button`], whose action id names `action` on version 1 of `approval`.
    fn button_for(&self, approval: &Approval, label: &str, action: &str) -> Value {
        let button = self.button(approval, label);
        let id = format!("countersign.{action}.{}.v1", approval.id);
        assert_eq!(button["action_id"], id, "{button}");
        button
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
        interaction_form(&payload)
    }

    /// Posts `body` to /slack/interactions with the given timestamp and signature headers.
    async fn post(&self, body: &str, timestamp: &str, signature: &str) -> (u16, Value) {
        post_interaction(&self.http, &self.api, body, timestamp, signature).await
    }

    async fn signed_owned(&self, body: String) -> (u16, Value) {
        self.signed(&body).await
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
    let (report, approval) = s.c102_paused().await;
    let approve = s.button_for(&approval, "Approve", "approve");
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
async fn a_call_through_the_gate_api_approved_with_a_click_wakes_its_waiting_caller_with_the_outcome()
 {
    let s = SlackSetup::new().await;
    let call = GateCall {
        tenant: acme(),
        agent: AgentName::parse("expense").unwrap(),
        requested_by: PersonId::parse("ben").unwrap(),
        tool: "reimburse".into(),
        args: json!({"claim_id": "c-102", "amount_cents": 25_000}),
        call_id: Some("call_slack".into()),
        conversation: Some("thread-7".into()),
        via: GateVia::Api,
        standing: Default::default(),
    };
    let proposed = s.engine.gate_call(call).await.unwrap();
    assert_eq!(proposed.status, CallStatus::AwaitingApproval);
    let approval = s.stored(proposed.approval.as_ref().unwrap()).await;
    let waiting = {
        let (engine, run) = (s.engine.clone(), proposed.run_id.clone());
        tokio::spawn(async move {
            engine
                .wait_for_call(&acme(), &run, StdDuration::from_secs(20))
                .await
        })
    };

    let text = s.click(&approval, "Approve", "U0DANA001").await;

    assert!(
        text.starts_with("You approved reimburse version 1"),
        "{text}"
    );
    let state = waiting.await.unwrap().unwrap();
    assert_eq!(state.status, CallStatus::Succeeded, "{state:?}");
    assert!(
        state
            .result
            .unwrap()
            .content
            .contains("\"paid_cents\":25000")
    );
    let stored = s.stored(&approval).await;
    assert_eq!(stored.decisions[0].by.as_str(), "dana");
}

#[tokio::test]
async fn a_bad_signature_an_old_timestamp_and_a_replay_are_refused_and_change_nothing() {
    let s = SlackSetup::new().await;
    let (_, approval) = s.c102_paused().await;
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
    let (_, c102) = s.c102_paused().await;
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
    let (_, approval) = s.c102_paused().await;
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

/// A store whose actions cannot be read once `broken`: a decision reads none, the resume that
/// follows it does.
struct ActionsUnreadable {
    inner: Arc<dyn ItemStore>,
    broken: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl ItemStore for ActionsUnreadable {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        let broken = self.broken.load(std::sync::atomic::Ordering::SeqCst);
        if broken && sk.starts_with(shared::engine::records::keys::ACTION_PREFIX) {
            return Err(StoreError::Unavailable("actions cannot be read".into()));
        }
        self.inner.get(pk, sk).await
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        self.inner.page(query).await
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.inner.transact(writes).await
    }
}

#[tokio::test]
async fn a_resume_that_fails_after_the_answer_is_told_in_a_second_message_and_the_sweep_resumes_the_run()
 {
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = SlackSetup::over(|inner| {
        Arc::new(ActionsUnreadable {
            inner,
            broken: broken.clone(),
        })
    })
    .await;
    let (report, approval) = s.c102_paused().await;
    broken.store(true, std::sync::atomic::Ordering::SeqCst);

    let body = s.click_body(&s.button(&approval, "Approve"), "U0DANA001");
    let (status, answer) = s.signed(&body).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["text"].as_str().unwrap();
    assert!(
        text.starts_with("You approved reimburse version 1"),
        "{text}"
    );
    tokio::time::timeout(StdDuration::from_secs(30), s.slack.until_requests(2))
        .await
        .expect("a second message to the response_url");
    let told = s.slack.requests();
    assert_eq!(told.len(), 2);
    assert_eq!(told[0].body, answer, "the answer first");
    assert_eq!(told[1].body["response_type"], "ephemeral");
    let late = told[1].body["text"].as_str().unwrap();
    assert!(
        late.starts_with("Your decision is recorded, but its run did not resume yet (")
            && late.contains("actions cannot be read"),
        "{late}"
    );
    assert_eq!(s.stored(&approval).await.status, ApprovalStatus::Approved);
    assert!(s.h.payments().await.is_empty());

    // The store back, the sweep resumes the run: the approved payment is made once.
    broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let swept = s.engine.sweep(100).await.unwrap();
    assert_eq!(swept.redelivered, 1, "{swept:?}");
    assert_eq!(s.h.payments().await.len(), 1);
    let run = s.engine.run(&acme(), &report.run_id).await.unwrap();
    assert_eq!(run.status, shared::domain::run::RunStatus::Done);
}

// ---------------------------------------------------------------------------------------------
// The outcome back in the thread
// ---------------------------------------------------------------------------------------------

/// One call the Web API stand-in got: the method, its JSON body and the bearer token.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    body: Value,
    token: String,
}

#[derive(Default)]
struct WebApiScript {
    calls: std::sync::Mutex<Vec<Call>>,
    /// chat.update calls still to fail (a 503) before the first succeeds.
    failing_updates: std::sync::Mutex<usize>,
}

/// A loopback stand-in for Slack's Web API: `chat.postMessage` answers with the channel and a
/// fresh `ts`, as Slack documents; `chat.update` fails as scripted, then answers `ok`.
struct WebApi {
    url: String,
    script: Arc<WebApiScript>,
}

async fn web_api_call(
    axum::extract::State(script): axum::extract::State<Arc<WebApiScript>>,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::Json<Value>,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let n = {
        let mut calls = script.calls.lock().unwrap();
        calls.push(Call {
            method: method.clone(),
            body: body.0.clone(),
            token,
        });
        calls.len()
    };
    let ok = axum::http::StatusCode::OK;
    match method.as_str() {
        "chat.postMessage" => (
            ok,
            axum::Json(json!({
                "ok": true,
                "channel": "C0REVIEW1",
                "ts": format!("1700000000.{n:06}"),
                "message": {"text": body.0["text"]},
            })),
        ),
        "chat.update" => {
            let mut failing = script.failing_updates.lock().unwrap();
            if *failing > 0 {
                *failing -= 1;
                return (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(json!({"ok": false, "error": "service_unavailable"})),
                );
            }
            (
                ok,
                axum::Json(json!({"ok": true, "channel": body.0["channel"], "ts": body.0["ts"]})),
            )
        }
        "views.open" => (
            ok,
            axum::Json(json!({"ok": true, "view": {"id": "V0EDIT0001"}})),
        ),
        _ => (
            ok,
            axum::Json(json!({"ok": false, "error": "unknown_method"})),
        ),
    }
}

impl WebApi {
    async fn start(failing_updates: usize) -> Self {
        let script = Arc::new(WebApiScript {
            failing_updates: std::sync::Mutex::new(failing_updates),
            ..WebApiScript::default()
        });
        let app = axum::Router::new()
            .route("/api/{method}", axum::routing::post(web_api_call))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, script }
    }

    fn calls(&self, method: &str) -> Vec<Call> {
        let calls = self.script.calls.lock().unwrap();
        calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    fn channel(&self) -> Arc<SlackChannel> {
        Arc::new(
            SlackChannel::new(&self.url, "xoxb-countersign-test", "C0REVIEW1", QUICK)
                .unwrap()
                .with_rendering(BUTTONS),
        )
    }
}

fn has_buttons(message: &Value) -> bool {
    message["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["type"] == "actions")
}

fn all_text(message: &Value) -> String {
    message["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["text"]["text"].as_str().unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn the_outcome_updates_the_posted_message_in_place_through_the_outbox_when_slack_fails_first(
    h: &Harness,
) {
    let api = WebApi::start(2).await;
    let p = h.notifying(api.channel()).await;
    let (report, approval) = h.start_paused(&p, "c-102").await;

    let posted = api.calls("chat.postMessage");
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].token, "Bearer xoxb-countersign-test");
    assert_eq!(posted[0].body["channel"], "C0REVIEW1");
    assert!(has_buttons(&posted[0].body), "the notice carries buttons");
    assert!(api.calls("chat.update").is_empty());

    h.clock.set(harness::start_of_test() + Duration::minutes(5));
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;
    // The decision and the action's result each call for an update; Slack failed both.
    assert_eq!(api.calls("chat.update").len(), 2);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(
        stored.status,
        ApprovalStatus::Approved,
        "the decision stands"
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert!(
        !history.entries.iter().any(|e| e.event.name() == "notified"
            && serde_json::to_value(&e.event).unwrap()["notice"] == "outcome"),
        "no outcome is recorded as sent yet"
    );

    // The sweep tries again a minute later: the message is updated in place.
    h.clock.set(harness::start_of_test() + Duration::minutes(6));
    let swept = p.sweep(100).await.unwrap();
    assert_eq!(swept.notices.sent, 2, "{swept:?}");
    let updates = api.calls("chat.update");
    assert_eq!(updates.len(), 4);
    let last = &updates[3].body;
    assert_eq!(last["channel"], "C0REVIEW1");
    assert_eq!(
        last["ts"], "1700000000.000001",
        "the message chat.postMessage returned"
    );
    assert!(!has_buttons(last), "the buttons are gone: {last}");
    let text = all_text(last);
    for expected in [
        "Approved: reimburse",
        "*dana* approved version 1",
        "*Outcome:* Approved.",
        "*The call:* succeeded: {\"claim_id\":\"c-102\"",
        "\"paid\":\"$250.00\"",
    ] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    assert_eq!(
        api.calls("chat.postMessage").len(),
        1,
        "nothing posted anew"
    );

    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let outcomes = history
        .entries
        .iter()
        .filter(|e| serde_json::to_value(&e.event).unwrap()["notice"] == "outcome")
        .count();
    assert_eq!(outcomes, 2, "each update is in the audit log");
    // Nothing more is due.
    h.clock.set(harness::start_of_test() + Duration::hours(2));
    p.sweep(100).await.unwrap();
    assert_eq!(api.calls("chat.update").len(), 4);
}

async fn expiry_cancellation_and_an_edit_update_the_message_and_webhooks_get_no_updates(
    h: &Harness,
) {
    let api = WebApi::start(0).await;
    let hook = Receiver::ok().await;
    let webhooks = Arc::new(Webhooks::new(&[hook.url().to_string()], QUICK).unwrap());
    let both: Arc<dyn Notifier> = Arc::new(Several(vec![webhooks, api.channel()]));
    let p = h.notifying(both).await;

    let (_, c104) = h.start_paused(&p, "c-104").await;
    let (c102_run, _) = h.start_paused(&p, "c-102").await;
    let (_, c105) = h.start_paused(&p, "c-105").await;
    assert_eq!(api.calls("chat.postMessage").len(), 3);
    assert_eq!(hook.requests().len(), 3);

    p.cancel(&h.person("ben"), &c102_run.run_id).await.unwrap();
    let edit = Choice::Edit {
        amount: Amount::from_dollars(600),
        note: None,
    };
    h.decided(
        &p,
        "dana",
        &c105.id,
        decision("d-edit", ActionVersion::FIRST, edit),
    )
    .await;
    h.clock.set(c104.expires_at + Duration::minutes(1));
    p.sweep(100).await.unwrap();

    let updates = api.calls("chat.update");
    let text_of = |ts: &str| {
        updates
            .iter()
            .filter(|u| u.body["ts"] == ts)
            .map(|u| all_text(&u.body))
            .next_back()
            .unwrap_or_else(|| panic!("no update of {ts}"))
    };
    let expired = text_of("1700000000.000001");
    assert!(
        expired.contains("*Outcome:* Expired: nobody decided by the deadline."),
        "{expired}"
    );
    let cancelled = text_of("1700000000.000002");
    assert!(
        cancelled.contains("*Outcome:* Cancelled with its run."),
        "{cancelled}"
    );
    let replaced = text_of("1700000000.000003");
    assert!(
        replaced.contains("*dana* edited version 1 to $600.00"),
        "{replaced}"
    );
    assert!(
        replaced.contains("Replaced by an edit: decide the new version"),
        "{replaced}"
    );
    assert!(updates.iter().all(|u| !has_buttons(&u.body)));
    // Version 2 of the edited call is a new approval: posted anew, with its buttons.
    let posts = api.calls("chat.postMessage");
    assert_eq!(posts.len(), 4);
    assert!(has_buttons(&posts[3].body));

    // The webhook got the notices and nothing else: it cannot update a message.
    let kinds = hook.notices();
    assert!(kinds.iter().all(|k| k == "approval_requested"), "{kinds:?}");
}

// ---------------------------------------------------------------------------------------------
// Edit from Slack, in a form
// ---------------------------------------------------------------------------------------------

/// The form Slack posts when `user` submits the edit form `view` with `amount` and `note`, as its
/// view_submission payload documents.
fn submission_body(view: &Value, user: &str, amount: &str, note: &str) -> String {
    let payload = json!({
        "type": "view_submission",
        "team": {"id": "T0ACME001", "domain": "acme"},
        "user": {"id": user, "username": user.to_lowercase(), "team_id": "T0ACME001"},
        "api_app_id": "A0COUNTER1",
        "trigger_id": "1234567890.0987654321.fedcba",
        "view": {
            "id": "V0EDIT0001",
            "type": "modal",
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "state": {"values": {
                "amount": {"value": {"type": "plain_text_input", "value": amount}},
                "note": {"value": {"type": "plain_text_input", "value": note}},
            }},
        },
    });
    interaction_form(&payload)
}

#[tokio::test]
async fn edit_opens_a_form_whose_submission_edits_as_the_person_once() {
    let s = SlackSetup::new().await;
    let (_, approval) = s.c102_paused().await;
    let edit = s.button_for(&approval, "Edit", "edit");

    // Whoever may not edit is told so, and no form opens.
    let body = s.click_body(&edit, "U0BEN0001");
    let (_, answer) = s.signed(&body).await;
    let told = answer["text"].as_str().unwrap();
    assert!(told.starts_with("Not decided (own_request): "), "{told}");
    assert!(s.web.calls("views.open").is_empty());

    let (status, answer) = s.signed(&s.click_body(&edit, "U0DANA001")).await;
    assert_eq!(
        (status, answer),
        (200, json!({})),
        "the form opened, nothing to tell"
    );
    let opened = s.web.calls("views.open");
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].token, "Bearer xoxb-countersign-test");
    assert_eq!(opened[0].body["trigger_id"], "1234567890.0987654321.abcdef");
    let view = opened[0].body["view"].clone();
    assert_eq!(view["type"], "modal");
    assert_eq!(view["callback_id"], "countersign.edit");
    assert_eq!(view["blocks"][1]["element"]["initial_value"], "250.00");

    let submit = |user: &str, amount: &str| {
        s.signed_owned(submission_body(&view, user, amount, "one night"))
    };
    let (_, answer) = submit("U0DANA001", "a lot").await;
    assert_eq!(answer["response_action"], "errors");
    let why = answer["errors"]["amount"].as_str().unwrap();
    assert!(why.starts_with("Write the amount"), "{why}");
    let (_, answer) = submit("U0DANA001", "300").await;
    assert_eq!(answer["response_action"], "errors");
    let why = answer["errors"]["amount"].as_str().unwrap();
    assert!(why.starts_with("Not decided (edit_refused): "), "{why}");
    assert!(
        s.stored(&approval).await.decisions.is_empty(),
        "nothing changed"
    );

    let (status, answer) = submit("U0DANA001", "200").await;
    assert_eq!((status, answer), (200, json!({"response_action": "clear"})));
    // Submitted twice (a double click, a retry): one edit.
    let (_, again) = submit("U0DANA001", "200").await;
    assert_eq!(again, json!({"response_action": "clear"}));
    let first = s.stored(&approval).await;
    assert_eq!(first.status, ApprovalStatus::Superseded);
    assert_eq!(first.decisions.len(), 1);
    assert_eq!(first.decisions[0].by.as_str(), "dana");
    assert_eq!(
        first.decisions[0].choice,
        Choice::Edit {
            amount: Amount::from_dollars(200),
            note: Some("one night".into())
        }
    );
    let next = s
        .engine
        .approval(&acme(), first.superseded_by.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!(next.args.int("amount_cents"), Some(20_000));
    assert_eq!(
        next.status,
        ApprovalStatus::Approved,
        "the editor's approval meets the quorum"
    );

    // The form of version 1, submitted by someone else after the edit: refused as superseded.
    let (_, late) = submit("U0ERIN001", "150").await;
    let why = late["errors"]["amount"].as_str().unwrap();
    assert!(why.starts_with("Not decided (superseded): "), "{why}");
}

/// The thread updates keep each message's channel and ts with its approval: on both stores.
macro_rules! outcome_scenarios {
    ($module:ident, $backend:expr) => {
        on_backend!(
            $module,
            $backend,
            [
                the_outcome_updates_the_posted_message_in_place_through_the_outbox_when_slack_fails_first,
                expiry_cancellation_and_an_edit_update_the_message_and_webhooks_get_no_updates,
            ]
        );
    };
}

outcome_scenarios!(embedded, Embedded::fresh());
outcome_scenarios!(dynamodb, dynamodb_backend::DynamoDb::fresh("slack").await);
