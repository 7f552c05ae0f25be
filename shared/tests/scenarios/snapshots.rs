//! Deciding from a snapshot: the approval as the reviewer was shown it comes back with the
//! decision, which is then one request to the store while the approval is unchanged, and is
//! ruled on the stored approval whenever it is not (stale, forged, of another approval).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use shared::ports::store::{ItemStore, Page, Query, Refused, StoreError, Write};

use super::*;

/// Every request a process makes to its store, counted by kind.
#[derive(Default)]
struct Requests {
    gets: AtomicUsize,
    pages: AtomicUsize,
    transactions: AtomicUsize,
}

impl Requests {
    /// (reads of one item, query pages, transactions) so far.
    fn counts(&self) -> (usize, usize, usize) {
        (
            self.gets.load(Ordering::SeqCst),
            self.pages.load(Ordering::SeqCst),
            self.transactions.load(Ordering::SeqCst),
        )
    }

    /// (reads of one item, query pages, transactions) since `before`, an earlier [`Self::counts`].
    fn since(&self, before: (usize, usize, usize)) -> (usize, usize, usize) {
        let now = self.counts();
        (now.0 - before.0, now.1 - before.1, now.2 - before.2)
    }
}

struct Counting {
    inner: Arc<dyn ItemStore>,
    requests: Arc<Requests>,
}

#[async_trait::async_trait]
impl ItemStore for Counting {
    async fn get(
        &self,
        pk: &str,
        sk: &str,
    ) -> Result<Option<shared::ports::store::Item>, StoreError> {
        self.requests.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(pk, sk).await
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        self.requests.pages.fetch_add(1, Ordering::SeqCst);
        self.inner.page(query).await
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.transact_or_found(writes).await.map_err(|r| r.error)
    }

    async fn transact_or_found(&self, writes: Vec<Write>) -> Result<(), Refused> {
        self.requests.transactions.fetch_add(1, Ordering::SeqCst);
        self.inner.transact_or_found(writes).await
    }
}

/// A process whose store requests are counted and whose resume messages go to a queue that
/// records them (so a decision's requests are its own, not the resumed run's), and c-102 paused
/// on it: the process, its requests, the queue and the approval.
async fn counted_and_paused(
    h: &Harness,
) -> (Process, Arc<Requests>, Arc<RecordingQueue>, Approval) {
    let requests = Arc::new(Requests::default());
    let queue = Arc::new(RecordingQueue::default());
    let counted = requests.clone();
    let delivery = Delivery::Queue(queue.clone());
    let p = h
        .process_configured(
            Arc::new(shared::example::expense::OfflineExpenseAgent),
            move |inner| {
                Arc::new(Counting {
                    inner,
                    requests: counted,
                })
            },
            move |b| b.delivery(delivery),
        )
        .await;
    let (_, approval) = h.start_paused(&p, "c-102").await;
    (p, requests, queue, approval)
}

/// The snapshot of `approval` a reviewer is shown now.
async fn shown(p: &Process, approval: &Approval) -> String {
    p.approval_shown(&acme(), &approval.id)
        .await
        .unwrap()
        .snapshot
}

/// `snapshot` with its approval edited by `edit`, its version kept: what a client could forge.
fn forged(snapshot: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(snapshot).unwrap()).unwrap();
    let (ver, body) = text.split_once('.').expect("a version, a dot, the body");
    let mut body: serde_json::Value = serde_json::from_str(body).unwrap();
    edit(&mut body);
    URL_SAFE_NO_PAD.encode(format!("{ver}.{body}"))
}

async fn decide_shown(
    h: &Harness,
    p: &Process,
    who: &str,
    approval: &Approval,
    request: DecisionRequest,
    snapshot: &str,
) -> Result<DecisionReport, EngineError> {
    p.decide_shown(&h.person(who), &approval.id, request, Some(snapshot))
        .await
}

async fn given_the_snapshot_dana_was_shown_when_she_approves_then_the_decision_is_one_request_to_the_store(
    h: &Harness,
) {
    let (p, requests, queue, approval) = counted_and_paused(h).await;
    let snapshot = shown(&p, &approval).await;
    let before = requests.counts();

    let report = decide_shown(h, &p, "dana", &approval, approve("d-dana"), &snapshot)
        .await
        .unwrap();

    assert_eq!(
        requests.since(before),
        (0, 0, 1),
        "one transaction, no read"
    );
    assert_eq!(report.approval.status, ApprovalStatus::Approved);
    assert_eq!(queue.published(), [resume_message(&approval)]);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Approved);
    assert_eq!(stored.decisions.len(), 1);

    // Without a snapshot the same decision reads the approval first: two requests.
    let (p, requests, _, approval) = counted_and_paused(h).await;
    let before = requests.counts();
    h.decided(&p, "dana", &approval.id, approve("d-dana")).await;
    assert_eq!(requests.since(before), (1, 0, 1));
}

