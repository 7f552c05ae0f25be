//! The conditional item store: the one storage port the engine writes every transition on.
//! DynamoDB (one table) and SQLite (one table) both implement it with the same semantics.

use async_trait::async_trait;

use super::counters::Counters;

/// A key in the sparse secondary index: only items that carry one appear in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexKey {
    pub pk: String,
    pub sk: String,
}

/// One stored item. `ver` is the item's version for compare-and-set; `body` is JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub pk: String,
    pub sk: String,
    pub gsi1: Option<IndexKey>,
    pub ver: u64,
    pub body: String,
}

impl Item {
    /// Its size as DynamoDB counts it against the item limit: each attribute's name and value
    /// (`pk`, `sk`, `ver` as a number, `body`, and `gsi1pk`/`gsi1sk` when indexed). Both
    /// stores refuse an item past [`ITEM_LIMIT`] by this one measure.
    pub fn stored_size(&self) -> usize {
        let index = self.gsi1.as_ref().map_or(0, |k| {
            "gsi1pk".len() + k.pk.len() + "gsi1sk".len() + k.sk.len()
        });
        // A number is stored in about one byte per two digits, plus one.
        let ver = "ver".len() + self.ver.to_string().len().div_ceil(2) + 1;
        "pk".len()
            + self.pk.len()
            + "sk".len()
            + self.sk.len()
            + "body".len()
            + self.body.len()
            + ver
            + index
    }
}

/// The largest item either store keeps: DynamoDB's 400 KB, names and values counted.
pub const ITEM_LIMIT: usize = crate::domain::budget::ITEM_LIMIT;
/// The most one transaction may write, its items together (DynamoDB's 4 MB).
pub const TRANSACTION_LIMIT: usize = 4 * 1024 * 1024;

/// What must hold for one write of a transaction to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Always,
    NotExists,
    VersionIs(u64),
    /// The item exists at version `ver` with exactly `body`: what a caller ruled on without
    /// reading it (a decision made from the snapshot a reviewer was shown) is still what is
    /// stored, so the ruling holds as if the item had been read first.
    Unchanged {
        ver: u64,
        body: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put {
        item: Item,
        condition: Condition,
    },
    Delete {
        pk: String,
        sk: String,
        condition: Condition,
    },
}

impl Write {
    pub fn key(&self) -> (&str, &str) {
        match self {
            Write::Put { item, .. } => (&item.pk, &item.sk),
            Write::Delete { pk, sk, .. } => (pk, sk),
        }
    }

    pub fn condition(&self) -> &Condition {
        match self {
            Write::Put { condition, .. } | Write::Delete { condition, .. } => condition,
        }
    }
}

/// One page of a query, in key order. `next` resumes after the last item; `None` means the end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page {
    pub items: Vec<Item>,
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Nothing was written; `failed` lists the index of each write whose condition did not hold.
    #[error("a condition did not hold (writes {failed:?}); nothing was written")]
    ConditionFailed { failed: Vec<usize> },
    /// Another transaction touched the same items at the same moment; trying again may succeed.
    #[error("the store is busy with a conflicting transaction")]
    Contended,
    /// An item past [`ITEM_LIMIT`], or a transaction past [`TRANSACTION_LIMIT`]: nothing was
    /// written, and the same write will never fit.
    #[error("{what} is larger than the store keeps ({limit} bytes); nothing was written")]
    TooLarge { what: String, limit: usize },
    /// The store refuses requests beyond its provisioned or account rate for now.
    #[error("the store is throttling requests: {0}")]
    Throttled(String),
    /// The store refused the request as malformed, with its own words.
    #[error("the request was not valid: {0}")]
    Invalid(String),
    /// The store could not be reached, or failed on its side.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
}

/// Which items one query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range<'a> {
    /// Items of one partition whose sort key starts with `sk_prefix`, in sort key order.
    Partition { pk: &'a str, sk_prefix: &'a str },
    /// Items of the sparse index under `pk` with `from <= gsi1.sk <= to`, in index order.
    Index {
        pk: &'a str,
        from: &'a str,
        to: &'a str,
    },
}

/// One page of a query: the range, where the previous page ended, how many items at most,
/// and which way it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<'a> {
    pub range: Range<'a>,
    pub after: Option<&'a str>,
    pub limit: usize,
    /// Sort key order backwards, the last key first (DynamoDB's `ScanIndexForward=false`): the
    /// newest items of a partition whose keys grow with time, without reading the older ones.
    /// A partition's only; an index read backwards is refused as invalid.
    pub backward: bool,
}

impl<'a> Query<'a> {
    /// A page of the items of partition `pk` whose sort key starts with `sk_prefix`, in sort
    /// key order, after the previous page's last.
    pub fn partition(
        pk: &'a str,
        sk_prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> Self {
        Self {
            range: Range::Partition { pk, sk_prefix },
            after,
            limit,
            backward: false,
        }
    }

    /// The same page read backwards, the last key first; `after` resumes before the previous
    /// page's last.
    pub fn newest_first(self) -> Self {
        Self {
            backward: true,
            ..self
        }
    }
}

#[async_trait]
pub trait ItemStore: Send + Sync {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError>;

    /// One page of a partition or of the sparse index, in key order.
    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError>;

    /// All writes apply, or none do. At most 100 writes, each on a different item.
    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError>;

    /// Every partition key that starts with `prefix`, in order: a read of the whole store (a
    /// scan on DynamoDB), for an operator's command such as `policy replay`, never on a
    /// request's path. A store that cannot list its partitions says so.
    async fn partitions(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let _ = prefix;
        Err(StoreError::Invalid(
            "this store cannot list its partitions".into(),
        ))
    }

