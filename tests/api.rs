//! The HTTP decision API over real processes: `countersign serve` on a free port, tokens from
//! `countersign token`, and plain HTTP. Every refusal says why with a status and a stable code,
//! and changes nothing.

use std::time::Duration;

use serde_json::{Value, json};
use shared::api::BearerJwt;
use shared::domain::identity::Identity;

mod common;

use common::countersign;
use common::server::{Pending, Server, approve, assert_refused};
use common::{item_where, texts};

/// dana, a finance reviewer of acme, as the directory knows her.
fn dana() -> Identity {
    shared::example::expense::default_directory()
        .identify("dana")
        .unwrap()
}

/// dana's edit of version 1 to `amount` dollars.
fn edit(amount: &str) -> Value {
    json!({"decision_id": "dana-edit", "action_version": 1, "choice": "edit", "amount": amount})
}

#[tokio::test]
async fn a_claim_started_over_http_is_paid_once_a_finance_reviewer_approves() {
    let (server, c102) = Server::with_paused_run("e2e", "ben", "c-102").await;

    let waiting = server.get("/approvals", "dana").await;
    assert_eq!(waiting.status, 200, "{}", waiting.json);
    let listed = texts(&waiting.json["approvals"], "id");
    assert_eq!(listed, [c102.approval.as_str()]);

    let approval = server.approval(&c102.approval).await;
    assert_eq!(approval["tool"], "reimburse");
    assert_eq!(
        approval["args"]["amount_cents"], 25_000,
        "capped at the limit"
    );
    assert_eq!(approval["action_version"], 1);
    assert!(
        approval["args_hash"]
            .as_str()
            .unwrap()
            .starts_with("v2:sha256:"),
        "the hash of the agent, the tool and the arguments"
    );
    assert!(!approval["explanation"].as_str().unwrap().is_empty());
    assert!(approval["reason"].as_str().unwrap().contains("finance"));
    assert!(approval["expires_at"].is_string());
    assert_eq!(approval["decisions"], json!([]));
    assert_eq!(approval["still_needed"], 1);
    assert_eq!(approval["approved_by"], json!([]));
    assert_eq!(
        approval["editable_amount"],
        json!({"field": "amount_cents", "cents": 25_000})
    );

    let own = server.decide("ben", &c102.approval, approve("ben-1")).await;
    assert_refused(&own, 403, "own_request");

    let approved = server.dana_approves(&c102.approval).await;
    assert_eq!(approved.json["replayed"], false);
    assert_eq!(approved.json["decision"]["by"], "dana");
    assert_eq!(approved.json["approval"]["status"], "approved");
    assert_eq!(approved.json["run"]["status"], "done", "{}", approved.json);

    let audit = server.audit(&c102.run).await;
    let executed: Vec<&Value> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "executed" && e["action_id"] == approval["action_id"])
        .collect();
    assert_eq!(executed.len(), 1, "{}", audit["entries"]);
    assert_eq!(executed[0]["succeeded"], true);
    assert_eq!(audit["run"]["status"], "done");
    let reimburse = item_where(&audit["actions"], "tool", "reimburse");
    assert_eq!(reimburse["status"], "succeeded");
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);

    let after = server.get("/approvals", "dana").await;
    assert_eq!(after.json["approvals"], json!([]));
}

#[tokio::test]
async fn an_edit_that_lowers_the_amount_pays_the_lower_amount() {
    let (server, c102) = Server::with_paused_run("edit-lower", "ben", "c-102").await;
    let mut edit = edit("200.00");
    edit["note"] = json!("one night at the conference rate");
    let edited = server.decided("dana", &c102.approval, edit).await;
    assert_eq!(edited.json["approval"]["status"], "superseded");
    let next = &edited.json["next_approval"];
    assert_eq!(next["action_version"], 2);
    assert_eq!(next["args"]["amount_cents"], 20_000);
    assert_eq!(next["previous"]["args"]["amount_cents"], 25_000);
    assert_eq!(edited.json["run"]["status"], "done", "{}", edited.json);
}

#[tokio::test]
async fn malformed_json_is_400_and_changes_nothing() {
    let c102 = Pending::c102("malformed").await;
    let path = format!("/approvals/{}/decisions", c102.approval);
    let cut = r#"{"decision_id": "d1", "action_version": 1, "choice": "approve""#;
    for body in [cut, ""] {
        let reply = c102.post_raw(&path, "dana", body).await;
        c102.refused(&reply, 400, "malformed_json").await;
    }
}

/// Decisions refused for what they say or for who sends them, each with its status and code.
/// None changes anything, so one pending claim serves them all.
#[tokio::test]
async fn a_refused_decision_says_why_and_changes_nothing() {
    let c102 = Pending::c102("refused").await;
    let mut naming_the_decider = approve("d1");
    naming_the_decider["by"] = json!("dana");
    let over_16_kib = json!({
        "decision_id": "d1",
        "action_version": 1,
        "choice": "reject",
        "reason": "x".repeat(17 * 1024)
    });
    let stale = json!({"decision_id": "d1", "action_version": 2, "choice": "approve"});
    for (who, body, status, code) in [
        ("erin", naming_the_decider, 400, "unknown_field"),
        ("dana", over_16_kib, 400, "body_too_large"),
        // chen is an employee without the approver role.
        ("chen", approve("chen-1"), 403, "missing_role"),
        // Nobody approves their own claim.
        ("ben", approve("ben-1"), 403, "own_request"),
        ("dana", stale, 409, "stale_version"),
        // An edit may lower the amount, never raise it.
        ("dana", edit("300.00"), 422, "edit_refused"),
    ] {
        c102.refuses(who, body, status, code).await;
    }
}

