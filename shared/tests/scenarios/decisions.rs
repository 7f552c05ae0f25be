//! Deciding: the walkthrough's claims, a decision from another process, decision ids replayed,
//! and who may decide.

use super::*;

// ---------------------------------------------------------------------------------------------
// The walkthrough claims
// ---------------------------------------------------------------------------------------------

async fn given_c101_a_small_taxi_when_the_agent_runs_then_it_is_paid_42_without_a_person(
    h: &Harness,
) {
    let p = h.process().await;

    let report = h.start(&p, "c-101").await;

    assert_eq!(report.status, RunStatus::Done);
    assert!(report.approvals.is_empty());
    let payments = paid(&h.payments().await);
    assert_eq!(payments.len(), 1);
    assert_eq!((payments[0].0.as_str(), payments[0].1), ("c-101", 4_200));
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let pay = history
        .actions
        .iter()
        .find(|a| a.tool == "reimburse")
        .expect("a reimburse action");
    assert_eq!(pay.status, ActionStatus::Succeeded);
    assert_eq!(pay.authorized_by, [Actor::Policy { version: 1 }]);
    assert_eq!(payments[0].2, pay.key());
    assert!(p.pending(&acme()).await.unwrap().is_empty());
}

async fn given_c102_lodging_over_the_limit_when_the_agent_runs_then_it_pauses_on_reimbursing_250(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    assert_eq!(approval.tool, "reimburse");
    assert_eq!(approval.args.str("claim_id"), Some("c-102"));
    assert_eq!(approval.args.int("amount_cents"), Some(25_000));
    assert!(
        approval
            .args_hash
            .binds(&approval.agent, &approval.tool, &approval.args)
    );
    assert_eq!(approval.action_version, ActionVersion::FIRST);
    assert_eq!(approval.quorum, 1);
    assert_eq!(approval.approver_role, finance());
    assert_eq!(approval.requested_by, [person("ben")]);
    assert_eq!(approval.policy_version, 1);
    assert_eq!(approval.expires_at, start_of_test() + Duration::hours(24));
    let pending: Vec<_> = p.pending(&acme()).await.unwrap();
    assert_eq!(pending, from_ref(&approval));
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    assert!(h.payments().await.is_empty());
}

async fn given_c101_was_paid_when_the_agent_runs_c103_then_it_pauses_on_declining_a_duplicate(
    h: &Harness,
) {
    let p = h.process().await;
    assert_eq!(h.start(&p, "c-101").await.status, RunStatus::Done);

    let (report, approval) = h.start_paused(&p, "c-103").await;

    assert_eq!(report.status, RunStatus::AwaitingApproval);
    assert_eq!(approval.tool, "decline");
    assert_eq!(approval.args.str("claim_id"), Some("c-103"));
    let reason = approval.args.str("reason").unwrap();
    assert!(reason.contains("c-101"), "{reason}");
    assert!(approval.explanation.contains("duplicate"));
    assert_eq!(approval.quorum, 1);
    let payments = paid(&h.payments().await);
    assert_eq!(payments.len(), 1, "only c-101 is paid: {payments:?}");
}

async fn given_c104_with_no_time_to_decide_when_the_sweep_runs_then_it_expires_and_nothing_is_paid(
    h: &Harness,
) {
    let p = h.process().await;
    let mut task = task_for(&h.claims, "c-104").unwrap();
    task.approval_ttl = Some(StdDuration::ZERO);
    let report = p.start(task).await.unwrap();
    assert_eq!(report.status, RunStatus::AwaitingApproval);
    let approval = report.approvals[0].clone();
    assert_eq!(approval.args.int("amount_cents"), Some(39_000));
    assert_eq!(approval.expires_at, approval.created_at);

    let swept = h.process().await.sweep(100).await.unwrap();

    assert_eq!(swept.expired, from_ref(&approval.id));
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::Expired);
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert!(h.payments().await.is_empty());
    assert!(p.pending(&acme()).await.unwrap().is_empty());
    let again = p.sweep(100).await.unwrap();
    assert!(again.expired.is_empty(), "expired once: {again:?}");
}

