//! The X-Ray trace across the resume queue, on the local AWS stack: a message sent during a
//! traced Lambda invocation (the runtime sets `_X_AMZN_TRACE_ID` for each one) carries its trace
//! header as SQS's `AWSTraceHeader` system attribute, which the consumer receives; a message sent
//! outside one carries none. A binary of its own: the test changes the process's environment.

mod support;

use std::time::Duration;

use shared::adapters::sqs::TRACE_HEADER;
use shared::domain::ids::{ActionId, ActionVersion, RunId, TenantId};
use shared::ports::queue::{QueueMessage, ResumeMessage, ResumeQueue};
use support::aws::FreshStack;

/// A resume message of its own run, so each is a group of its own.
fn resume(name: &str) -> ResumeMessage {
    ResumeMessage {
        tenant: TenantId::parse("acme").unwrap(),
        run_id: RunId::parse(&format!("run-{name}")).unwrap(),
        action_id: ActionId::parse(&format!("act-{name}")).unwrap(),
        version: ActionVersion::FIRST,
        resent: 0,
    }
}

#[tokio::test]
async fn given_a_traced_invocation_then_the_message_it_sends_carries_its_trace_header_and_one_sent_untraced_carries_none()
 {
    let stack = FreshStack::new("trace-header").await;
    let queue = stack.aws().queue;
    let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";

    // SAFETY: this binary's only test; no other thread of it reads the environment meanwhile.
    unsafe { std::env::set_var("_X_AMZN_TRACE_ID", header) };
    let traced = queue.publish(&resume("traced")).await;
    unsafe { std::env::remove_var("_X_AMZN_TRACE_ID") };
    traced.unwrap();
    queue.publish(&resume("untraced")).await.unwrap();
    let received = queue.receive(10, Duration::from_secs(1)).await.unwrap();

    let headers: Vec<(String, Option<&str>)> = received
        .iter()
        .map(|r| match r.message.as_ref().unwrap() {
            QueueMessage::Resume(message) => {
                (message.run_id.to_string(), r.trace_header.as_deref())
            }
            other => panic!("a resume message, not {other:?}"),
        })
        .collect();
    assert_eq!(
        headers,
        [
            ("run-traced".to_string(), Some(header)),
            ("run-untraced".to_string(), None)
        ],
        "the {TRACE_HEADER} attribute of each message received"
    );
}
