//! Sweep cost against the size of the store: K overdue approvals among M finished runs, for K
//! fixed and M growing. The sweep reads the tenant registry and each tenant's pending index up
//! to now, so it should touch K approvals whatever M is.

use std::sync::Arc;

use serde::Serialize;
use serde_json::json;

use crate::lifecycle::{self, Deciding, SWEEP_BUDGET};
use crate::meter::{Phase, StoreCounts};
use crate::report::ms;
use crate::rig::Rig;
use crate::{BenchArgs, BenchError, Output};

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub finished_runs: usize,
    pub overdue: usize,
    pub expired: usize,
    pub sweep_calls: usize,
    pub sweep_ms: f64,
    pub ms_per_item: f64,
    /// Store calls of the whole sweep (all its calls), not per item.
    pub store: StoreCounts,
    pub aws_requests: f64,
    /// How long filling the store up to `finished_runs` took (lifecycles, not timed closely).
    pub fill_seconds: f64,
}

pub async fn run(args: &BenchArgs) -> Result<Output, BenchError> {
    let mut steps = args.finished.clone();
    steps.sort_unstable();
    steps.dedup();
    let overdue = args.overdue.max(1);
    let most = steps.last().copied().unwrap_or(0);
    let rig = Arc::new(Rig::new(args.store, most + overdue * steps.len()).await?);
    let concurrency = args.concurrency.max(1);
    let (mut finished, mut next_overdue) = (0, most);
    let mut rows = Vec::new();
    for &target in &steps {
        let filling = std::time::Instant::now();
        if target > finished {
            lifecycle::lifecycles(&rig, finished..target, concurrency, Deciding::FromSnapshot)
                .await?;
            finished = target;
        }
        let fill_seconds = filling.elapsed().as_secs_f64();
        lifecycle::leave_overdue(&rig, next_overdue..next_overdue + overdue, concurrency).await?;
        next_overdue += overdue;
        rig.meter.take();
        let swept = lifecycle::sweep_until_clear(&rig).await?;
        let counts = rig.meter.take();
        if swept.expired != overdue {
            return Err(BenchError::Run(format!(
                "the sweep expired {} of {overdue} overdue approvals among {target} finished runs",
                swept.expired
            )));
        }
        lifecycle::drain(&rig, swept.expired, concurrency).await?;
        rig.meter.take();
        rows.push(Row {
            finished_runs: target,
            overdue,
            expired: swept.expired,
            sweep_calls: swept.calls,
            sweep_ms: ms(swept.elapsed),
            ms_per_item: ms(swept.elapsed) / swept.expired.max(1) as f64,
            store: counts.store(Phase::Sweep),
            aws_requests: counts.aws_total(Phase::Sweep).requests,
            fill_seconds,
        });
    }
    let ledger = lifecycle::check_ledger(&rig, 0..most).await?;
    let in_process = rig.queue.is_none();
    let mut text = format!(
        "countersign-bench --sweep-scaling: {overdue} overdue approvals among a growing number of finished runs, {} store, sweep budget {SWEEP_BUDGET}\n",
        args.store.name()
    );
    if in_process {
        text.push_str(
            "  (embedded: each expiry also resumes its run to done in the sweeping process)\n",
        );
    }
    text.push_str(&format!(
        "  {:>9} {:>8} {:>7} {:>6} {:>10} {:>9} {:>6} {:>9} {:>8} {:>6} {:>9}\n",
        "finished",
        "overdue",
        "expired",
        "calls",
        "sweep ms",
        "ms/item",
        "reads",
        "idx reads",
        "items",
        "txns",
        "AWS reqs"
    ));
    for row in &rows {
        let s = &row.store;
        text.push_str(&format!(
            "  {:>9} {:>8} {:>7} {:>6} {:>10.1} {:>9.2} {:>6.0} {:>9.0} {:>8.0} {:>6.0} {:>9.0}\n",
            row.finished_runs,
            row.overdue,
            row.expired,
            row.sweep_calls,
            row.sweep_ms,
            row.ms_per_item,
            s.gets + s.queries,
            s.index_queries,
            s.items_read,
            s.transactions,
            row.aws_requests
        ));
    }
    text.push_str(&format!(
        "  ledger: {} payments for {} approvals: {}\n",
        ledger.payments,
        ledger.expected,
        if ledger.ok() { "OK" } else { "WRONG" }
    ));
    let json = json!({
        "store": args.store,
        "overdue": overdue,
        "sweep_budget": SWEEP_BUDGET,
        "rows": rows,
        "ledger": ledger,
        "ledger_ok": ledger.ok(),
    });
    if !ledger.ok() {
        eprint!("{text}");
        return Err(BenchError::Ledger(ledger.problem()));
    }
    Ok(Output { text, json })
}
