//! Counting what each step of the lifecycle asks of its store and of AWS.
//!
//! Every engine call the bench makes runs inside a [`Phase`] (a task-local), so a store call or
//! an AWS request is charged to the step that made it even with many lifecycles in flight.
//! [`MeteredStore`] counts calls at the item-store port (both stores); [`AwsMeter`] is an SDK
//! interceptor that counts HTTP requests per operation, reads the `ConsumedCapacity` DynamoDB
//! returns, and estimates the request units DynamoDB would bill from the items' sizes.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::delete_item::{DeleteItemInput, DeleteItemOutput};
use aws_sdk_dynamodb::operation::get_item::{GetItemInput, GetItemOutput};
use aws_sdk_dynamodb::operation::put_item::{PutItemInput, PutItemOutput};
use aws_sdk_dynamodb::operation::query::{QueryInput, QueryOutput};
use aws_sdk_dynamodb::operation::transact_write_items::{
    TransactWriteItemsInput, TransactWriteItemsOutput,
};
use aws_sdk_dynamodb::types::{AttributeValue, ConsumedCapacity};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextRef,
    BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use serde::Serialize;

use crate::partitions::{KeyLoad, Written};
use shared::ports::store::{
    Condition, Item, ItemStore, Page, Query, Range, Refused, StoreError, Write,
};

/// The step of the lifecycle an engine call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Start,
    /// The reviewer's read of the approval they then decide (`GET /approvals/{id}`), which
    /// gives the snapshot the decision brings back.
    Review,
    Decide,
    Resume,
    Sweep,
    /// Preparation and checks: runs left to expire, ledger reads, queue receives.
    Setup,
}

tokio::task_local! {
    static PHASE: Phase;
}

/// Runs `work` with its store calls and AWS requests charged to `phase`.
pub async fn within<F: Future>(phase: Phase, work: F) -> F::Output {
    PHASE.scope(phase, work).await
}

fn current() -> Phase {
    PHASE.try_with(|p| *p).unwrap_or(Phase::Setup)
}

/// Calls at the item-store port.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize)]
pub struct StoreCounts {
    pub gets: f64,
    pub queries: f64,
    pub index_queries: f64,
    pub items_read: f64,
    pub transactions: f64,
    pub writes: f64,
    /// Transactions of one write: on DynamoDB a plain conditional PutItem or DeleteItem.
    pub single_writes: f64,
    /// Writes by the condition they carry.
    pub must_not_exist: f64,
    pub version_is: f64,
    /// Still at that version with exactly that body: a decision's approval, as it was shown.
    pub unchanged: f64,
    pub unconditional: f64,
}

/// `per(n)`, every count divided by `n` (at least 1), for a struct of `f64` counts.
macro_rules! per {
    ($counts:ident { $($field:ident),* $(,)? }) => {
        impl $counts {
            pub fn per(self, n: usize) -> Self {
                let n = n.max(1) as f64;
                Self {
                    $($field: self.$field / n),*
                }
            }
        }
    };
}

per!(StoreCounts {
    gets,
    queries,
    index_queries,
    items_read,
    transactions,
    writes,
    single_writes,
    must_not_exist,
    version_is,
    unchanged,
    unconditional,
});

impl StoreCounts {
    pub fn reads(&self) -> f64 {
        self.gets + self.queries + self.index_queries
    }
}

/// Requests of one AWS operation, and the capacity they consumed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize)]
pub struct AwsCounts {
    pub requests: f64,
    /// What DynamoDB said it consumed (`ConsumedCapacity`); moto returns fixed placeholders.
    pub reported_capacity: f64,
    /// Read request units by DynamoDB's sizing rules, from the items read.
    pub estimated_rru: f64,
    /// Write request units on the table (transactional: 2 per KB per item; a plain PutItem or
    /// DeleteItem: 1 per KB).
    pub estimated_wru: f64,
    /// Write request units on the sparse index (an item entering, changing or leaving it).
    pub estimated_index_wru: f64,
    /// Attempts that came back with an error (a cancelled transaction, a throttle, a retry).
    pub errors: f64,
}

impl AwsCounts {
    fn add(&mut self, other: &AwsCounts) {
        self.requests += other.requests;
        self.reported_capacity += other.reported_capacity;
        self.estimated_rru += other.estimated_rru;
        self.estimated_wru += other.estimated_wru;
        self.estimated_index_wru += other.estimated_index_wru;
        self.errors += other.errors;
    }
}

per!(AwsCounts {
    requests,
    reported_capacity,
    estimated_rru,
    estimated_wru,
    estimated_index_wru,
    errors,
});

/// `service.Operation`, as the SDK names it (`DynamoDB.TransactWriteItems`).
pub type OperationName = String;

