//! Comments over the HTTP API of a real `countersign serve`: a comment decides nothing, is kept
//! on the approval and in the audit log, and every bad request is refused and changes nothing.

use serde_json::json;

mod common;

use common::server::{Server, approve, assert_refused, assert_refused_naming};
use common::texts;

#[tokio::test]
async fn a_comment_is_kept_and_audited_and_bad_ones_are_refused() {
    let server = Server::start("comments");
    let paused = server.paused_run("ben", "c-102", None).await;
    let path = format!("/approvals/{}/comments", paused.approval);

    // Anyone of the organisation may comment, the requester included; nobody decides by it.
    let asked = server
        .post(
            &path,
            "chen",
            json!({"text": "  Is the receipt attached?  "}),
        )
        .await;
    assert_eq!(asked.status, 201, "{}", asked.json);
    assert_eq!(asked.json["status"], "awaiting_approval");
    assert_eq!(asked.json["comments"][0]["by"], "chen");
    assert_eq!(
        asked.json["comments"][0]["text"],
        "Is the receipt attached?"
    );
    let answered = server.post(&path, "ben", json!({"text": "Yes."})).await;
    assert_eq!(answered.status, 201, "{}", answered.json);

    let refusals = [
        (
            server.post(&path, "dana", json!({"text": "   "})).await,
            400,
            "bad_input",
        ),
        (
            server
                .post(&path, "dana", json!({"text": "x".repeat(2_001)}))
                .await,
            400,
            "bad_input",
        ),
        (
            server
                .post(&path, "dana", json!({"text": "hi", "by": "erin"}))
                .await,
            400,
            "unknown_field",
        ),
        (
            server.post(&path, "dana", json!({})).await,
            400,
            "missing_field",
        ),
        (
            server.post(&path, "zoe", json!({"text": "hi"})).await,
            404,
            "not_found",
        ),
        (
            server
                .send(
                    reqwest::Method::POST,
                    &path,
                    None,
                    Some(("application/json", br#"{"text":"hi"}"#.to_vec())),
                )
                .await,
            401,
            "missing_token",
        ),
    ];
    for (reply, status, code) in &refusals {
        assert_refused(reply, *status, code);
    }

    let stored = server.approval(&paused.approval).await;
    let said = texts(&stored["comments"], "text");
    assert_eq!(said, ["Is the receipt attached?", "Yes."]);

    // Comments do not stand in a decision's way.
    server
        .decided("dana", &paused.approval, approve("d-1"))
        .await;
    let audit = server
        .get(&format!("/runs/{}/audit", paused.run), "dana")
        .await;
    let events = texts(&audit.json["entries"], "event");
    let commented: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| **e == "commented")
        .map(|(n, _)| n)
        .collect();
    assert_eq!(commented.len(), 2, "{events:?}");
    let decision = events.iter().position(|e| *e == "decision").unwrap();
    assert!(commented[1] < decision, "{events:?}");
}

#[tokio::test]
async fn one_person_may_not_fill_an_approval_with_comments() {
    let server = Server::start("comment-cap");
    let paused = server.paused_run("ben", "c-102", None).await;
    let path = format!("/approvals/{}/comments", paused.approval);
    let comment = |name: &'static str, n: usize| {
        let path = path.clone();
        let server = &server;
        async move {
            let text = format!("{name}'s remark {n}");
            server.post(&path, name, json!({ "text": text })).await
        }
    };
    for n in 1..=20 {
        let reply = comment("chen", n).await;
        assert_eq!(reply.status, 201, "{}", reply.json);
    }
    let before = server.approval(&paused.approval).await;
    let twenty_first = comment("chen", 21).await;
    assert_refused_naming(&twenty_first, 409, "too_many_comments", "chen");
    assert_eq!(server.approval(&paused.approval).await, before);

    // Everyone else still may, until the approval holds its 100.
    for name in ["ben", "dana", "erin", "ana"] {
        for n in 1..=20 {
            let reply = comment(name, n).await;
            assert_eq!(reply.status, 201, "{name} {n}: {}", reply.json);
        }
    }
    let full = server.approval(&paused.approval).await;
    assert_eq!(full["comments"].as_array().unwrap().len(), 100);
    let one_too_many = comment("sam", 1).await;
    assert_refused(&one_too_many, 409, "too_many_comments");
    assert_eq!(server.approval(&paused.approval).await, full);
    let audit = server
        .get(&format!("/runs/{}/audit", paused.run), "dana")
        .await;
    let events = texts(&audit.json["entries"], "event");
    let commented = events.iter().filter(|e| **e == "commented").count();
    assert_eq!(commented, 100, "a refused comment is not audited");
}
