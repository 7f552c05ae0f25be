//! What a run may store: a tool's answer, a model's reply and a turn's results each within
//! their share, so no record passes the item limit and both stores answer the same at it.

use super::*;
use shared::domain::budget;
use shared::domain::conversation::{Block, StopReason};
use shared::ports::model::{Model, ModelError, ModelReply, ModelRequest};
use shared::ports::tools::{Tool, ToolCall, Toolbox};

/// `find_similar_claims` answering `bytes` of JSON, counting its calls.
struct Answers {
    bytes: usize,
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Tool for Answers {
    fn spec(&self) -> shared::ports::model::ToolSpec {
        shared::ports::model::ToolSpec {
            name: "find_similar_claims".into(),
            description: "Finds similar claims.".into(),
            input_schema: json!({"type": "object", "properties": {"claim_id": {"type": "string"}}, "required": ["claim_id"]}),
        }
    }

    async fn call(&self, _: ToolCall<'_>) -> ToolOutcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        ToolOutcome::Succeeded {
            result: json!({"similar": "s".repeat(self.bytes)}),
        }
    }
}

async fn answering(h: &Harness, script: Script, bytes: usize) -> (Process, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = Arc::new(Answers {
        bytes,
        calls: calls.clone(),
    });
    let p = h
        .process_of(
            Arc::new(script),
            move |tools: Toolbox| tools.with(tool),
            Delivery::InProcess,
        )
        .await;
    (p, calls)
}