#[tokio::test]
async fn a_missing_field_or_an_amount_as_a_number_is_400() {
    let c102 = Pending::c102("missing-field").await;
    let no_version = json!({"decision_id": "d1", "choice": "approve"});
    let float =
        json!({"decision_id": "d2", "action_version": 1, "choice": "edit", "amount": 200.0});
    for (body, code) in [(no_version, "missing_field"), (float, "bad_amount")] {
        let reply = c102.decide("dana", &c102.approval, body).await;
        c102.refused(&reply, 400, code).await;
    }
}

#[tokio::test]
async fn a_body_that_is_not_declared_json_is_400() {
    let c102 = Pending::c102("content-type").await;
    let dana = c102.token("dana");
    let reply = c102.send_approval(Some(dana), "text/plain").await;
    c102.refused(&reply, 400, "bad_content_type").await;
}

#[tokio::test]
async fn a_bad_approval_id_is_400() {
    let c102 = Pending::c102("bad-id").await;
    let run_as_approval = format!("/approvals/{}/decisions", c102.run);
    for reply in [
        c102.get("/approvals/not-an-approval", "dana").await,
        c102.post(&run_as_approval, "dana", approve("d1")).await,
        c102.get("/runs/ap-123/audit", "dana").await,
    ] {
        c102.refused(&reply, 400, "bad_id").await;
    }
}

#[tokio::test]
async fn an_unknown_route_or_method_answers_in_json() {
    let server = Server::start("no-route");
    assert_refused(&server.get("/nothing-here", "dana").await, 404, "no_route");
    let reply = server
        .send(
            reqwest::Method::DELETE,
            "/approvals",
            Some(server.token("dana")),
            None,
        )
        .await;
    assert_refused(&reply, 405, "method_not_allowed");
}

#[tokio::test]
async fn a_request_without_a_token_is_401() {
    let c102 = Pending::c102("no-token").await;
    let reply = c102.send_approval(None, "application/json").await;
    assert_refused(&reply, 401, "missing_token");
    assert_eq!(reply.www_authenticate.as_deref(), Some("Bearer"));
    let list = c102
        .send(reqwest::Method::GET, "/approvals", None, None)
        .await;
    c102.refused(&list, 401, "missing_token").await;
}

#[tokio::test]
async fn an_invalid_or_expired_token_is_401() {
    let c102 = Pending::c102("bad-token").await;
    let path = format!("/approvals/{}/decisions", c102.approval);
    let body = || Some(("application/json", approve("d1").to_string().into_bytes()));

    let garbage = c102
        .send(
            reqwest::Method::POST,
            &path,
            Some("not-a-jwt".into()),
            body(),
        )
        .await;
    assert_refused(&garbage, 401, "invalid_token");

    let expired = c102.forged_token(
        dana(),
        chrono::Duration::hours(2),
        Duration::from_secs(3600),
    );
    let late = c102
        .send(reqwest::Method::POST, &path, Some(expired), body())
        .await;
    c102.refused(&late, 401, "token_expired").await;
}

#[tokio::test]
async fn a_request_with_two_authorization_headers_is_401_even_when_both_verify() {
    let c102 = Pending::c102("two-authorizations").await;
    let path = format!("/approvals/{}/decisions", c102.approval);
    for second in [c102.token("dana"), c102.token("erin")] {
        let response = c102
            .http
            .post(format!("{}{path}", c102.base))
            .bearer_auth(c102.token("dana"))
            .header("authorization", format!("Bearer {second}"))
            .json(&approve("d1"))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let json: Value = response.json().await.unwrap();
        let reply = common::server::Reply {
            status,
            json,
            www_authenticate: None,
        };
        c102.refused(&reply, 401, "repeated_authorization").await;
    }
}

#[tokio::test]
async fn a_token_signed_with_another_key_is_401() {
    let c102 = Pending::c102("other-key").await;
    let foreign = BearerJwt::hs256(&[42; 32])
        .unwrap()
        .issue(&dana(), chrono::Utc::now(), Duration::from_secs(600))
        .unwrap();
    let reply = c102.send_approval(Some(foreign), "application/json").await;
    c102.refused(&reply, 401, "invalid_token").await;
}

#[tokio::test]
async fn the_caller_who_starts_a_run_and_the_claims_employee_may_not_approve_it() {
    let server = Server::start("starter");
    // erin asks (the token's subject is the requester); the claim is ben's (its claimant).
    let c102 = server.paused_run("erin", "c-102", None).await;
    let before = server.approval(&c102.approval).await;
    assert_eq!(before["requested_by"], json!(["erin", "ben"]));
    for (who, id) in [("erin", "erin-1"), ("ben", "ben-1")] {
        let reply = server.decide(who, &c102.approval, approve(id)).await;
        assert_refused(&reply, 403, "own_request");
    }
    assert_eq!(server.approval(&c102.approval).await, before);
}

