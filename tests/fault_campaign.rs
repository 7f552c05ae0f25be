//! The fault campaign on both stores: approvals opened by the expense agent, deciders racing on
//! each and (on DynamoDB) resume workers, SIGKILLed at seeded random moments, and a few resume
//! messages five killed workers received, in the dead-letter queue; then the sweep with the
//! clock past every lease and deadline, nobody moving a dead letter back, and the checks: no
//! claim paid twice, nothing paid without a winning approval, no rejected approval paid, every
//! run terminal, every unknown outcome reconciled, every dead-lettered resume healed by the
//! sweep. And history windows on both stores: transfers proposed by `countersign hook
//! claude-code` processes, one requester's several at once, SIGKILLed at random moments and
//! asked again with the same call id; then the checks: no requester allowed more than the
//! hour's USD 500 without a person, every call in the state its answers lead to, each counted
//! once, and every window slot a call's. `scripts/fault-campaign` runs the same campaigns
//! longer; these variables set them (the defaults are CI's): FAULT_CAMPAIGN_APPROVALS,
//! FAULT_CAMPAIGN_SEED (else from the time, printed), FAULT_CAMPAIGN_PARALLEL,
//! FAULT_CAMPAIGN_KILL_SHARE, FAULT_CAMPAIGN_WORKERS, FAULT_CAMPAIGN_CRASH_LOOPS,
//! FAULT_CAMPAIGN_WINDOW_CALLS, FAULT_CAMPAIGN_WINDOW_REQUESTERS.

#[path = "../shared/tests/support/aws.rs"]
mod aws;
#[path = "common/campaign.rs"]
mod campaign;
mod common;
#[path = "common/window_campaign.rs"]
mod window_campaign;

use std::sync::Arc;

use campaign::{Campaign, DeadLetters, Figures, Store};
use shared::adapters::sqlite::SqliteStore;
use window_campaign::{WindowCampaign, WindowFigures};

/// How long a killed worker's message stays invisible on the campaign's own queue, instead of
/// template.yaml's 960 s.
const VISIBILITY_SECONDS: u32 = 2;

/// The seed of a campaign's choices: FAULT_CAMPAIGN_SEED, else from the time; printed.
fn seed(name: &str) -> u64 {
    let seed = campaign::setting(
        "FAULT_CAMPAIGN_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    eprintln!(
        "fault campaign {name}: seed {seed} (FAULT_CAMPAIGN_SEED={seed} repeats its choices)"
    );
    seed
}

fn campaign(name: &str, store: Store) -> Campaign {
    let seed = seed(name);
    Campaign {
        approvals: campaign::setting("FAULT_CAMPAIGN_APPROVALS", 200),
        seed,
        store,
        dir: campaign::scratch(name),
        parallel: campaign::setting("FAULT_CAMPAIGN_PARALLEL", 3),
        kill_share: campaign::setting("FAULT_CAMPAIGN_KILL_SHARE", 0.3),
        workers: campaign::setting("FAULT_CAMPAIGN_WORKERS", 2),
        crash_loops: campaign::setting("FAULT_CAMPAIGN_CRASH_LOOPS", 3),
    }
}

/// The stack's DynamoDB and queue as a campaign's store, with a dead-letter queue of its own.
async fn dynamodb(stack: &aws::FreshStack) -> Store {
    let (dlq_url, max_receives) = stack.dead_letter_queue(VISIBILITY_SECONDS).await;
    Store::DynamoDb {
        env: stack.env(),
        dead_letters: DeadLetters {
            sqs: aws_sdk_sqs::Client::new(&stack.config),
            queue_url: stack.settings.queue_url.clone(),
            dlq_url,
            max_receives,
        },
    }
}

/// Drops the campaign's table: its thousands of items would slow every later test on the same
/// moto.
async fn drop_table(stack: &aws::FreshStack) {
    let _ = aws_sdk_dynamodb::Client::new(&stack.config)
        .delete_table()
        .table_name(&stack.settings.table)
        .send()
        .await;
}

fn verdict(figures: &Figures) {
    println!("{figures}");
    assert!(
        figures.killed > 0,
        "the campaign killed nothing:\n{figures}"
    );
    assert!(
        figures.payments > 0 && figures.rejected > 0,
        "the campaign should pay some claims and reject others:\n{figures}"
    );
    assert_eq!(figures.runs_stuck, 0, "{figures}");
    assert!(figures.violations.is_empty(), "{figures}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_deciders_never_pay_twice_or_unapproved_and_leave_no_run_stuck_embedded() {
    let campaign = campaign("embedded", Store::Embedded);
    let dir = campaign.dir.clone();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let store = Arc::new(SqliteStore::open_dir(&dir.join("state")).unwrap());
    let figures = campaign.run(store).await;
    verdict(&figures);
    campaign::remove(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_deciders_and_workers_never_pay_twice_or_unapproved_and_leave_no_run_stuck_on_dynamodb()
 {
    aws::assert_serial().await;
    let stack = aws::FreshStack::new("fault-campaign").await;
    let store = dynamodb(&stack).await;
    let campaign = campaign("dynamodb", store);
    let dir = campaign.dir.clone();
    let figures = campaign.run(stack.aws().store.clone()).await;
    drop_table(&stack).await;
    verdict(&figures);
    assert!(figures.crash_looped > 0, "nothing crash-looped:\n{figures}");
    assert!(
        figures.dead_lettered >= figures.crash_looped && figures.resent >= figures.crash_looped,
        "every crash-looped resume went to the dead-letter queue and was sent again by the sweep:\n{figures}"
    );
    assert_eq!(figures.resumes_given_up, 0, "{figures}");
    campaign::remove(&dir);
}

fn window_campaign(name: &str, store: Store) -> WindowCampaign {
    WindowCampaign {
        calls: campaign::setting("FAULT_CAMPAIGN_WINDOW_CALLS", 144),
        requesters: campaign::setting("FAULT_CAMPAIGN_WINDOW_REQUESTERS", 12),
        seed: seed(name),
        store,
        dir: campaign::scratch(name),
        parallel: campaign::setting("FAULT_CAMPAIGN_PARALLEL", 3),
        kill_share: campaign::setting("FAULT_CAMPAIGN_KILL_SHARE", 0.3),
    }
}

fn window_verdict(figures: &WindowFigures) {
    println!("{figures}");
    assert!(
        figures.killed > 0,
        "the campaign killed nothing:\n{figures}"
    );
    assert!(
        figures.allowed > 0 && figures.waited > 0,
        "the campaign should run some transfers and leave others to finance:\n{figures}"
    );
    assert!(figures.violations.is_empty(), "{figures}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_hooks_never_let_a_requester_past_the_hours_total_nor_count_a_call_twice_on_dynamodb()
 {
    aws::assert_serial().await;
    let stack = aws::FreshStack::new("fault-campaign-windows").await;
    let store = dynamodb(&stack).await;
    let campaign = window_campaign("windows-dynamodb", store);
    let dir = campaign.dir.clone();
    let figures = campaign.run(stack.aws().store.clone()).await;
    drop_table(&stack).await;
    window_verdict(&figures);
    campaign::remove(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_hooks_never_let_a_requester_past_the_hours_total_nor_count_a_call_twice_embedded() {
    let campaign = window_campaign("windows-embedded", Store::Embedded);
    let dir = campaign.dir.clone();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let store = Arc::new(SqliteStore::open_dir(&dir.join("state")).unwrap());
    let figures = campaign.run(store).await;
    window_verdict(&figures);
    campaign::remove(&dir);
}