async fn given_the_snapshot_dana_was_shown_when_she_lowers_the_amount_then_the_edit_is_one_request_too(
    h: &Harness,
) {
    let (p, requests, _, approval) = counted_and_paused(h).await;
    let snapshot = shown(&p, &approval).await;
    let before = requests.counts();

    let report = decide_shown(h, &p, "dana", &approval, edit("d-dana", 200), &snapshot)
        .await
        .unwrap();

    assert_eq!(requests.since(before), (0, 0, 1));
    assert_eq!(report.approval.status, ApprovalStatus::Superseded);
    let next = report.next_approval.expect("version 2's approval");
    assert_eq!(next.action_version, v(2));
    assert_eq!(next.args.int("amount_cents"), Some(20_000));
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.superseded_by, Some(next.id));
}

async fn given_a_comment_since_dana_was_shown_the_approval_when_she_approves_with_that_snapshot_then_it_is_approved_and_the_comment_kept(
    h: &Harness,
) {
    let (p, _, _, approval) = counted_and_paused(h).await;
    let snapshot = shown(&p, &approval).await;
    p.comment(&h.person("erin"), &approval.id, "receipt attached?")
        .await
        .unwrap();

    let report = decide_shown(h, &p, "dana", &approval, approve("d-dana"), &snapshot)
        .await
        .unwrap();

    assert_eq!(report.approval.status, ApprovalStatus::Approved);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Approved);
    assert_eq!(stored.comments.len(), 1, "the comment is not written over");
    assert_eq!(stored.decisions.len(), 1);
}

async fn given_dana_commented_when_she_approves_with_the_snapshot_her_comment_gave_then_the_decision_is_one_request_to_the_store(
    h: &Harness,
) {
    let (p, requests, _, approval) = counted_and_paused(h).await;
    let commented = p
        .comment(&h.person("dana"), &approval.id, "receipt checked")
        .await
        .unwrap();
    assert_eq!(commented.approval.comments.len(), 1);
    let before = requests.counts();

    let report = decide_shown(
        h,
        &p,
        "dana",
        &approval,
        approve("d-dana"),
        &commented.snapshot,
    )
    .await
    .unwrap();

    assert_eq!(
        requests.since(before),
        (0, 0, 1),
        "(reads, query pages, transactions): the comment's snapshot is what is stored"
    );
    assert_eq!(report.approval.status, ApprovalStatus::Approved);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.comments.len(), 1);
    assert_eq!(stored.decisions.len(), 1);
}

async fn given_erin_rejected_since_dana_was_shown_the_approval_when_dana_approves_with_that_snapshot_then_she_is_refused_and_the_rejection_stands(
    h: &Harness,
) {
    let (p, _, _, approval) = counted_and_paused(h).await;
    let snapshot = shown(&p, &approval).await;
    h.decided(&p, "erin", &approval.id, reject("d-erin", "no receipt"))
        .await;

    let refused = decide_shown(h, &p, "dana", &approval, approve("d-dana"), &snapshot)
        .await
        .unwrap_err();

    assert_refusal(&refused, "already_decided", ErrorKind::Conflict);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Rejected);
    assert_eq!(stored.decisions.len(), 1);
    assert!(h.payments().await.is_empty());
}

async fn given_dana_and_erin_shown_the_same_approval_when_both_decide_at_once_with_it_then_one_decision_is_taken(
    h: &Harness,
) {
    let (p, _, _, approval) = counted_and_paused(h).await;
    let snapshot = shown(&p, &approval).await;

    let (dana, erin) = tokio::join!(
        decide_shown(h, &p, "dana", &approval, approve("d-dana"), &snapshot),
        decide_shown(h, &p, "erin", &approval, reject("d-erin", "no"), &snapshot),
    );

    let lost = match (&dana, &erin) {
        (Ok(_), Err(lost)) | (Err(lost), Ok(_)) => lost,
        _ => panic!("one decision wins: {dana:?} {erin:?}"),
    };
    assert_refusal(lost, "already_decided", ErrorKind::Conflict);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.decisions.len(), 1);
    let won = match dana.is_ok() {
        true => ApprovalStatus::Approved,
        false => ApprovalStatus::Rejected,
    };
    assert_eq!(stored.status, won);
}

async fn given_dana_approved_with_a_snapshot_when_she_sends_the_same_decision_again_with_it_then_it_is_replayed(
    h: &Harness,
) {
    let (p, _, queue, approval) = counted_and_paused(h).await;
    let snapshot = shown(&p, &approval).await;
    decide_shown(h, &p, "dana", &approval, approve("d-dana"), &snapshot)
        .await
        .unwrap();

    let again = decide_shown(h, &p, "dana", &approval, approve("d-dana"), &snapshot)
        .await
        .unwrap();

    assert!(again.replayed);
    assert_eq!(again.approval.status, ApprovalStatus::Approved);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.decisions.len(), 1);
    let published = queue.published();
    assert!(published.iter().all(|m| *m == resume_message(&approval)));
}