async fn given_a_time_to_decide_longer_than_the_policy_allows_when_a_run_starts_then_it_is_refused_as_bad_input(
    h: &Harness,
) {
    let p = h.process().await;
    let with_ttl = |ttl: StdDuration| {
        let mut task = task_for(&h.claims, "c-102").unwrap();
        task.approval_ttl = Some(ttl);
        task
    };

    // The expense policy gives a day to decide and states no longer maximum: a caller may
    // shorten the day, never lengthen it.
    for too_long in [
        StdDuration::from_secs(86_400 + 1),
        StdDuration::from_secs(90 * 86_400),
        StdDuration::from_secs(u64::MAX),
    ] {
        let refused = p.start(with_ttl(too_long)).await.unwrap_err();

        assert_refusal(&refused, "bad_input", ErrorKind::BadInput);
        assert!(refused.to_string().contains("longer than"), "{refused}");
    }
    assert!(p.pending(&acme()).await.unwrap().is_empty());

    let longest = p
        .start(with_ttl(StdDuration::from_secs(86_400)))
        .await
        .unwrap();
    assert_eq!(
        longest.approvals[0].expires_at,
        start_of_test() + Duration::days(1)
    );
}

// ---------------------------------------------------------------------------------------------
// Deciding
// ---------------------------------------------------------------------------------------------

