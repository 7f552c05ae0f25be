//! `countersign-bench`: the approval lifecycle end to end in one process over the engine, with a
//! scripted model, timed and counted; then a sweep over as many overdue approvals; then the
//! ledger is checked. A wrong ledger fails the command, however fast it was.
//! BENCHMARKS.md says how to read the figures and what limits them.

mod cost;
mod gate;
mod gateway;
mod lifecycle;
mod meter;
mod partitions;
mod policy_eval;
mod report;
mod rig;
mod scaling;
mod script;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};

use lifecycle::{Deciding, SWEEP_BUDGET};
use meter::Phase;
use report::{Latency, StepCost};
use rig::{Rig, Variation};
use shared::engine::records::IndexShards;

/// The allocator the `countersign` command runs with, so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchStore {
    /// A fresh SQLite store in a temporary directory, removed afterwards.
    Embedded,
    /// The DynamoDB table, SQS queue and schedule group the environment names.
    Dynamodb,
}

impl BenchStore {
    fn name(self) -> &'static str {
        match self {
            BenchStore::Embedded => "embedded",
            BenchStore::Dynamodb => "dynamodb",
        }
    }
}

/// What the bench prints: text for people, one JSON object for `--json`.
pub struct Output {
    text: String,
    json: Value,
}

/// Benchmark the approval lifecycle, the sweep and, on DynamoDB, AWS requests per step.
#[derive(Debug, Parser)]
#[command(name = "countersign-bench", version)]
pub struct BenchArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Lifecycles to run; as many approvals are then left to expire for the sweep.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Lifecycles in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Decide as the CLI and Slack's buttons do: without the snapshot a review's read gives,
    /// so the decision reads the approval itself.
    #[arg(long)]
    pub without_snapshot: bool,
    /// Where the state lives.
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: BenchStore,
    /// The expense policy with a history window on reimburse: what counting costs an approval.
    #[arg(long)]
    pub history_window: bool,
    /// Without the counts `GET /metrics` serves (decisions, executions, rulings), which the
    /// embedded store adds in each transaction that records one: what they cost a lifecycle.
    #[arg(long)]
    pub without_counts: bool,
    /// Instead: --runs allowed calls through the gate API against as many through `POST /runs`
    /// (loopback HTTP, embedded store, concurrency 1 and 8), then long-polls woken by decisions.
    #[arg(long, conflicts_with_all = ["sweep_scaling", "mcp_gateway"])]
    pub gate: bool,
    /// Instead: the sweep over --overdue approvals among --finished finished runs, M growing.
    #[arg(long)]
    pub sweep_scaling: bool,
    /// With --sweep-scaling: the overdue approvals each sweep finds.
    #[arg(long, default_value_t = 50)]
    pub overdue: usize,
    /// With --sweep-scaling: the numbers of finished runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1000,10000")]
    pub finished: Vec<usize>,
    /// Instead: --runs allowed calls through the MCP gateway and as many straight to the same
    /// upstream MCP server, allowed calls/s, and a decision's time to the waiting call's answer.
    #[arg(long, conflicts_with = "sweep_scaling")]
    pub mcp_gateway: bool,
    /// Instead: --runs decisions each of the shipped expense policy and of two of the cookbook's
    /// Cedar policies (a shell command's text, a history window), timed apart from any store.
    #[arg(long, conflicts_with_all = ["sweep_scaling", "mcp_gateway", "gate"])]
    pub policy_eval: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Setup(String),
    #[error("{0}")]
    Run(String),
    #[error("{0}")]
    Ledger(String),
}

