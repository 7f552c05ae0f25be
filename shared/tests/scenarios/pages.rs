//! What waits, read a page at a time: every waiting approval once, soonest deadline first,
//! however the pages fall and whatever is decided between them.

use super::*;
use shared::engine::PendingCursor;

/// A process whose runs each pause on one approval, and `n` of them started a minute apart,
/// so each is due a minute after the one before.
async fn waiting(h: &Harness, n: usize) -> Process {
    let p = h
        .scripted_process(Script::default().then_call(&[reimburse("c-102", 25_000)]))
        .await;
    for _ in 0..n {
        let report = p.start(scripted_task("ben")).await.unwrap();
        assert_eq!(report.status, RunStatus::AwaitingApproval);
        h.clock.advance(Duration::minutes(1));
    }
    p
}

/// Every page of the tenant's waiting approvals, `limit` at a time: the ids of each.
async fn pages_of(p: &Process, limit: usize) -> Vec<Vec<ApprovalId>> {
    let mut pages = Vec::new();
    let mut after: Option<PendingCursor> = None;
    loop {
        let page = p
            .pending_page(&acme(), after.as_ref(), limit)
            .await
            .unwrap();
        pages.push(
            page.approvals
                .iter()
                .map(|s| s.approval.id.clone())
                .collect(),
        );
        // The cursor travels as a client carries it.
        match page.next {
            Some(next) => after = Some(PendingCursor::parse(&next.encode()).unwrap()),
            None => return pages,
        }
    }
}

async fn given_five_waiting_approvals_when_they_are_read_two_at_a_time_then_each_comes_once_in_deadline_order(
    h: &Harness,
) {
    let p = waiting(h, 5).await;
    let all: Vec<ApprovalId> = p
        .pending(&acme())
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(all.len(), 5);

    let pages = pages_of(&p, 2).await;

    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(pages.concat(), all, "each once, soonest deadline first");
    assert_eq!(pages_of(&p, 5).await, [all], "one page when it fits");
}

async fn given_the_approval_a_cursor_names_was_decided_when_the_next_page_is_read_then_it_starts_after_it(
    h: &Harness,
) {
    let p = waiting(h, 3).await;
    let first = p.pending_page(&acme(), None, 1).await.unwrap();
    let cursor = first.next.expect("more follow");
    let decided = &first.approvals[0].approval;
    h.decided(&p, "dana", &decided.id, reject("d-1", "no"))
        .await;

    let rest = p.pending_page(&acme(), Some(&cursor), 10).await.unwrap();

    let ids: Vec<&ApprovalId> = rest.approvals.iter().map(|s| &s.approval.id).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(!ids.contains(&&decided.id));
    assert!(rest.next.is_none());
}

on_both_stores!([
    given_five_waiting_approvals_when_they_are_read_two_at_a_time_then_each_comes_once_in_deadline_order,
    given_the_approval_a_cursor_names_was_decided_when_the_next_page_is_read_then_it_starts_after_it,
]);