async fn given_a_paused_run_when_the_process_restarts_and_a_new_engine_approves_then_the_run_finishes_and_the_claim_is_paid(
    h: &Harness,
) {
    let first = h.process().await;
    let (report, approval) = h.start_paused(&first, "c-102").await;
    drop(first);

    let second = h.process().await;
    let pending = second.pending(&acme()).await.unwrap();
    assert_eq!(pending.len(), 1);
    let decided = h
        .decided(&second, "dana", &pending[0].id, approve("d-1"))
        .await;

    assert_eq!(decided.approval.status, ApprovalStatus::Approved);
    assert!(!decided.replayed);
    assert_eq!(decided.run.map(|r| r.status), Some(RunStatus::Done));
    let run = h.run(&second, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(
        run.answer.as_deref(),
        Some("Reimbursed $250.00 for claim c-102.")
    );
    assert_eq!(
        paid(&h.payments().await),
        [payment("c-102", 25_000, &approval, 1)]
    );
    assert!(second.pending(&acme()).await.unwrap().is_empty());
}

async fn given_an_approval_when_the_same_decision_id_is_sent_twice_then_it_resumes_once_and_the_second_call_replays_the_outcome(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let first = h.counted_process(&calls).await;
    let (report, approval) = h.start_paused(&first, "c-102").await;
    let dana = h.person("dana");

    let once = h.decided(&first, &dana, &approval.id, approve("d-1")).await;
    // The same submission again, as a retried request that lands on another process.
    let second = h.counted_process(&calls).await;
    let twice = h
        .decided(&second, &dana, &approval.id, approve("d-1"))
        .await;

    assert!(!once.replayed);
    assert!(twice.replayed);
    assert_eq!(twice.decision, once.decision);
    assert_eq!(twice.approval.status, ApprovalStatus::Approved);
    assert_eq!(twice.approval.decisions.len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(h.payments().await.len(), 1);
    let history = second.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(times(&history.entries, ["decision"]), [1]);
    let executed_payments = history
        .entries
        .iter()
        .filter(|e| matches!(&e.event, AuditEvent::Executed { action_id, .. } if *action_id == approval.action_id))
        .count();
    assert_eq!(executed_payments, 1);
}

async fn given_a_decision_whose_resume_was_never_delivered_when_its_decision_id_is_replayed_then_the_run_resumes_exactly_once(
    h: &Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    // The first attempt commits the decision, then cannot deliver its resume message.
    let first = h
        .process_with(
            on_reimburse(Counted::new(&calls)),
            Delivery::Queue(Arc::new(QueueDown)),
        )
        .await;
    let (report, approval) = h.start_paused(&first, "c-102").await;
    let dana = h.person("dana");
    let committed = h.decided(&first, &dana, &approval.id, approve("d-1")).await;
    assert!(!committed.replayed);
    assert_eq!(
        h.run(&first, &report.run_id).await.status,
        RunStatus::AwaitingApproval
    );

    // The client retries the same submission against a process that can deliver.
    let working = h.counted_process(&calls).await;
    let replayed = h
        .decided(&working, &dana, &approval.id, approve("d-1"))
        .await;

    assert!(replayed.replayed);
    assert_eq!(replayed.run.map(|r| r.status), Some(RunStatus::Done));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(h.payments().await.len(), 1);
    let again = h
        .decided(&working, &dana, &approval.id, approve("d-1"))
        .await;
    assert!(again.replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(working.sweep(100).await.unwrap().redelivered, 0);
    let history = working.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(times(&history.entries, ["resumed", "decision"]), [1, 1]);
}

async fn given_a_recorded_decision_when_its_decision_id_comes_with_another_choice_then_it_conflicts(
    h: &Harness,
) {
    let (p, _, approval) = h.paused_on("c-102").await;
    let dana = h.person("dana");
    h.decided(&p, &dana, &approval.id, approve("d-1")).await;

    let refused = h
        .refused(&p, &dana, &approval.id, reject("d-1", "changed my mind"))
        .await;

    assert_refusal(&refused, "decision_id_reused", ErrorKind::Conflict);
    assert_eq!(h.payments().await.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Who may decide
// ---------------------------------------------------------------------------------------------

/// `who` approves `approval` and is forbidden as `code`: it stays undecided and nothing is paid.
async fn assert_forbidden(
    h: &Harness,
    p: &Process,
    approval: &Approval,
    who: &Identity,
    code: &str,
) {
    let refused = h.refused(p, who, &approval.id, approve("d-1")).await;
    assert_refusal(&refused, code, ErrorKind::Forbidden);
    assert_undecided(h, p, approval, ApprovalStatus::AwaitingApproval).await;
}

async fn given_bens_own_claim_when_ben_approves_it_then_he_is_refused_as_own_request(h: &Harness) {
    let (p, _, approval) = h.paused_on("c-102").await;
    let mut ben = h.person("ben");
    // Even holding the approver role, the claimant never approves his own claim.
    ben.roles.insert(finance());

    assert_forbidden(h, &p, &approval, &ben, "own_request").await;
}

async fn given_an_approver_who_lost_the_finance_role_when_they_approve_then_they_are_forbidden(
    h: &Harness,
) {
    let (p, _, approval) = h.paused_on("c-102").await;
    assert!(h.person("dana").has_role(&finance()));
    // Authentication now says dana is no longer in finance.
    let mut dana = h.person("dana");
    dana.roles.remove(&finance());

    assert_forbidden(h, &p, &approval, &dana, "missing_role").await;
}

async fn given_an_approval_of_acme_when_a_globex_approver_decides_it_then_it_is_not_found(
    h: &Harness,
) {
    let (p, _, approval) = h.paused_on("c-102").await;
    let zoe = h.person("zoe");
    assert_eq!(zoe.tenant, TenantId::parse("globex").unwrap());
    assert!(zoe.has_role(&finance()));

    let refused = h.refused(&p, &zoe, &approval.id, approve("d-zoe")).await;

    assert_refusal(&refused, "not_found", ErrorKind::NotFound);
    assert!(p.pending(&zoe.tenant).await.unwrap().is_empty());
    assert_eq!(
        p.approval(&zoe.tenant, &approval.id)
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    let stored = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.status, ApprovalStatus::AwaitingApproval);
    assert!(h.payments().await.is_empty());
}

/// A store connection whose first read of an approval waits until the other process has read
/// it too, and which counts its reads of approvals.
struct ReadsApprovalTogether {
    inner: Arc<dyn shared::ports::store::ItemStore>,
    together: Arc<tokio::sync::Barrier>,
    reads: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl shared::ports::store::ItemStore for ReadsApprovalTogether {
    async fn get(
        &self,
        pk: &str,
        sk: &str,
    ) -> Result<Option<shared::ports::store::Item>, shared::ports::store::StoreError> {
        let item = self.inner.get(pk, sk).await;
        if sk == keys::APPROVAL_SK && self.reads.fetch_add(1, Ordering::SeqCst) == 0 {
            self.together.wait().await;
        }
        item
    }

    async fn page(
        &self,
        query: shared::ports::store::Query<'_>,
    ) -> Result<shared::ports::store::Page, shared::ports::store::StoreError> {
        self.inner.page(query).await
    }

    async fn transact(
        &self,
        writes: Vec<shared::ports::store::Write>,
    ) -> Result<(), shared::ports::store::StoreError> {
        self.inner.transact(writes).await
    }

    async fn transact_or_found(
        &self,
        writes: Vec<shared::ports::store::Write>,
    ) -> Result<(), shared::ports::store::Refused> {
        self.inner.transact_or_found(writes).await
    }
}

async fn given_two_decisions_on_the_version_both_read_when_one_commits_first_then_the_other_is_refused_from_what_its_write_found_without_reading_again(
    h: &Harness,
) {
    let starter = h.process().await;
    let (_, approval) = h.start_paused(&starter, "c-102").await;
    let together = Arc::new(tokio::sync::Barrier::new(2));
    let deciding = |reads: Arc<AtomicUsize>| {
        let together = together.clone();
        h.process_configured(
            Arc::new(shared::example::expense::OfflineExpenseAgent),
            move |inner| {
                Arc::new(ReadsApprovalTogether {
                    inner,
                    together,
                    reads,
                })
            },
            |b| b,
        )
    };
    let (reads_a, reads_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = deciding(reads_a.clone()).await;
    let b = deciding(reads_b.clone()).await;
    let (dana, erin) = (h.person("dana"), h.person("erin"));

    let (one, other) = tokio::join!(
        a.decide(&dana, &approval.id, approve("d-dana")),
        b.decide(&erin, &approval.id, reject("d-erin", "not this one")),
    );

    let (lost, lost_reads) = match (&one, &other) {
        (Ok(_), Err(lost)) => (lost, &reads_b),
        (Err(lost), Ok(_)) => (lost, &reads_a),
        _ => panic!("one decision wins: {one:?} {other:?}"),
    };
    assert_eq!(lost.code(), "already_decided", "{lost}");
    assert_eq!(
        lost_reads.load(Ordering::SeqCst),
        1,
        "the refusal brought the approval as the winner left it"
    );
    let stored = starter.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(stored.decisions.len(), 1);
}

async fn given_an_edited_and_a_rejected_approval_when_the_tenant_reads_what_was_decided_then_each_comes_newest_first_with_how_its_call_ended(
    h: &Harness,
) {
    let (p, _, edited, _) = h.edited_by_dana("c-102", 200).await;
    h.clock.advance(Duration::minutes(1));
    let (_, c104) = h.start_paused(&p, "c-104").await;
    h.decided(&p, "erin", &c104.id, reject("d-104", "No receipt."))
        .await;
    let (_, waiting) = h.start_paused(&p, "c-105").await;

    let decided = p.recently_decided(&acme(), 10).await.unwrap();

    // c-104's rejection, the newest; then c-102's version 1 (superseded by dana's edit) and
    // the approval of version 2 her edit opened and approved, in either order (one instant).
    let ids: Vec<&ApprovalId> = decided.iter().map(|d| &d.approval.id).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(ids[0], &c104.id);
    assert!(!ids.contains(&&waiting.id), "what waits is not decided");
    let rejected = &decided[0];
    assert_eq!(rejected.approval.status, ApprovalStatus::Rejected);
    assert_eq!(rejected.approval.decisions[0].by, person("erin"));
    let stopped = rejected.call.as_ref().expect("its call");
    assert_eq!(
        (stopped.version, stopped.status),
        (v(1), ActionStatus::Rejected)
    );
    let superseded = decided
        .iter()
        .find(|d| d.approval.id == edited.id)
        .expect("version 1's approval");
    assert_eq!(superseded.approval.status, ApprovalStatus::Superseded);
    let ran = superseded.call.as_ref().expect("the edited call");
    assert_eq!((ran.version, ran.status), (v(2), ActionStatus::Succeeded));
    assert!(
        ran.result.as_ref().unwrap().content.contains("$200.00"),
        "{ran:?}"
    );

    // Bounded, and the tenant's own.
    let newest = p.recently_decided(&acme(), 1).await.unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].approval.id, c104.id);
    let globex = TenantId::parse("globex").unwrap();
    assert!(p.recently_decided(&globex, 10).await.unwrap().is_empty());
}

// Each scenario on the embedded store and on DynamoDB (moto over HTTP).
async fn given_a_decision_ten_minutes_after_its_approval_opened_then_its_line_carries_every_id_and_the_seconds_it_took(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;
    h.clock.advance(Duration::minutes(10));

    let log = JsonLog::capture();
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;
    let lines = log.lines();

    let decided = lines
        .iter()
        .find(|l| l["message"] == "decided")
        .unwrap_or_else(|| panic!("a line of the decision: {lines:?}"));
    assert_eq!(decided["tenant"], "acme");
    assert_eq!(decided["approval_id"], approval.id.to_string());
    assert_eq!(decided["run_id"], report.run_id.to_string());
    assert_eq!(decided["action_id"], approval.action_id.to_string());
    assert_eq!(decided["decision_seconds"], 600.0);
    // The run resumes in the deciding process; what the payment logs is the approval's too.
    let done = lines
        .iter()
        .find(|l| l["message"] == "done")
        .expect("the run ended");
    assert_eq!(done["approval_id"], approval.id.to_string());
    assert_eq!(done["run_id"], report.run_id.to_string());
}

on_both_stores!([
    given_a_decision_ten_minutes_after_its_approval_opened_then_its_line_carries_every_id_and_the_seconds_it_took,
    given_an_edited_and_a_rejected_approval_when_the_tenant_reads_what_was_decided_then_each_comes_newest_first_with_how_its_call_ended,
    given_c101_a_small_taxi_when_the_agent_runs_then_it_is_paid_42_without_a_person,
    given_c102_lodging_over_the_limit_when_the_agent_runs_then_it_pauses_on_reimbursing_250,
    given_c101_was_paid_when_the_agent_runs_c103_then_it_pauses_on_declining_a_duplicate,
    given_c104_with_no_time_to_decide_when_the_sweep_runs_then_it_expires_and_nothing_is_paid,
    given_a_time_to_decide_longer_than_the_policy_allows_when_a_run_starts_then_it_is_refused_as_bad_input,
    given_a_paused_run_when_the_process_restarts_and_a_new_engine_approves_then_the_run_finishes_and_the_claim_is_paid,
    given_an_approval_when_the_same_decision_id_is_sent_twice_then_it_resumes_once_and_the_second_call_replays_the_outcome,
    given_a_decision_whose_resume_was_never_delivered_when_its_decision_id_is_replayed_then_the_run_resumes_exactly_once,
    given_a_recorded_decision_when_its_decision_id_comes_with_another_choice_then_it_conflicts,
    given_bens_own_claim_when_ben_approves_it_then_he_is_refused_as_own_request,
    given_an_approver_who_lost_the_finance_role_when_they_approve_then_they_are_forbidden,
    given_an_approval_of_acme_when_a_globex_approver_decides_it_then_it_is_not_found,
    given_two_decisions_on_the_version_both_read_when_one_commits_first_then_the_other_is_refused_from_what_its_write_found_without_reading_again,
]);