impl BenchError {
    /// The stable code and the exit status: 2 for bad usage, 1 for a bench that failed.
    fn code(&self) -> (&'static str, u8) {
        match self {
            BenchError::Setup(_) => ("bad_usage", 2),
            BenchError::Run(_) => ("bench_failed", 1),
            BenchError::Ledger(_) => ("ledger_wrong", 1),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = BenchArgs::parse();
    shared::logs::to_stderr("warn");

    match run(&args).await {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            let _ = match args.json {
                true => writeln!(stdout, "{}", output.json),
                false => write!(stdout, "{}", output.text),
            };
            ExitCode::SUCCESS
        }
        Err(error) => {
            let (code, exit) = error.code();
            if args.json {
                println!(
                    "{}",
                    json!({"error": {"code": code, "message": error.to_string()}})
                );
            }
            eprintln!("error: {error}");
            ExitCode::from(exit)
        }
    }
}

async fn run(args: &BenchArgs) -> Result<Output, BenchError> {
    if args.runs == 0 {
        return Err(BenchError::Setup("--runs must be at least 1".into()));
    }
    if args.policy_eval {
        return policy_eval::run(args);
    }
    match (args.gate, args.mcp_gateway, args.sweep_scaling) {
        (true, _, _) => gate::run(args).await,
        (_, true, _) => gateway::run(args).await,
        (_, _, true) => scaling::run(args).await,
        _ => lifecycle_bench(args).await,
    }
}

#[derive(Debug, Serialize)]
struct SweepFigures {
    overdue: usize,
    expired: usize,
    calls: usize,
    budget: usize,
    ms: f64,
    ms_per_item: f64,
    /// On DynamoDB: the queue consumers' time to resume the expired runs to done.
    #[serde(skip_serializing_if = "Option::is_none")]
    resumed_ms: Option<f64>,
}

/// On the embedded store, how the lifecycles' transactions shared the writer's commits.
#[derive(Debug, Serialize)]
struct GroupCommits {
    commits: u64,
    transactions: u64,
    /// The commits made on their caller's thread, with no hand-off to the writer thread.
    in_place: u64,
    /// The checkpoints the store's checkpointer thread made beside the commits.
    checkpoints: u64,
    /// The checkpoints a commit made, finishing the checkpointer's.
    checkpoints_in_place: u64,
    /// The writes SQLite asked of the log (two a frame), and the write calls made of them.
    wal_writes_asked: u64,
    wal_writes_made: u64,
    per_commit: f64,
    per_lifecycle: f64,
}

/// The CPU the process used while the lifecycles ran (every thread: the engine, the store's
/// writer and readers, the kernel's work for them), from /proc; per lifecycle, less what the
/// bench's own meter took.
#[derive(Debug, Serialize)]
struct LifecycleCpu {
    user_seconds: f64,
    system_seconds: f64,
    meter_seconds: f64,
    ms_per_lifecycle: f64,
}

async fn lifecycle_bench(args: &BenchArgs) -> Result<Output, BenchError> {
    let (runs, concurrency) = (args.runs, args.concurrency.max(1));
    let load_before = report::load_average();
    let variation = Variation {
        history_window: args.history_window,
        keep_counts: !args.without_counts,
    };
    let rig = Arc::new(Rig::varied(args.store, 2 * runs, variation).await?);
    let in_process = rig.queue.is_none();
    rig.meter.take();
    rig.meter.take_keys();

    let deciding = match args.without_snapshot {
        true => Deciding::ReadingFirst,
        false => Deciding::FromSnapshot,
    };
    let commits_before = rig.commits();
    let cpu_before = report::cpu_seconds();
    rig.meter.take_own_cpu();
    let (elapsed, samples) = lifecycle::lifecycles(&rig, 0..runs, concurrency, deciding).await?;
    let meter_seconds = rig.meter.take_own_cpu().as_secs_f64();
    let cpu = report::cpu_seconds()
        .zip(cpu_before)
        .map(|((user, system), (user0, system0))| LifecycleCpu {
            user_seconds: user - user0,
            system_seconds: system - system0,
            meter_seconds,
            ms_per_lifecycle: 1000.0 * (user - user0 + system - system0 - meter_seconds)
                / runs as f64,
        });
    let lived = rig.meter.take();
    let (key_units, registry_bytes) = rig.meter.take_keys();
    let commits = rig.commits().zip(commits_before).map(|(now, before)| {
        let (groups, txns) = (
            now.commits - before.commits,
            now.transactions - before.transactions,
        );
        GroupCommits {
            commits: groups,
            transactions: txns,
            in_place: now.in_place - before.in_place,
            checkpoints: now.checkpoints - before.checkpoints,
            checkpoints_in_place: now.checkpoints_in_place - before.checkpoints_in_place,
            wal_writes_asked: now.wal_writes.asked - before.wal_writes.asked,
            wal_writes_made: now.wal_writes.made - before.wal_writes.made,
            per_commit: txns as f64 / groups.max(1) as f64,
            per_lifecycle: groups as f64 / runs as f64,
        }
    });

    // Measured in the same run, beside the store, right after the lifecycles.
    let disk = match rig.store_dir() {
        Some(dir) => Some(report::DiskFloor::measure(dir).map_err(|e| {
            BenchError::Setup(format!(
                "cannot measure the disk's fsync beside the store: {e}"
            ))
        })?),
        None => None,
    };
    let floor = disk.zip(commits.as_ref()).map(|(disk, commits)| {
        let cpu_ms = cpu.as_ref().map(|cpu| cpu.ms_per_lifecycle);
        report::Floor::of(disk, commits.per_lifecycle, elapsed, runs, cpu_ms)
    });

    lifecycle::leave_overdue(&rig, runs..2 * runs, concurrency).await?;
    rig.meter.take();
    let swept = lifecycle::sweep_until_clear(&rig).await?;
    let sweep_counts = rig.meter.take();
    let resumed = lifecycle::drain(&rig, swept.expired, concurrency).await?;
    let after_expiry = rig.meter.take();
    let ledger = lifecycle::check_ledger(&rig, 0..runs).await?;
    let load_after = report::load_average();

    let start = StepCost::of(&lived, Phase::Start, runs);
    let review = StepCost::of(&lived, Phase::Review, runs);
    let decision = StepCost::of(&lived, Phase::Decide, runs);
    // On DynamoDB: the decision's own requests, and the read that showed the approval first.
    let dynamodb_requests = (!in_process).then(|| {
        (
            cost::requests_of(&decision, "DynamoDB."),
            cost::requests_of(&review, "DynamoDB."),
        )
    });
    let resume = StepCost::of(&lived, Phase::Resume, runs);
    let sweep_item = StepCost::of(&sweep_counts, Phase::Sweep, swept.expired);
    let resume_after_expiry = StepCost::of(&after_expiry, Phase::Resume, swept.expired);
    let families = partitions::families(&key_units, runs);
    // Before sharding, every index sat on one key, and the tenant registry was rewritten in
    // each start's transaction (2 write units per KB).
    let unsharded = IndexShards::new(1).expect("one shard");
    let registry_every_start = 2.0 * registry_bytes.div_ceil(1024).max(1) as f64;
    let ceilings = [
        (
            "before (one key per index, registry every start)",
            partitions::ceiling(&families, 1, unsharded, registry_every_start),
        ),
        (
            "",
            partitions::ceiling(&families, 1_000, unsharded, registry_every_start),
        ),
        (
            "now (sharded indexes, registry once a process)",
            partitions::ceiling(&families, 1, rig.shards, 0.0),
        ),
        ("", partitions::ceiling(&families, 1_000, rig.shards, 0.0)),
    ];
    let cost = (!in_process).then(|| cost::per_million(&start, &decision, &resume));
    let sweep = SweepFigures {
        overdue: runs,
        expired: swept.expired,
        calls: swept.calls,
        budget: SWEEP_BUDGET,
        ms: report::ms(swept.elapsed),
        ms_per_item: report::ms(swept.elapsed) / swept.expired.max(1) as f64,
        resumed_ms: resumed.map(report::ms),
    };
    let seconds = elapsed.as_secs_f64();
    let latency = json!({
        "start": Latency::of(&samples.start),
        "decide": Latency::of(&samples.decide),
        "resume": Latency::of(&samples.resume),
    });
    let json = json!({
        "store": args.store,
        "runs": runs,
        "concurrency": concurrency,
        "decisions_with_snapshot": deciding == Deciding::FromSnapshot,
        "seconds": seconds,
        "runs_per_second": runs as f64 / seconds,
        "decide_includes_resume": in_process,
        "latency": latency,
        "sweep": sweep,
        "ledger": ledger,
        "ledger_ok": ledger.ok(),
        "dynamodb_requests_per_decision": dynamodb_requests.map(|(decision, _)| decision),
        "dynamodb_requests_per_review_read": dynamodb_requests.map(|(_, review)| review),
        "per_step": {
            "start": start,
            "review_read": review,
            "decision": decision,
            "resume": resume,
            "sweep_item": sweep_item,
            "resume_after_expiry": resume_after_expiry,
        },
        "schedules": rig.schedules,
        "group_commits": commits,
        "cpu": cpu,
        "disk_floor": floor,
        "load_average": { "before": load_before, "after": load_after },
        "cost_per_million_approvals": cost,
        "partition_keys": {
            "families": families,
            "ceilings": ceilings.iter().map(|(_, c)| c).collect::<Vec<_>>(),
        },
    });

    let mut text = format!(
        "countersign-bench: {runs} lifecycles on the {} store, {concurrency} at a time\n",
        args.store.name()
    );
    if let (Some(before), Some(after)) = (load_before, load_after) {
        text.push_str(&format!(
            "  load       average {before:.2} before, {after:.2} after (the other work on this machine; a timing taken under load is noisy)\n"
        ));
    }
    text.push_str(&format!(
        "  lifecycle  {runs} runs started, approved, resumed and done in {seconds:.2} s: {:.1} runs/s\n",
        runs as f64 / seconds
    ));
    if let Some(c) = &commits {
        text.push_str(&format!(
            "  commits    {} SQL commits (one fsync each) for {} transactions: {:.2} transactions per commit, {:.2} commits per lifecycle, {} on their caller's thread; {} checkpoints beside them, {} by a commit; the log's frames in {} writes, of {} SQLite asked for\n",
            c.commits,
            c.transactions,
            c.per_commit,
            c.per_lifecycle,
            c.in_place,
            c.checkpoints,
            c.checkpoints_in_place,
            c.wal_writes_made,
            c.wal_writes_asked
        ));
    }
    if let Some(cpu) = &cpu {
        text.push_str(&format!(
            "  cpu        {:.2} s user + {:.2} s system for the lifecycles, less {:.3} s the bench's meter took: {:.2} ms of CPU per lifecycle\n",
            cpu.user_seconds, cpu.system_seconds, cpu.meter_seconds, cpu.ms_per_lifecycle
        ));
    }
    if let Some(floor) = &floor {
        text.push_str(&floor.line());
    }
    let line = |name: &str, samples: &[std::time::Duration], note: &str| match Latency::of(samples)
    {
        Some(latency) => format!("  {name:<10} {}{note}\n", latency.line()),
        None => String::new(),
    };
    text.push_str(&line("start", &samples.start, ""));
    let note = if in_process {
        "   (includes the in-process resume)"
    } else {
        ""
    };
    text.push_str(&line("decide", &samples.decide, note));
    text.push_str(&line("resume", &samples.resume, ""));
    text.push_str(&format!(
        "  sweep      {} overdue approvals expired in {:.1} ms over {} calls (budget {SWEEP_BUDGET}): {:.2} ms per item{}\n",
        swept.expired,
        sweep.ms,
        swept.calls,
        sweep.ms_per_item,
        if in_process { ", each run resumed to done in-process" } else { "" }
    ));
    if let Some(resumed) = sweep.resumed_ms {
        text.push_str(&format!(
            "             the queue consumers resumed those runs to done in {resumed:.1} ms\n"
        ));
    }
    text.push_str(&format!(
        "  ledger     {} payments for {} approvals, {} claims twice, {} keys twice, {} never approved: {}\n",
        ledger.payments,
        ledger.expected,
        ledger.duplicate_claims,
        ledger.duplicate_keys,
        ledger.unexpected.len(),
        if ledger.ok() { "OK" } else { "WRONG" }
    ));
    text.push_str("\nwhat each step asks of the store (calls at the item-store port)");
    text.push_str(if in_process {
        "; the decision resumes the run in-process, so its resume is counted in it:\n"
    } else {
        " and of AWS (requests, estimated request units, DynamoDB's reported capacity):\n"
    });
    let mut steps = vec![
        ("start", &start),
        ("review read", &review),
        ("decision", &decision),
    ];
    if !in_process {
        steps.push(("resume", &resume));
    }
    steps.push(("swept item", &sweep_item));
    if !in_process {
        steps.push(("resume after expiry", &resume_after_expiry));
    }
    text.push_str(&report::step_table(&steps, !in_process));
    if let Some((decision, review)) = dynamodb_requests {
        let how = match deciding {
            Deciding::FromSnapshot => format!(
                "it brings back the snapshot the review read gave ({review:.2} requests, on its own line) and its transaction holds only on that exact approval"
            ),
            Deciding::ReadingFirst => {
                "without a snapshot, as the CLI and Slack's buttons decide: it reads the approval first".to_string()
            }
        };
        text.push_str(&format!(
            "  DynamoDB requests per decision: {decision:.2}; {how}\n"
        ));
    }
    text.push_str(
        "\nthe condition each write carries (must be new: the item must not exist; version is: compare-and-set on the stored version; as shown: the stored version and exactly the body the decision was ruled on, from its snapshot; no check: written whatever is there), and the transactions of one write, which DynamoDB takes as a plain conditional PutItem or DeleteItem:\n",
    );
    text.push_str(&report::condition_table(&steps));
    if let Some(cost) = &cost {
        text.push('\n');
        text.push_str(&cost::table(cost));
    }
    text.push('\n');
    text.push_str(&partitions::table(&families, &ceilings));

    if swept.expired != runs {
        eprint!("{text}");
        return Err(BenchError::Run(format!(
            "the sweep expired {} of {runs} overdue approvals",
            swept.expired
        )));
    }
    if !ledger.ok() {
        eprint!("{text}");
        return Err(BenchError::Ledger(ledger.problem()));
    }
    Ok(Output { text, json })
}