/// What was counted since the last [`Meter::take`].
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub store: BTreeMap<Phase, StoreCounts>,
    pub aws: BTreeMap<Phase, BTreeMap<OperationName, AwsCounts>>,
}

impl Counts {
    pub fn store(&self, phase: Phase) -> StoreCounts {
        self.store.get(&phase).copied().unwrap_or_default()
    }

    pub fn aws(&self, phase: Phase) -> BTreeMap<OperationName, AwsCounts> {
        self.aws.get(&phase).cloned().unwrap_or_default()
    }

    /// Every operation of a phase added up.
    pub fn aws_total(&self, phase: Phase) -> AwsCounts {
        let mut total = AwsCounts::default();
        for counts in self.aws(phase).values() {
            total.add(counts);
        }
        total
    }
}

/// An item's last known size and sparse-index key, to estimate what its next write costs.
#[derive(Debug, Clone)]
struct Shadow {
    bytes: u64,
    index_key: Option<String>,
}

#[derive(Debug, Default)]
pub struct Meter {
    counts: Mutex<Counts>,
    shadows: Mutex<HashMap<(String, String), Shadow>>,
    keys: Mutex<KeyLoad>,
    /// The CPU the meter's own work around each transaction took (taking its writes' keys and
    /// sizes, and counting their write units per key), in nanoseconds: the bench's, not
    /// Countersign's.
    own_nanos: AtomicU64,
}

impl Meter {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Everything counted since the last call, and a fresh start.
    pub fn take(&self) -> Counts {
        std::mem::take(&mut *self.counts.lock().expect("meter lock"))
    }

    /// The CPU the meter's own work took since the last call.
    pub fn take_own_cpu(&self) -> Duration {
        Duration::from_nanos(self.own_nanos.swap(0, Ordering::Relaxed))
    }

    /// Runs the meter's own work, timed on the monotonic clock. The work is a few microseconds
    /// of computing on the calling thread, which does not block in it, so its time on that clock
    /// is its CPU time. The thread's CPU clock would say so exactly, but each read of it is a
    /// system call: four a transaction, about 3.5 % of a lifecycle's samples, which the bench
    /// counted as Countersign's. The vDSO reads the monotonic clock without one.
    fn own<T>(&self, work: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let done = work();
        let nanos = start.elapsed().as_nanos() as u64;
        self.own_nanos.fetch_add(nanos, Ordering::Relaxed);
        done
    }

    /// Write units per partition key since the last call, and the tenant registry item's size.
    pub fn take_keys(&self) -> (BTreeMap<(bool, String), f64>, u64) {
        let mut keys = self.keys.lock().expect("meter lock");
        (keys.take(), keys.registry_bytes())
    }

    fn store(&self, count: impl FnOnce(&mut StoreCounts)) {
        let mut counts = self.counts.lock().expect("meter lock");
        count(counts.store.entry(current()).or_default());
    }

    fn aws(&self, operation: &str, count: impl FnOnce(&mut AwsCounts)) {
        let mut counts = self.counts.lock().expect("meter lock");
        let phase = counts.aws.entry(current()).or_default();
        match phase.get_mut(operation) {
            Some(existing) => count(existing),
            None => count(phase.entry(operation.to_string()).or_default()),
        }
    }
}

/// The item-store port, counted.
pub struct MeteredStore {
    inner: Arc<dyn ItemStore>,
    meter: Arc<Meter>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn ItemStore>, meter: Arc<Meter>) -> Self {
        Self { inner, meter }
    }
}

#[async_trait]
impl ItemStore for MeteredStore {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        let item = self.inner.get(pk, sk).await;
        let found = matches!(item, Ok(Some(_))) as u8 as f64;
        self.meter.store(|c| {
            c.gets += 1.0;
            c.items_read += found;
        });
        item
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        let page = self.inner.page(query).await;
        let read = page.as_ref().map_or(0, |p| p.items.len()) as f64;
        self.meter.store(|c| {
            match query.range {
                Range::Partition { .. } => c.queries += 1.0,
                Range::Index { .. } => c.index_queries += 1.0,
            }
            c.items_read += read;
        });
        page
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.transact_or_found(writes).await.map_err(|r| r.error)
    }

    async fn transact_or_found(&self, writes: Vec<Write>) -> Result<(), Refused> {
        let recorded = self.meter.own(|| self.count_writes(&writes));
        let result = self.inner.transact_or_found(writes).await;
        if result.is_ok() {
            self.meter
                .own(|| self.meter.keys.lock().expect("meter lock").record(recorded));
        }
        result
    }
}