#[tokio::test]
async fn another_tenants_approval_is_404() {
    let c102 = Pending::c102("tenant").await;
    let run = &c102.run;
    for reply in [
        c102.get(&format!("/approvals/{}", c102.approval), "zoe")
            .await,
        c102.decide("zoe", &c102.approval, approve("zoe-1")).await,
        c102.get(&format!("/runs/{run}/audit"), "zoe").await,
        c102.post(&format!("/runs/{run}/cancel"), "zoe", json!({}))
            .await,
        c102.post("/runs", "zoe", json!({"claim_id": "c-102"}))
            .await,
    ] {
        assert_refused(&reply, 404, "not_found");
    }
    let zoes = c102.get("/approvals", "zoe").await;
    assert_eq!(zoes.status, 200);
    assert_eq!(zoes.json["approvals"], json!([]));
    c102.unchanged().await;
}

#[tokio::test]
async fn a_second_decision_on_a_resolved_approval_is_409() {
    let (server, c102) = Server::with_paused_run("resolved", "ben", "c-102").await;
    server.dana_approves(&c102.approval).await;
    let before = server.approval(&c102.approval).await;
    let reply = server
        .decide("erin", &c102.approval, approve("erin-1"))
        .await;
    assert_refused(&reply, 409, "already_decided");
    assert_eq!(server.approval(&c102.approval).await, before);
}

#[tokio::test]
async fn a_decision_after_the_deadline_is_409_and_expires_the_approval() {
    let server = Server::start("expired");
    let c104 = server.paused_run("chen", "c-104", Some("0s")).await;
    let before = server.approval(&c104.approval).await;
    assert_eq!(before["overdue"], true);
    let reply = server
        .decide("dana", &c104.approval, approve("dana-1"))
        .await;
    assert_refused(&reply, 409, "expired");
    let after = server.approval(&c104.approval).await;
    assert_eq!(after["status"], "expired", "expiry is state");
    assert_eq!(
        after["decisions"],
        json!([]),
        "the late decision is not recorded"
    );
    let again = server
        .decide("erin", &c104.approval, approve("erin-1"))
        .await;
    assert_refused(&again, 409, "expired");
    assert_eq!(server.approval(&c104.approval).await, after);
    let events = server
        .events_of_action(&c104.run, &after["action_id"])
        .await;
    assert_eq!(events, ["proposed", "expired"]);
}

#[tokio::test]
async fn a_decision_on_a_cancelled_run_is_409() {
    let (server, c102) = Server::with_paused_run("cancelled", "ben", "c-102").await;
    let cancel_path = format!("/runs/{}/cancel", c102.run);
    let cancel = || server.post(&cancel_path, "ben", json!({}));
    let cancelled = cancel().await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.json);
    assert_eq!(cancelled.json["status"], "cancelled");
    let before = server.approval(&c102.approval).await;
    assert_eq!(before["status"], "cancelled");
    let reply = server
        .decide("dana", &c102.approval, approve("dana-1"))
        .await;
    assert_refused(&reply, 409, "cancelled");
    assert_eq!(server.approval(&c102.approval).await, before);
    assert_refused(&cancel().await, 409, "run_finished");
}

#[tokio::test]
async fn the_same_decision_id_twice_returns_the_recorded_outcome() {
    let (server, c102) = Server::with_paused_run("replay", "ben", "c-102").await;
    let first = server.dana_approves(&c102.approval).await;
    assert_eq!(first.json["replayed"], false);
    let before = server.approval(&c102.approval).await;

    let again = server.dana_approves(&c102.approval).await;
    assert_eq!(again.json["replayed"], true);
    assert_eq!(again.json["decision"], first.json["decision"]);
    assert_eq!(server.approval(&c102.approval).await, before);

    let events = server
        .events_of_action(&c102.run, &before["action_id"])
        .await;
    assert_eq!(events, ["proposed", "decision", "executing", "executed"]);

    let reused = server
        .decide(
            "dana",
            &c102.approval,
            json!({"decision_id": "dana-1", "action_version": 1, "choice": "reject", "reason": "no"}),
        )
        .await;
    assert_refused(&reused, 409, "decision_id_reused");
}

/// dana's approval sent with the snapshot the approval was shown with.
fn approve_shown(decision_id: &str, snapshot: &Value) -> Value {
    let mut body = approve(decision_id);
    body["snapshot"] = snapshot.clone();
    body
}

#[tokio::test]
async fn a_decision_sent_with_the_snapshot_it_was_shown_with_is_taken_even_after_a_comment() {
    let (server, c102) = Server::with_paused_run("snapshot", "ben", "c-102").await;
    let shown = server.approval(&c102.approval).await;
    let snapshot = &shown["snapshot"];
    assert!(snapshot.is_string(), "{shown}");
    let listed = server.get("/approvals", "dana").await;
    assert_eq!(&listed.json["approvals"][0]["snapshot"], snapshot);

    // Shown the same approval twice, the same snapshot; a comment changes it.
    assert_eq!(&server.approval(&c102.approval).await["snapshot"], snapshot);
    let path = format!("/approvals/{}/comments", c102.approval);
    let commented = server
        .post(&path, "erin", json!({"text": "receipt attached?"}))
        .await;
    assert_eq!(commented.status, 201, "{}", commented.json);
    let after_comment = server.approval(&c102.approval).await["snapshot"].clone();
    assert_ne!(&after_comment, snapshot);
    // The comment's answer is the approval as the comment wrote it, snapshot and all.
    assert_eq!(
        commented.json["snapshot"], after_comment,
        "{}",
        commented.json
    );

    // The snapshot from before the comment: ruled on the stored approval, comment kept.
    let approved = server
        .decided("dana", &c102.approval, approve_shown("dana-1", snapshot))
        .await;
    assert_eq!(approved.json["approval"]["status"], "approved");
    assert_eq!(approved.json["run"]["status"], "done", "{}", approved.json);
    let after = server.approval(&c102.approval).await;
    assert_eq!(after["comments"][0]["text"], "receipt attached?");
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);

    // A current snapshot decides in one write; sent again, the decision is replayed.
    let (server, c102) = Server::with_paused_run("snapshot-current", "ben", "c-102").await;
    let shown = server.approval(&c102.approval).await;
    let body = approve_shown("dana-1", &shown["snapshot"]);
    let first = server.decided("dana", &c102.approval, body.clone()).await;
    assert_eq!(first.json["replayed"], false);
    let again = server.decided("dana", &c102.approval, body).await;
    assert_eq!(again.json["replayed"], true);
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);
}

