//! Deciding where reviewers are: every notice and reminder links to its approval on the review
//! page when the page's public address is configured, and carries no link when it is not.

#[macro_use]
mod harness;
// Only the receiver of the shared notification helpers is used here.
#[allow(dead_code)]
#[path = "harness/notices.rs"]
mod notices;

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::Duration;
use shared::adapters::webhook::{Webhooks, public_url};
use shared::example::expense::OfflineExpenseAgent;
use shared::ports::notifier::Notifier;

use harness::{Embedded, Harness, Process};
use notices::Receiver;

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