impl MeteredStore {
    /// Counts a transaction's writes by condition, and takes what their write units per key
    /// are counted from once they commit.
    fn count_writes(&self, writes: &[Write]) -> Vec<Written> {
        let n = writes.len() as f64;
        let count = |condition: Condition| {
            writes
                .iter()
                .filter(|w| *w.condition() == condition)
                .count() as f64
        };
        let (new, unconditional) = (count(Condition::NotExists), count(Condition::Always));
        let unchanged = writes
            .iter()
            .filter(|w| matches!(w.condition(), Condition::Unchanged { .. }))
            .count() as f64;
        self.meter.store(|c| {
            c.transactions += 1.0;
            c.writes += n;
            c.single_writes += (writes.len() == 1) as u8 as f64;
            c.must_not_exist += new;
            c.unconditional += unconditional;
            c.unchanged += unchanged;
            c.version_is += n - new - unconditional - unchanged;
        });
        writes.iter().map(Written::of).collect()
    }
}

/// The calling thread's CPU time so far (Linux).
pub fn thread_cpu() -> Option<Duration> {
    let clock = nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID;
    nix::time::clock_gettime(clock).ok().map(Duration::from)
}

/// The SDK interceptor: add it to each AWS client's configuration.
#[derive(Debug, Clone)]
pub struct AwsMeter(pub Arc<Meter>);

/// Marks a read DynamoDB serves eventually consistent (the index), which costs half.
#[derive(Debug, Clone)]
struct EventuallyConsistent;

impl Storable for EventuallyConsistent {
    type Storer = StoreReplace<Self>;
}

fn operation(cfg: &ConfigBag) -> String {
    match cfg.load::<Metadata>() {
        Some(metadata) => format!("{}.{}", metadata.service(), metadata.name()),
        None => "unknown".into(),
    }
}

/// An attribute's size by DynamoDB's rules: name bytes plus value bytes; a number takes one
/// byte per two significant digits plus one.
fn attribute_size(name: &str, value: &AttributeValue) -> u64 {
    let value = match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => {
            let digits: String = n.chars().filter(char::is_ascii_digit).collect();
            let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
            significant.max(1).div_ceil(2) + 1
        }
        _ => 1,
    };
    (name.len() + value) as u64
}

fn item_size(item: &HashMap<String, AttributeValue>) -> u64 {
    item.iter().map(|(k, v)| attribute_size(k, v)).sum()
}

fn text<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> &'a str {
    match item.get(name) {
        Some(AttributeValue::S(s)) => s,
        _ => "",
    }
}

fn index_key(item: &HashMap<String, AttributeValue>) -> Option<String> {
    match (item.get("gsi1pk"), item.get("gsi1sk")) {
        (Some(AttributeValue::S(pk)), Some(AttributeValue::S(sk))) => Some(format!("{pk}\n{sk}")),
        _ => None,
    }
}

/// Write units for an item of this size: one per KB, rounded up.
fn write_units(bytes: u64) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

/// Read units of a strongly consistent read: one per 4 KB, rounded up, at least one.
fn read_units(bytes: u64) -> f64 {
    bytes.div_ceil(4096).max(1) as f64
}

fn reported(capacity: Option<&ConsumedCapacity>) -> f64 {
    capacity.and_then(|c| c.capacity_units()).unwrap_or(0.0)
}

/// The key of an item's attributes.
fn key_of(item: &HashMap<String, AttributeValue>) -> (String, String) {
    (text(item, "pk").to_string(), text(item, "sk").to_string())
}

impl Meter {
    /// What a transaction will cost, from its items and what was last written under their keys.
    /// Charged when the request is made: a cancelled transaction is charged too.
    fn estimate_transaction(&self, input: &TransactWriteItemsInput) -> (f64, f64) {
        let (mut table, mut index) = (0.0, 0.0);
        for write in input.transact_items() {
            let (t, i) = if let Some(put) = write.put() {
                self.estimate_write(key_of(put.item()), Some(put.item()), 2.0)
            } else if let Some(delete) = write.delete() {
                self.estimate_write(key_of(delete.key()), None, 2.0)
            } else {
                continue;
            };
            table += t;
            index += i;
        }
        (table, index)
    }