async fn given_a_snapshot_forged_without_the_requester_when_ben_approves_his_own_claim_with_it_then_he_is_still_refused(
    h: &Harness,
) {
    let (p, _, _, approval) = counted_and_paused(h).await;
    let genuine = shown(&p, &approval).await;
    let snapshot = forged(&genuine, |body| body["requested_by"] = json!([]));
    let mut ben = h.person("ben");
    ben.roles.insert(finance());

    let refused = p
        .decide_shown(&ben, &approval.id, approve("d-ben"), Some(&snapshot))
        .await
        .unwrap_err();

    assert_refusal(&refused, "own_request", ErrorKind::Forbidden);
    assert_undecided(h, &p, &approval, ApprovalStatus::AwaitingApproval).await;
    assert_eq!(shown(&p, &approval).await, genuine, "nothing was written");
}

async fn given_a_snapshot_forged_to_say_rejected_or_overdue_when_dana_approves_with_it_then_she_approves_what_is_stored(
    h: &Harness,
) {
    let (p, _, _, approval) = counted_and_paused(h).await;
    let genuine = shown(&p, &approval).await;
    let rejected = forged(&genuine, |body| body["status"] = json!("rejected"));
    let overdue = forged(&genuine, |body| {
        body["expires_at"] = json!("2000-01-01T00:00:00Z")
    });

    // A refusal ruled on a snapshot is ruled again on the stored approval; a late decision's
    // expiry is written only if the snapshot is what is stored.
    let report = decide_shown(h, &p, "dana", &approval, approve("d-dana"), &rejected)
        .await
        .unwrap();
    assert_eq!(report.approval.status, ApprovalStatus::Approved);

    let (p, _, _, approval) = counted_and_paused(h).await;
    let report = decide_shown(h, &p, "dana", &approval, approve("d-dana"), &overdue)
        .await
        .unwrap();
    assert_eq!(report.approval.status, ApprovalStatus::Approved);
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Approved);
}

async fn given_a_snapshot_of_another_approval_when_dana_decides_with_it_then_the_approval_she_named_is_decided(
    h: &Harness,
) {
    let (p, _, _, approval) = counted_and_paused(h).await;
    let (_, other) = h.start_paused(&p, "c-102").await;
    let snapshot = shown(&p, &other).await;

    let report = decide_shown(h, &p, "dana", &approval, reject("d-dana", "no"), &snapshot)
        .await
        .unwrap();

    assert_eq!(report.approval.id, approval.id);
    let (named, other) = (
        p.approval(&acme(), &approval.id).await.unwrap(),
        p.approval(&acme(), &other.id).await.unwrap(),
    );
    assert_eq!(named.status, ApprovalStatus::Rejected);
    assert_eq!(other.status, ApprovalStatus::AwaitingApproval);
}

async fn given_a_string_that_is_not_a_snapshot_when_dana_decides_with_it_then_it_is_bad_input_and_nothing_is_written(
    h: &Harness,
) {
    let (p, requests, _, approval) = counted_and_paused(h).await;
    let genuine = shown(&p, &approval).await;
    let not_json = URL_SAFE_NO_PAD.encode("1.not an approval");
    let before = requests.counts();

    for snapshot in ["", "not base64!", "e30", not_json.as_str()] {
        let refused = decide_shown(h, &p, "dana", &approval, approve("d-dana"), snapshot)
            .await
            .unwrap_err();
        assert_refusal(&refused, "bad_input", ErrorKind::BadInput);
        assert_eq!(
            refused.to_string(),
            "the snapshot is not one Countersign gave"
        );
    }

    assert_eq!(requests.counts(), before, "the store was not asked");
    assert_eq!(shown(&p, &approval).await, genuine);
}

on_both_stores!([
    given_the_snapshot_dana_was_shown_when_she_approves_then_the_decision_is_one_request_to_the_store,
    given_the_snapshot_dana_was_shown_when_she_lowers_the_amount_then_the_edit_is_one_request_too,
    given_a_comment_since_dana_was_shown_the_approval_when_she_approves_with_that_snapshot_then_it_is_approved_and_the_comment_kept,
    given_dana_commented_when_she_approves_with_the_snapshot_her_comment_gave_then_the_decision_is_one_request_to_the_store,
    given_erin_rejected_since_dana_was_shown_the_approval_when_dana_approves_with_that_snapshot_then_she_is_refused_and_the_rejection_stands,
    given_dana_approved_with_a_snapshot_when_she_sends_the_same_decision_again_with_it_then_it_is_replayed,
    given_dana_and_erin_shown_the_same_approval_when_both_decide_at_once_with_it_then_one_decision_is_taken,
    given_a_snapshot_forged_without_the_requester_when_ben_approves_his_own_claim_with_it_then_he_is_still_refused,
    given_a_snapshot_forged_to_say_rejected_or_overdue_when_dana_approves_with_it_then_she_approves_what_is_stored,
    given_a_snapshot_of_another_approval_when_dana_decides_with_it_then_the_approval_she_named_is_decided,
    given_a_string_that_is_not_a_snapshot_when_dana_decides_with_it_then_it_is_bad_input_and_nothing_is_written,
]);