    /// A count that moves once another process (another connection to the same store) has
    /// committed, never for this handle's own commits: a look cheap enough to take many times a
    /// second before a full read. `None` where the store cannot tell cheaply (DynamoDB): a
    /// reader waiting on another process's change reads again on a timer instead.
    fn commits_elsewhere(&self) -> Option<u64> {
        None
    }

    /// The counts this store keeps in its own transactions, if it keeps any: SQLite does, so
    /// every process sharing its file counts into one total. DynamoDB keeps none (a counter
    /// item every approval wrote would cost a write unit each and be one hot key): a function's
    /// store reports each count as a metric line once it commits instead.
    fn counters(&self) -> Option<&dyn Counters> {
        None
    }

    /// [`ItemStore::transact`], and when conditions fail, what each failed write found, so a
    /// caller that lost a race has the winner's item without reading it again. DynamoDB takes
    /// it from the refusal itself (`ReturnValuesOnConditionCheckFailure=ALL_OLD`); a store
    /// that cannot reads each failed write's item after the refusal, as this default does.
    async fn transact_or_found(&self, writes: Vec<Write>) -> Result<(), Refused> {
        let keys = write_keys(&writes);
        let sent = self.transact(writes).await;
        with_found(self, &keys, sent).await
    }
}

/// The item each write is to.
pub fn write_keys(writes: &[Write]) -> Vec<(String, String)> {
    writes
        .iter()
        .map(|w| (w.key().0.to_string(), w.key().1.to_string()))
        .collect()
}

/// A transaction's outcome, and when conditions failed, what each failed write (of the items
/// `keys`) finds now: for a store that cannot say at the refusal itself.
pub async fn with_found<S: ItemStore + ?Sized>(
    store: &S,
    keys: &[(String, String)],
    sent: Result<(), StoreError>,
) -> Result<(), Refused> {
    match sent {
        Ok(()) => Ok(()),
        Err(StoreError::ConditionFailed { failed }) => {
            let mut found = Vec::new();
            for &i in &failed {
                // An item that cannot be read now is left out: the caller reads it itself.
                if let Some((pk, sk)) = keys.get(i)
                    && let Ok(item) = store.get(pk, sk).await
                {
                    found.push((i, item));
                }
            }
            Err(Refused {
                error: StoreError::ConditionFailed { failed },
                found,
            })
        }
        Err(error) => Err(Refused {
            error,
            found: Vec::new(),
        }),
    }
}

impl dyn ItemStore + '_ {
    /// A page of items of one partition whose sort key starts with `sk_prefix`
    /// ([`Query::partition`]; [`Query::newest_first`] reads it the other way).
    pub async fn query(
        &self,
        pk: &str,
        sk_prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.page(Query::partition(pk, sk_prefix, after, limit))
            .await
    }

    /// A page of items of the sparse index under `pk` with `from <= gsi1.sk <= to`.
    pub async fn query_index(
        &self,
        pk: &str,
        from: &str,
        to: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let range = Range::Index { pk, from, to };
        self.page(Query {
            range,
            after,
            limit,
            backward: false,
        })
        .await
    }
}

/// A transaction that did not apply: why, and for writes whose condition failed, the item each
/// found (`None`: there was none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub error: StoreError,
    pub found: Vec<(usize, Option<Item>)>,
}

impl Refused {
    /// What the write at `index` found, if its condition failed and the store said.
    pub fn found(&self, index: usize) -> Option<&Option<Item>> {
        self.found
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, item)| item)
    }
}

/// The most writes one transaction may hold (DynamoDB's TransactWriteItems limit).
pub const MAX_WRITES: usize = 100;

/// Checks what every adapter refuses before it writes anything.
pub fn check_transaction(writes: &[Write]) -> Result<(), StoreError> {
    if writes.is_empty() {
        return Err(StoreError::Invalid(
            "a transaction needs at least one write".into(),
        ));
    }
    if writes.len() > MAX_WRITES {
        return Err(StoreError::Invalid(format!(
            "{} writes, more than {MAX_WRITES}",
            writes.len()
        )));
    }
    let mut total = 0;
    for write in writes {
        if let Write::Put { item, .. } = write {
            let bytes = item.stored_size();
            if bytes > ITEM_LIMIT {
                return Err(StoreError::TooLarge {
                    what: format!("the item {}/{} ({bytes} bytes)", item.pk, item.sk),
                    limit: ITEM_LIMIT,
                });
            }
            total += bytes;
        }
    }
    if total > TRANSACTION_LIMIT {
        return Err(StoreError::TooLarge {
            what: format!("a transaction of {} writes ({total} bytes)", writes.len()),
            limit: TRANSACTION_LIMIT,
        });
    }
    let mut keys: Vec<(&str, &str)> = writes.iter().map(Write::key).collect();
    keys.sort();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(StoreError::Invalid(format!(
            "two writes to the same item {}/{}",
            w[0].0, w[0].1
        )));
    }
    Ok(())
}

/// Reads every page of a partition query.
pub async fn query_all(
    store: &dyn ItemStore,
    pk: &str,
    sk_prefix: &str,
) -> Result<Vec<Item>, StoreError> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.query(pk, sk_prefix, after.as_deref(), 1000).await?;
        items.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(items),
        }
    }
}

/// The first key greater than every key that starts with `prefix`, for range scans.
pub fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}