    /// One write of `item` (a put) or of nothing (a delete) under `key`: `factor` write units
    /// per KB on the table, on the larger of the old and new image (2 in a transaction, 1 for a
    /// plain PutItem or DeleteItem), and 1 per KB on the sparse index for each image in it.
    fn estimate_write(
        &self,
        key: (String, String),
        item: Option<&HashMap<String, AttributeValue>>,
        factor: f64,
    ) -> (f64, f64) {
        let mut shadows = self.shadows.lock().expect("meter lock");
        let next = item.map(|item| Shadow {
            bytes: item_size(item),
            index_key: index_key(item),
        });
        let before = match &next {
            Some(next) => shadows.insert(key, next.clone()),
            None => shadows.remove(&key),
        };
        let (old_bytes, old_index) = before.map(|s| (s.bytes, s.index_key)).unwrap_or((0, None));
        let new_bytes = next.as_ref().map_or(0, |s| s.bytes);
        let table = factor * write_units(old_bytes.max(new_bytes));
        let new_index = next.and_then(|s| s.index_key);
        let index = match (old_index, new_index) {
            (None, None) => 0.0,
            (None, Some(_)) => write_units(new_bytes),
            (Some(_), None) => write_units(old_bytes),
            (Some(a), Some(b)) if a == b => write_units(old_bytes.max(new_bytes)),
            (Some(_), Some(_)) => write_units(old_bytes) + write_units(new_bytes),
        };
        (table, index)
    }
}

impl Meter {
    /// The write units a request will use, if it writes.
    fn estimate_request(
        &self,
        input: &aws_smithy_runtime_api::client::interceptors::context::Input,
    ) -> Option<(f64, f64)> {
        if let Some(transaction) = input.downcast_ref::<TransactWriteItemsInput>() {
            return Some(self.estimate_transaction(transaction));
        }
        if let Some(item) = input.downcast_ref::<PutItemInput>().and_then(|p| p.item()) {
            return Some(self.estimate_write(key_of(item), Some(item), 1.0));
        }
        let key = input.downcast_ref::<DeleteItemInput>()?.key()?;
        Some(self.estimate_write(key_of(key), None, 1.0))
    }
}

impl Intercept for AwsMeter {
    fn name(&self) -> &'static str {
        "CountersignBenchMeter"
    }

    fn read_before_serialization(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let input = context.input();
        let written = self.0.estimate_request(input);
        if let Some((table, index)) = written {
            self.0.aws(&operation(cfg), |c| {
                c.estimated_wru += table;
                c.estimated_index_wru += index;
            });
        } else if let Some(query) = input.downcast_ref::<QueryInput>() {
            if query.index_name().is_some() || query.consistent_read() != Some(true) {
                cfg.interceptor_state().store_put(EventuallyConsistent);
            }
        } else if let Some(get) = input.downcast_ref::<GetItemInput>()
            && get.consistent_read() != Some(true)
        {
            cfg.interceptor_state().store_put(EventuallyConsistent);
        }
        Ok(())
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // Once per attempt: a retried request is billed again.
        self.0.aws(&operation(cfg), |c| c.requests += 1.0);
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let output = match context.output_or_error() {
            Ok(output) => output,
            Err(error) => {
                tracing::debug!(operation = %operation(cfg), ?error, "an AWS request failed");
                self.0.aws(&operation(cfg), |c| c.errors += 1.0);
                return Ok(());
            }
        };
        let factor = match cfg.load::<EventuallyConsistent>() {
            Some(_) => 0.5,
            None => 1.0,
        };
        let (units, capacity) = if let Some(get) = output.downcast_ref::<GetItemOutput>() {
            let bytes = get.item().map_or(0, item_size);
            (read_units(bytes), reported(get.consumed_capacity()))
        } else if let Some(query) = output.downcast_ref::<QueryOutput>() {
            let bytes = query.items().iter().map(item_size).sum();
            (read_units(bytes), reported(query.consumed_capacity()))
        } else if let Some(transaction) = output.downcast_ref::<TransactWriteItemsOutput>() {
            let capacity = transaction
                .consumed_capacity()
                .iter()
                .map(|c| reported(Some(c)))
                .sum();
            (0.0, capacity)
        } else if let Some(put) = output.downcast_ref::<PutItemOutput>() {
            (0.0, reported(put.consumed_capacity()))
        } else if let Some(delete) = output.downcast_ref::<DeleteItemOutput>() {
            (0.0, reported(delete.consumed_capacity()))
        } else {
            return Ok(());
        };
        self.0.aws(&operation(cfg), |c| {
            c.estimated_rru += factor * units;
            c.reported_capacity += capacity;
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_dynamodbs_rules() {
        assert_eq!(attribute_size("pk", &AttributeValue::S("abc".into())), 5);
        // 12345: five significant digits, three bytes, plus one.
        assert_eq!(
            attribute_size("ver", &AttributeValue::N("12345".into())),
            3 + 4
        );
        assert_eq!(attribute_size("ver", &AttributeValue::N("1".into())), 3 + 2);
        assert_eq!(write_units(1), 1.0);
        assert_eq!(write_units(1024), 1.0);
        assert_eq!(write_units(1025), 2.0);
        assert_eq!(read_units(0), 1.0);
        assert_eq!(read_units(4097), 2.0);
    }
}