#[tokio::test]
async fn a_snapshot_countersign_did_not_give_is_400_and_changes_nothing() {
    let c102 = Pending::c102("bad-snapshot").await;
    for snapshot in [json!("not a snapshot"), json!(""), json!("e30")] {
        let reply = c102
            .decide("dana", &c102.approval, approve_shown("dana-1", &snapshot))
            .await;
        c102.refused(&reply, 400, "bad_input").await;
        assert_eq!(
            reply.json["error"]["message"],
            "the snapshot is not one Countersign gave"
        );
    }
    // Not a string at all: the body is malformed.
    let reply = c102
        .decide("dana", &c102.approval, approve_shown("dana-1", &json!(7)))
        .await;
    assert_eq!(reply.status, 400, "{}", reply.json);
    c102.unchanged().await;
}

#[test]
fn a_token_for_someone_outside_the_directory_is_refused() {
    let state = std::env::temp_dir().join(format!("countersign-api-token-{}", std::process::id()));
    let output = countersign(&state)
        .args(["token", "--as", "mallory"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&state);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("mallory"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_view_names_who_approved_so_far_and_what_may_be_edited() {
    let (server, c105) = Server::with_paused_run("view", "ana", "c-105").await;
    server.dana_approves(&c105.approval).await;
    let approval = server.approval(&c105.approval).await;
    assert_eq!(approval["approved_by"], json!(["dana"]));
    assert_eq!(approval["still_needed"], 1);

    // c-103 is declined as a duplicate of c-101 once c-101 is paid.
    let c101 = server.start_run("ana", json!({"claim_id": "c-101"})).await;
    assert_eq!(c101.json["status"], "done", "{}", c101.json);
    let c103 = server.paused_run("ana", "c-103", None).await;
    let decline = server.approval(&c103.approval).await;
    assert_eq!(decline["tool"], "decline");
    assert_eq!(
        decline["editable_amount"],
        Value::Null,
        "a decline has no amount"
    );
}

/// A plain GET without a token: the status, a header and the body.
async fn get_page(server: &Server, path: &str, header: &str) -> (u16, Option<String>, String) {
    let response = server
        .http
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let value = response
        .headers()
        .get(header)
        .map(|v| v.to_str().unwrap().to_string());
    (status, value, response.text().await.unwrap())
}

#[tokio::test]
async fn the_review_page_is_served_without_a_token_under_a_strict_policy() {
    let server = Server::start("page");
    let (status, csp, html) = get_page(&server, "/", "content-security-policy").await;
    assert_eq!(status, 200);
    assert!(html.contains("<title>Countersign review</title>"), "{html}");
    let csp = csp.expect("a Content-Security-Policy");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    let (status, content_type, script) =
        get_page(&server, "/review/review.js", "content-type").await;
    assert_eq!(status, 200);
    assert_eq!(
        content_type.as_deref(),
        Some("text/javascript; charset=utf-8")
    );
    assert!(script.contains("decision_id"));
    let (status, _, body) = get_page(&server, "/review/%2e%2e%2fdev-jwt.key", "content-type").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn development_sign_in_issues_a_token_for_a_person_of_the_directory() {
    let server = Server::start_dev("dev-sign-in");
    let secret = server.dev_secret();
    let people = server
        .http
        .get(format!("{}/dev/people", server.base))
        .header("x-countersign-dev-secret", &secret)
        .send()
        .await
        .unwrap();
    assert_eq!(people.status(), 200);
    let people: Value = people.json().await.unwrap();
    let dana = item_where(&people["people"], "name", "dana");
    assert_eq!(dana["tenant"], "acme");
    assert_eq!(dana["roles"], json!(["employee", "finance"]));

    let issue = |name: &str| {
        server
            .http
            .post(format!("{}/dev/token", server.base))
            .header("x-countersign-dev-secret", &secret)
            .json(&json!({"as": name}))
    };
    let issued = issue("dana").send().await.unwrap();
    assert_eq!(
        issued.headers()["cache-control"],
        "no-store",
        "a token is kept by no cache"
    );
    let issued: Value = issued.json().await.unwrap();
    assert_eq!(issued["person"], "dana");
    assert!(issued["expires_at"].is_string(), "{issued}");
    let token = issued["token"].as_str().unwrap().to_string();
    let listed = server
        .send(reqwest::Method::GET, "/approvals", Some(token), None)
        .await;
    assert_eq!(listed.status, 200, "{}", listed.json);

    let stranger = issue("mallory").send().await.unwrap();
    assert_eq!(stranger.status(), 403);
    let stranger: Value = stranger.json().await.unwrap();
    assert_eq!(stranger["error"]["code"], "unknown_person");

    // A page that rebinds its own name to this address does not get a token.
    let rebound = issue("dana")
        .header("host", "attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);
    let rebound: Value = rebound.json().await.unwrap();
    assert_eq!(rebound["error"]["code"], "not_local");
}

#[tokio::test]
async fn development_sign_in_needs_the_secret_only_the_states_owner_can_read() {
    let server = Server::start_dev("dev-secret");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(server.state.join("dev-sign-in.secret"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let secret = server.dev_secret();
    // The last digit changed to one it is not, so the wrong secret is never the secret.
    let last = if secret.ends_with('0') { '1' } else { '0' };
    let wrong = format!("{}{last}", &secret[..secret.len() - 1]);
    assert_ne!(wrong, secret);
    let twice = [secret.as_str(), secret.as_str()];
    for shown in [&[][..], &[""], &[wrong.as_str()], &twice] {
        let token = server
            .http
            .post(format!("{}/dev/token", server.base))
            .json(&json!({"as": "dana"}));
        let people = server.http.get(format!("{}/dev/people", server.base));
        for mut request in [token, people] {
            for shown in shown {
                request = request.header("x-countersign-dev-secret", *shown);
            }
            let refused = request.send().await.unwrap();
            assert_eq!(refused.status(), 403, "{shown:?}");
            let refused: Value = refused.json().await.unwrap();
            assert_eq!(refused["error"]["code"], "dev_secret", "{shown:?}");
            assert!(refused.get("token").is_none(), "{refused}");
            assert!(refused.get("people").is_none(), "{refused}");
            assert!(!refused.to_string().contains("dana"), "{refused}");
        }
    }
}

#[tokio::test]
async fn without_dev_sign_in_there_is_no_dev_route() {
    let server = Server::start("no-dev-sign-in");
    let (status, _, body) = get_page(&server, "/dev/people", "content-type").await;
    assert_eq!(status, 404, "{body}");
    let refused = server
        .http
        .post(format!("{}/dev/token", server.base))
        .json(&json!({"as": "dana"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    assert!(
        !server.state.join("dev-sign-in.secret").exists(),
        "no secret is made when sign-in is off"
    );
}

/// Sends `request` as written on a fresh connection and returns what came back, or what came
/// back before the server closed it.
async fn raw_exchange(addr: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn development_sign_in_refuses_two_host_headers_and_anything_after_a_bracketed_host() {
    let server = Server::start_dev("dev-hosts");
    let secret = server.dev_secret();
    let body = r#"{"as":"dana"}"#;
    let request = |hosts: &[&str]| {
        let hosts: String = hosts.iter().map(|h| format!("Host: {h}\r\n")).collect();
        format!(
            "POST /dev/token HTTP/1.1\r\n{hosts}X-Countersign-Dev-Secret: {secret}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let addr = server.addr();
    let port = addr.rsplit_once(':').unwrap().1;
    let local = format!("127.0.0.1:{port}");

    let one = raw_exchange(&addr, &request(&[&local])).await;
    assert!(one.starts_with("HTTP/1.1 200"), "{one}");
    for hosts in [
        vec![local.as_str(), "attacker.example"],
        vec!["attacker.example", local.as_str()],
        vec![local.as_str(), local.as_str()],
        vec!["[::1]attacker.example"],
        vec!["[::1].attacker.example:80"],
        vec!["localhost:80@attacker.example"],
    ] {
        let answer = raw_exchange(&addr, &request(&hosts)).await;
        assert!(
            answer.starts_with("HTTP/1.1 403") || answer.starts_with("HTTP/1.1 400"),
            "{hosts:?}: {answer}"
        );
        assert!(!answer.contains("\"token\""), "{hosts:?}: {answer}");
    }
}

#[tokio::test]
async fn json_answers_are_never_cached_nor_sniffed() {
    let server = Server::start("headers");
    let token = server.token("dana");
    for (path, bearer, status) in [
        ("/approvals", Some(token), 200),
        ("/approvals", None, 401),
        ("/no/such/route", None, 404),
    ] {
        let mut request = server.http.get(format!("{}{path}", server.base));
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let reply = request.send().await.unwrap();
        assert_eq!(reply.status().as_u16(), status, "{path}");
        let headers = reply.headers();
        assert_eq!(headers["cache-control"], "no-store", "{path} {status}");
        assert_eq!(
            headers["x-content-type-options"], "nosniff",
            "{path} {status}"
        );
    }
    let (_, nosniff, _) = get_page(&server, "/", "x-content-type-options").await;
    assert_eq!(nosniff.as_deref(), Some("nosniff"), "the page too");
}

#[tokio::test]
async fn a_connection_that_stops_mid_headers_or_sits_idle_is_closed() {
    let server = Server::start_with(
        "slow-client",
        &[
            "--sweep-every",
            "0s",
            "--header-timeout",
            "1s",
            "--body-timeout",
            "1s",
        ],
    );
    let addr = server.addr();
    let started = std::time::Instant::now();
    let stalled = raw_exchange(&addr, "GET /approvals HTTP/1.1\r\nHost: 127.0.0.1\r\n").await;
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "closed after {waited:?}, not left open: {stalled:?}"
    );
    assert!(!stalled.contains("200 OK"), "{stalled}");

    // Nothing sent at all is the same as a head that never ends.
    let started = std::time::Instant::now();
    let silent = raw_exchange(&addr, "").await;
    assert!(started.elapsed() < Duration::from_secs(10), "{silent:?}");

    // A keep-alive connection that sits idle after its answer is closed too.
    let started = std::time::Instant::now();
    let idle = raw_exchange(
        &addr,
        "GET /no/such/route HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    )
    .await;
    assert!(idle.starts_with("HTTP/1.1 404"), "{idle}");
    assert!(started.elapsed() < Duration::from_secs(10), "{idle:?}");

    // A head that arrived, then a body that stops halfway: 408, and the connection ends.
    let half_body = |authorization: &str| {
        format!(
            "POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}\
             Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{{\"claim"
        )
    };
    let started = std::time::Instant::now();
    let bearer = format!("Authorization: Bearer {}\r\n", server.token("ben"));
    let late = raw_exchange(&addr, &half_body(&bearer)).await;
    assert!(started.elapsed() < Duration::from_secs(10), "{late:?}");
    assert!(late.starts_with("HTTP/1.1 408"), "{late}");
    assert!(late.contains("request_timeout"), "{late}");
    assert!(late.contains("connection: close"), "{late}");

    // Without a token the body is never waited for: the answer is at once.
    let started = std::time::Instant::now();
    let anonymous = raw_exchange(&addr, &half_body("")).await;
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(anonymous.contains("missing_token"), "{anonymous}");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "answered after {:?}, not at once",
        started.elapsed()
    );
}

/// The status and JSON body of an answer read whole by [`raw_exchange`].
fn status_and_json(answer: &str) -> (u16, Value) {
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    let json = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer:?}"));
    (status, json)
}

#[tokio::test]
async fn a_path_or_headers_too_large_are_refused_in_the_apis_own_words_and_change_nothing() {
    let c102 = Pending::c102("large-head").await;
    let addr = c102.addr();
    let token = c102.token("dana");
    let body = approve("d1").to_string();
    let request = |path: &str, headers: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             {headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let decisions = format!("/approvals/{}/decisions", c102.approval);
    let long_path = format!("/approvals/{}/decisions", "a".repeat(100_000));
    let big_header = format!("X-Padding: {}\r\n", "a".repeat(200_000));
    let many_headers = "X-Padding: a\r\n".repeat(101);
    for (path, headers, status, code) in [
        (long_path.as_str(), "", 414, "uri_too_long"),
        (
            decisions.as_str(),
            big_header.as_str(),
            431,
            "headers_too_large",
        ),
        (
            decisions.as_str(),
            many_headers.as_str(),
            431,
            "headers_too_large",
        ),
    ] {
        let answer = raw_exchange(&addr, &request(path, headers)).await;
        let (got, json) = status_and_json(&answer);
        let reply = common::server::Reply {
            status: got,
            json,
            www_authenticate: None,
        };
        c102.refused(&reply, status, code).await;
    }
    let get = format!(
        "GET /approvals/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n",
        "a".repeat(100_000)
    );
    let (status, json) = status_and_json(&raw_exchange(&addr, &get).await);
    assert_eq!(
        (status, &json["error"]["code"]),
        (414, &json!("uri_too_long"))
    );

    // A head under the limit, as a browser with many cookies sends, is read as always.
    let cookies = format!("Cookie: c={}\r\nConnection: close\r\n", "a".repeat(20_000));
    let answer = raw_exchange(&addr, &request(&decisions, &cookies)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Reads one answer from `stream`: its head, and as many bytes of body as its Content-Length
/// says. None once the server closed the connection instead.
async fn read_answer(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map_or(0, |n| n.trim().parse().unwrap());
            if answer.len() >= end + 4 + length {
                return Some(String::from_utf8_lossy(&answer).into_owned());
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A server that takes one connection at a time, and gives a head `header_timeout`.
fn one_connection_server(name: &str, header_timeout: &str) -> Server {
    Server::start_with(
        name,
        &[
            "--sweep-every",
            "0s",
            "--header-timeout",
            header_timeout,
            "--max-connections",
            "1",
        ],
    )
}

/// A connection of its own to `server`, on which `sent` was sent.
async fn connection_that_sent(server: &Server, sent: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    stream.write_all(sent).await.unwrap();
    stream
}

#[tokio::test]
async fn a_connection_in_the_middle_of_a_request_is_never_cut_to_admit_another() {
    let server = one_connection_server("capped-busy", "2s");
    let token = server.token("dana");
    // One client holds the only connection with half a request's head.
    let _holder =
        connection_that_sent(&server, b"GET /approvals HTTP/1.1\r\nHost: 127.0.0.1\r\n").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let listed = server
        .send(reqwest::Method::GET, "/approvals", Some(token), None)
        .await;
    let waited = started.elapsed();
    assert_eq!(listed.status, 200, "{}", listed.json);
    assert!(
        waited >= Duration::from_millis(1_000),
        "answered after {waited:?}: it should have waited for the half request's head timeout"
    );
}

#[tokio::test]
async fn a_connection_idle_between_requests_is_closed_to_admit_a_new_one() {
    let server = one_connection_server("capped-idle", "30s");
    let token = server.token("dana");
    // One client holds the only connection, idle after its first answer.
    let mut holder =
        connection_that_sent(&server, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
    let page = read_answer(&mut holder).await.expect("the page");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let started = std::time::Instant::now();
    let listed = server
        .send(
            reqwest::Method::GET,
            "/approvals",
            Some(token.clone()),
            None,
        )
        .await;
    assert_eq!(listed.status, 200, "{}", listed.json);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}: the idle connection should have made room at once",
        started.elapsed()
    );
    assert!(
        read_answer(&mut holder).await.is_none(),
        "the idle connection was closed"
    );

    // A client that connected and has not sent anything yet is idle too.
    let silent = connection_that_sent(&server, b"").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let listed = server
        .send(reqwest::Method::GET, "/approvals", Some(token), None)
        .await;
    assert_eq!(listed.status, 200, "{}", listed.json);
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(silent);
}

/// A client that keeps a connection open and asks for the review page without a token every
/// `every`, connecting again whenever the server closed it; counts its first answer in
/// `answered`.
async fn keep_alive_pest(
    addr: String,
    every: Duration,
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::AsyncWriteExt;
    let mut counted = false;
    loop {
        let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await else {
            tokio::time::sleep(every).await;
            continue;
        };
        loop {
            let sent = stream
                .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .await;
            if sent.is_err() || read_answer(&mut stream).await.is_none() {
                break;
            }
            if !counted {
                counted = true;
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            tokio::time::sleep(every).await;
        }
    }
}

#[tokio::test]
async fn keep_alive_connections_past_the_cap_do_not_keep_a_new_client_out() {
    let server = Server::start("keep-alive-flood");
    let token = server.token("dana");
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // More cheap keep-alive clients than the server takes connections (256), each asking
    // again well within the header timeout (10 s), so none ever idles out.
    let pests: Vec<_> = (0..300)
        .map(|_| {
            tokio::spawn(keep_alive_pest(
                server.addr(),
                Duration::from_secs(2),
                answered.clone(),
            ))
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while answered.load(std::sync::atomic::Ordering::Relaxed) < 256 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} clients were answered",
            answered.load(std::sync::atomic::Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let listed = tokio::time::timeout(
        Duration::from_secs(30),
        server.send(reqwest::Method::GET, "/approvals", Some(token), None),
    )
    .await
    .expect("a new client is answered while the pests keep their connections busy");
    assert_eq!(listed.status, 200, "{}", listed.json);
    for pest in pests {
        pest.abort();
    }
}

#[tokio::test]
async fn the_server_sweeps_on_its_own_so_an_unanswered_approval_expires_and_the_run_is_told() {
    let server = Server::start_sweeping("sweeping", "1s");
    let c104 = server.paused_run("chen", "c-104", Some("0s")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut approval = server.approval(&c104.approval).await;
    while approval["status"] == "awaiting_approval" && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        approval = server.approval(&c104.approval).await;
    }
    assert_eq!(
        approval["status"], "expired",
        "nobody decided; the server's sweep expired it"
    );
    let events = server
        .events_of_action(&c104.run, &approval["action_id"])
        .await;
    assert_eq!(events, ["proposed", "expired"]);
}

#[tokio::test]
async fn each_approval_names_its_task_and_what_was_decided_lately_says_by_whom_and_how_the_call_ended()
 {
    let server = Server::start("decided");
    let c102 = server.paused_run("ben", "c-102", None).await;
    let c104 = server.paused_run("chen", "c-104", None).await;

    let waiting = server.get("/approvals", "dana").await;
    assert_eq!(waiting.status, 200, "{}", waiting.json);
    let card = item_where(&waiting.json["approvals"], "id", &c102.approval);
    assert_eq!(card["agent"], "expense");
    assert_eq!(card["task"], "Process expense claim c-102.");
    assert_eq!(
        server.approval(&c104.approval).await["task"],
        "Process expense claim c-104."
    );
    let nothing = server.get("/approvals/decided", "dana").await;
    assert_eq!(nothing.status, 200, "{}", nothing.json);
    assert_eq!(nothing.json["approvals"], json!([]));

    // dana approves c-102 (paid), then erin rejects c-104.
    server.dana_approves(&c102.approval).await;
    let reject = json!({"decision_id": "erin-1", "action_version": 1, "choice": "reject", "reason": "No receipt."});
    server.decided("erin", &c104.approval, reject).await;

    let decided = server.get("/approvals/decided", "chen").await;

    assert_eq!(decided.status, 200, "{}", decided.json);
    let listed = &decided.json["approvals"];
    assert_eq!(texts(listed, "id"), [&c104.approval, &c102.approval]);
    let rejected = &listed[0];
    assert_eq!(rejected["status"], "rejected");
    assert_eq!(rejected["task"], "Process expense claim c-104.");
    assert_eq!(rejected["decisions"][0]["by"], "erin");
    assert_eq!(rejected["decisions"][0]["reason"], "No receipt.");
    assert_eq!(rejected["call"]["status"], "rejected");
    let approved = &listed[1];
    assert_eq!(approved["decisions"][0]["by"], "dana");
    assert_eq!(approved["call"]["status"], "succeeded");
    assert_eq!(approved["call"]["version"], 1);
    assert!(
        approved["call"]["result"]["content"]
            .as_str()
            .unwrap()
            .contains("$250.00"),
        "{approved}"
    );
    assert!(approved.get("snapshot").is_none(), "nothing to decide");

    // Bounded; another tenant's reviewer sees none of it; bad limits and parameters are refused.
    let newest = server.get("/approvals/decided?limit=1", "dana").await;
    assert_eq!(texts(&newest.json["approvals"], "id"), [&c104.approval]);
    let globex = server.get("/approvals/decided", "zoe").await;
    assert_eq!(globex.json["approvals"], json!([]));
    for (query, code) in [
        ("limit=0", "invalid_field"),
        ("limit=51", "invalid_field"),
        ("limit=ten", "invalid_field"),
        ("since=yesterday", "unknown_field"),
    ] {
        let refused = server
            .get(&format!("/approvals/decided?{query}"), "dana")
            .await;
        assert_refused(&refused, 400, code);
    }
    let anonymous = server
        .send(reqwest::Method::GET, "/approvals/decided", None, None)
        .await;
    assert_refused(&anonymous, 401, "missing_token");
}

#[tokio::test]
async fn a_requester_at_the_cap_of_open_approvals_is_told_not_proposed_and_no_reviewer_sees_the_call()
 {
    let server = Server::start_with(
        "open-cap",
        &["--sweep-every", "0s", "--max-open-approvals", "1"],
    );
    let pay = |call_id: &str, claim: &str| {
        json!({"agent": "expense", "tool": "reimburse", "call_id": call_id,
               "args": {"claim_id": claim, "amount_cents": 20_000}})
    };
    let first = server
        .post("/gate/calls", "ben", pay("call-1", "c-102"))
        .await;
    assert_eq!(first.status, 202, "{}", first.json);

    // Through the gate: 429, in words that say what to do.
    let refused = server
        .post("/gate/calls", "ben", pay("call-2", "c-104"))
        .await;
    common::server::assert_refused_naming(&refused, 429, "too_many_open_approvals", "ben has 1");
    let message = refused.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("propose it again once reviewers have decided"),
        "{message}"
    );
    // An agent's run: its model is told, and the run goes on without a person.
    let run = server.start_run("ben", json!({"claim_id": "c-104"})).await;
    assert_eq!(run.json["status"], "done", "{}", run.json);
    let audit = server.audit(run.json["run_id"].as_str().unwrap()).await;
    let refusal = item_where(&audit["entries"], "event", "refused");
    assert!(
        refusal["why"]
            .as_str()
            .unwrap()
            .contains("not proposed: too many open approvals"),
        "{refusal}"
    );
    // Over MCP: a plain answer the model acts on.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "reimburse", "arguments": {"claim_id": "c-103", "amount_cents": 20_000}}});
    let called = server
        .http
        .post(format!("{}/mcp/expense", server.base))
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(server.token("ben"))
        .json(&call)
        .send()
        .await
        .unwrap();
    let called: Value = called.json().await.unwrap();
    let result = &called["result"];
    assert_eq!(result["isError"], true, "{called}");
    assert_eq!(result["_meta"]["countersign/status"], "refused", "{called}");
    let told = result["content"][0]["text"].as_str().unwrap();
    assert!(
        told.starts_with("Not executed: not proposed: too many open approvals (ben has 1 waiting"),
        "{told}"
    );

    let waiting = server.get("/approvals", "dana").await;
    assert_eq!(
        texts(&waiting.json["approvals"], "id"),
        [first.json["approval"]["id"].as_str().unwrap()]
    );
    // Another requester's call is proposed.
    let chens = server
        .post("/gate/calls", "chen", pay("call-3", "c-101"))
        .await;
    assert_eq!(chens.status, 202, "{}", chens.json);
}

#[tokio::test]
async fn what_waits_is_listed_a_page_at_a_time_and_a_cursor_no_page_gave_is_400() {
    let server = Server::start("pages");
    let mut paused = Vec::new();
    for _ in 0..5 {
        paused.push(server.paused_run("ben", "c-102", None).await.approval);
    }

    let mut listed = Vec::new();
    let mut path = "/approvals?limit=2".to_string();
    let mut pages = 0;
    loop {
        let page = server.get(&path, "dana").await;
        assert_eq!(page.status, 200, "{}", page.json);
        pages += 1;
        let ids = texts(&page.json["approvals"], "id");
        assert!(ids.len() <= 2, "{}", page.json);
        listed.extend(ids.into_iter().map(str::to_string));
        match page.json["next_cursor"].as_str() {
            Some(cursor) => path = format!("/approvals?limit=2&cursor={cursor}"),
            None => {
                assert!(page.json["next_cursor"].is_null(), "{}", page.json);
                break;
            }
        }
    }
    assert_eq!(pages, 3);
    let mut expected = paused.clone();
    expected.sort();
    listed.sort();
    assert_eq!(listed, expected, "each once");
    let whole = server.get("/approvals", "dana").await;
    assert_eq!(
        whole.json["approvals"].as_array().unwrap().len(),
        5,
        "50 by default"
    );

    for (query, code) in [
        ("cursor=not-one", "invalid_field"),
        ("limit=0", "invalid_field"),
        ("limit=201", "invalid_field"),
        ("page=2", "unknown_field"),
    ] {
        let refused = server.get(&format!("/approvals?{query}"), "dana").await;
        assert_refused(&refused, 400, code);
    }
}