async fn given_a_tool_answer_of_900_kb_when_it_is_read_then_it_is_stored_cut_the_model_is_told_and_the_run_completes(
    h: &Harness,
) {
    let script =
        Script::default().then_call(&[("find_similar_claims", json!({"claim_id": "c-102"}))]);
    let (p, calls) = answering(h, script, 900 * 1024).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::Done, "{report:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the call ran once");
    let run = h.run(&p, &report.run_id).await;
    let told = &results_after_turn(&run, 0)[0].1;
    assert!(!told.is_error);
    assert!(
        told.content.len() <= budget::RESULT,
        "{}",
        told.content.len()
    );
    assert!(told.content.starts_with(r#"{"similar":"sss"#));
    assert!(
        told.content.contains(
            "[Countersign kept the first 32 KiB of this result, which was 901 KiB, sha256:"
        ),
        "{}",
        &told.content[told.content.len() - 200..]
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    let [action] = history.actions.as_slice() else {
        panic!("one action: {:?}", history.actions)
    };
    assert_eq!(action.status, ActionStatus::Succeeded);
    let executed: Vec<&str> = history
        .entries
        .iter()
        .filter_map(|e| match &e.event {
            AuditEvent::Executed { result, .. } => Some(result.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        executed,
        [told.content.as_str()],
        "the audit keeps what was stored"
    );
}

/// A model whose every reply is `bytes` of text; its first also proposes paying c-102 $250.
struct Talkative {
    bytes: usize,
}

#[async_trait::async_trait]
impl Model for Talkative {
    fn name(&self) -> &str {
        "talkative"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let text = Block::Text {
            text: format!("{} ", request.turn()) + &"w".repeat(self.bytes),
        };
        Ok(match request.turn() {
            0 => ModelReply {
                content: vec![
                    text,
                    Block::ToolUse {
                        id: "toolu_pay".into(),
                        name: "reimburse".into(),
                        input: json!({"claim_id": "c-102", "amount_cents": 25_000}),
                    },
                ],
                stop_reason: StopReason::ToolUse,
                usage: None,
            },
            _ => ModelReply {
                content: vec![text],
                stop_reason: StopReason::EndTurn,
                usage: None,
            },
        })
    }
}

async fn given_a_model_reply_of_250_kb_when_it_proposes_a_payment_then_the_reply_is_stored_cut_the_reviewer_reads_the_cut_and_the_run_completes(
    h: &Harness,
) {
    let p = h
        .process_of(
            Arc::new(Talkative { bytes: 250 * 1024 }),
            |tools| tools,
            Delivery::InProcess,
        )
        .await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::AwaitingApproval, "{report:?}");
    let approval = report.approvals[0].clone();
    assert!(approval.explanation.len() <= budget::REPLY_TEXT);
    assert!(
        approval
            .explanation
            .ends_with("of this reply, which was 251 KiB: the rest was cut for storage.]"),
        "{}",
        &approval.explanation[approval.explanation.len() - 120..]
    );
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    let answer = run.answer.clone().unwrap();
    assert!(answer.len() <= budget::REPLY_TEXT, "{}", answer.len());
    assert!(answer.starts_with("1 www"));
    // What the model reads back is the reply as stored, note and all.
    let first = run.messages[1].text();
    assert!(
        first.contains("the rest was cut for storage"),
        "{first:.80}"
    );
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_many_turns_of_large_results_then_a_payment_when_it_pauses_and_is_approved_then_every_write_fits_and_the_conversation_reads_back_whole(
    h: &Harness,
) {
    // Six turns of eight answers cut to 32 KiB each (1.5 MiB in all), then a payment.
    let reads: Vec<(&str, serde_json::Value)> = (0..8)
        .map(|n| {
            (
                "find_similar_claims",
                json!({"claim_id": format!("c-10{n}")}),
            )
        })
        .collect();
    let script = (0..6)
        .fold(Script::default(), |script, _| script.then_call(&reads))
        .then_call(&[reimburse("c-102", 25_000)]);
    let (p, calls) = answering(h, script, 100 * 1024).await;

    let report = p.start(scripted_task("ben")).await.unwrap();

    assert_eq!(report.status, RunStatus::AwaitingApproval, "{report:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 48);
    let paused = h.run(&p, &report.run_id).await;
    assert_eq!(paused.messages.len(), 1 + 6 * 2 + 1);
    let items = shared::ports::store::query_all(
        p.store.as_ref(),
        &keys::run_pk(&acme(), &report.run_id),
        keys::AUDIT_PREFIX,
    )
    .await
    .unwrap();
    // Each turn's results were stored before the next model turn, each write within an item.
    assert!(items.len() >= 6, "{} audit items", items.len());
    assert!(
        items
            .iter()
            .all(|i| i.stored_size() <= shared::ports::store::ITEM_LIMIT)
    );
    h.decided(&p, "dana", &report.approvals[0].id, approve("d-1"))
        .await;
    let run = h.run(&p, &report.run_id).await;
    assert_eq!(run.status, RunStatus::Done);
    assert_eq!(&run.messages[..paused.messages.len()], &paused.messages[..]);
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        history.run.messages, run.messages,
        "the audit view reads the same"
    );
    assert_eq!(
        history
            .entries
            .iter()
            .filter(|e| e.event.name() == "executed")
            .count(),
        49
    );
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_an_approval_when_five_people_leave_100_comments_of_2000_characters_then_it_keeps_them_all_and_refuses_a_101st(
    h: &Harness,
) {
    let (p, report, approval) = h.paused_on("c-102").await;
    let people = ["ana", "chen", "dana", "erin", "sam"];
    for (n, who) in people.iter().cycle().take(100).enumerate() {
        let text = format!("{n:03} ") + &"c".repeat(1_996);
        p.comment(&h.person(who), &approval.id, &text)
            .await
            .unwrap_or_else(|e| panic!("comment {n}: {e}"));
    }

    let refused = p
        .comment(&h.person("mia"), &approval.id, "one more")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "too_many_comments");
    let read = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(read.comments.len(), 100);
    assert!(
        read.comments
            .iter()
            .all(|c| c.text.chars().count() == 2_000)
    );
    let history = p.history(&acme(), &report.run_id).await.unwrap();
    assert_eq!(
        history
            .entries
            .iter()
            .filter(|e| e.event.name() == "commented")
            .count(),
        100
    );
    // It is still decided as any other.
    h.decided(&p, "dana", &approval.id, approve("d-1")).await;
    assert_eq!(h.payments().await.len(), 1);
}

async fn given_comments_of_long_characters_when_they_fill_the_approvals_share_then_the_next_is_refused_and_nothing_changes(
    h: &Harness,
) {
    let (p, _, approval) = h.paused_on("c-102").await;
    // 2,000 characters of three bytes each: about 6 KB a comment, 37 fill 224 KiB.
    let people = ["ana", "chen", "dana", "erin", "sam"];
    let mut kept = 0;
    let refused = loop {
        let who = people[kept % people.len()];
        match p
            .comment(&h.person(who), &approval.id, &"€".repeat(2_000))
            .await
        {
            Ok(_) => kept += 1,
            Err(error) => break error,
        }
        assert!(kept < 100, "the share never filled");
    };
    assert_eq!(refused.code(), "too_many_comments");
    assert!(refused.to_string().contains("at most 224 KiB"), "{refused}");
    assert_eq!(kept, 37);
    let read = p.approval(&acme(), &approval.id).await.unwrap();
    assert_eq!(read.comments.len(), kept, "the refused one changed nothing");
}

async fn given_a_task_of_2001_two_byte_characters_when_a_run_starts_then_it_is_refused_in_bytes_and_4000_bytes_start(
    h: &Harness,
) {
    let p = h.scripted_process(Script::default()).await;
    // 2,001 characters, 4,002 bytes: within a limit of characters, past the one of bytes.
    let long = shared::engine::StartRun {
        task: "é".repeat(2_001),
        ..scripted_task("ben")
    };

    let refused = p.start(long).await.unwrap_err();

    assert_eq!(refused.code(), "bad_input");
    assert_eq!(
        refused.to_string(),
        "a task needs 1 to 4000 bytes of UTF-8 text (a character may take up to 4); this one \
         has 4002 bytes"
    );
    let fits = shared::engine::StartRun {
        task: "é".repeat(2_000),
        ..scripted_task("ben")
    };
    assert_eq!(p.start(fits).await.unwrap().status, RunStatus::Done);
}

on_both_stores!([
    given_a_task_of_2001_two_byte_characters_when_a_run_starts_then_it_is_refused_in_bytes_and_4000_bytes_start,
    given_an_approval_when_five_people_leave_100_comments_of_2000_characters_then_it_keeps_them_all_and_refuses_a_101st,
    given_comments_of_long_characters_when_they_fill_the_approvals_share_then_the_next_is_refused_and_nothing_changes,
    given_a_tool_answer_of_900_kb_when_it_is_read_then_it_is_stored_cut_the_model_is_told_and_the_run_completes,
    given_a_model_reply_of_250_kb_when_it_proposes_a_payment_then_the_reply_is_stored_cut_the_reviewer_reads_the_cut_and_the_run_completes,
    given_many_turns_of_large_results_then_a_payment_when_it_pauses_and_is_approved_then_every_write_fits_and_the_conversation_reads_back_whole,
]);
