//! The conditional item store on DynamoDB: one table (`pk`, `sk`, sparse `gsi1pk`/`gsi1sk`),
//! conditions as ConditionExpressions, a transaction as one TransactWriteItems call, or as one
//! conditional PutItem / DeleteItem when it holds a single write (half the write units).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, Put, ReturnConsumedCapacity, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem,
};

use crate::adapters::emf::Emf;
use crate::domain::ids::TenantId;
use crate::ports::counters::{Count, Counters, Kept};
use crate::ports::store::{
    Condition, ITEM_LIMIT, IndexKey, Item, ItemStore, Page, Query, Range, Refused, StoreError,
    Write, check_transaction,
};

/// The name of the sparse index, as the table definition in template.yaml names it.
pub const INDEX: &str = "gsi1";

type Attributes = HashMap<String, AttributeValue>;

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    consumed_capacity: Option<ReturnConsumedCapacity>,
    /// Where the counts of what commits go, as metric lines; `None` counts nothing.
    metrics: Option<Emf>,
}

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            consumed_capacity: None,
            metrics: None,
        }
    }

    /// Writes a metric line for each count a committed transaction keeps (a function's
    /// stdout, which CloudWatch turns into metrics): no counter item, no extra write unit.
    pub fn emitting(mut self, metrics: Emf) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Asks DynamoDB to return the capacity each request consumed, per table and index
    /// (`ReturnConsumedCapacity=INDEXES`), for an SDK interceptor to read from the responses.
    /// Off by default: the store itself never reads it.
    pub fn reporting_consumed_capacity(mut self) -> Self {
        self.consumed_capacity = Some(ReturnConsumedCapacity::Indexes);
        self
    }
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_string())
}

fn text(attrs: &Attributes, name: &str) -> Result<String, StoreError> {
    match attrs.get(name) {
        Some(AttributeValue::S(value)) => Ok(value.clone()),
        _ => Err(StoreError::Unavailable(format!(
            "an item has no text attribute {name}"
        ))),
    }
}

fn to_attributes(item: &Item) -> Attributes {
    let mut attrs = HashMap::from([
        ("pk".to_string(), s(&item.pk)),
        ("sk".to_string(), s(&item.sk)),
        ("ver".to_string(), AttributeValue::N(item.ver.to_string())),
        ("body".to_string(), s(&item.body)),
    ]);
    if let Some(index) = &item.gsi1 {
        attrs.insert("gsi1pk".into(), s(&index.pk));
        attrs.insert("gsi1sk".into(), s(&index.sk));
    }
    attrs
}

fn from_attributes(attrs: &Attributes) -> Result<Item, StoreError> {
    let ver = match attrs.get("ver") {
        Some(AttributeValue::N(n)) => n
            .parse()
            .map_err(|_| StoreError::Unavailable(format!("ver {n:?} is not a number")))?,
        _ => return Err(StoreError::Unavailable("an item has no ver".into())),
    };
    let gsi1 = match (attrs.get("gsi1pk"), attrs.get("gsi1sk")) {
        (Some(AttributeValue::S(pk)), Some(AttributeValue::S(sk))) => Some(IndexKey {
            pk: pk.clone(),
            sk: sk.clone(),
        }),
        _ => None,
    };
    Ok(Item {
        pk: text(attrs, "pk")?,
        sk: text(attrs, "sk")?,
        gsi1,
        ver,
        body: text(attrs, "body")?,
    })
}

/// A cursor is DynamoDB's LastEvaluatedKey, written as JSON.
fn cursor_of(key: Option<&Attributes>) -> Option<String> {
    let key = key?;
    let map: HashMap<&str, &str> = key
        .iter()
        .filter_map(|(k, v)| match v {
            AttributeValue::S(s) => Some((k.as_str(), s.as_str())),
            _ => None,
        })
        .collect();
    Some(serde_json::to_string(&map).expect("a map of strings serializes"))
}

fn start_key(cursor: Option<&str>) -> Result<Option<Attributes>, StoreError> {
    let Some(cursor) = cursor else {
        return Ok(None);
    };
    let map: HashMap<String, String> = serde_json::from_str(cursor)
        .map_err(|_| StoreError::Invalid(format!("not a cursor of this store: {cursor:?}")))?;
    Ok(Some(
        map.into_iter()
            .map(|(k, v)| (k, AttributeValue::S(v)))
            .collect(),
    ))
}

/// A failed request as a typed store error, by what DynamoDB said: "unavailable" only where it
/// could not be reached or failed on its side.
fn store_error<E, R>(error: SdkError<E, R>) -> StoreError
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    match &error {
        SdkError::ServiceError(context) => {
            let service = context.err();
            let message = service.message().unwrap_or_default();
            refusal(service.code().unwrap_or_default(), message)
                .unwrap_or_else(|| StoreError::Unavailable(DisplayErrorContext(&error).to_string()))
        }
        _ => StoreError::Unavailable(DisplayErrorContext(&error).to_string()),
    }
}

/// What an error code of DynamoDB's (a request's, or a cancelled transaction's reason for one
/// write) means for the engine; `None` for a failure on DynamoDB's side.
fn refusal(code: &str, message: &str) -> Option<StoreError> {
    let with = |what: &str| match message {
        "" => what.to_string(),
        message => format!("{what}: {message}"),
    };
    Some(match code {
        "ValidationException" | "ValidationError" if message.contains("Item size") => {
            StoreError::TooLarge {
                what: with("an item"),
                limit: ITEM_LIMIT,
            }
        }
        "ItemCollectionSizeLimitExceededException" | "ItemCollectionSizeLimitExceeded" => {
            StoreError::TooLarge {
                what: with("a partition's item collection"),
                limit: 10 * 1024 * 1024 * 1024,
            }
        }
        "ValidationException"
        | "ValidationError"
        | "ResourceNotFoundException"
        | "ConditionalCheckFailedException"
        | "SerializationException" => StoreError::Invalid(with(code)),
        "ProvisionedThroughputExceededException"
        | "ProvisionedThroughputExceeded"
        | "ThrottlingException"
        | "ThrottlingError"
        | "RequestLimitExceeded" => StoreError::Throttled(with(code)),
        "TransactionConflictException"
        | "TransactionConflict"
        | "TransactionInProgressException"
        | "ReplicatedWriteConflictException" => StoreError::Contended,
        "AccessDeniedException" | "UnrecognizedClientException" | "MissingAuthenticationToken" => {
            StoreError::Invalid(with("the store refused this process's credentials"))
        }
        _ => return None,
    })
}

/// A write's condition expression, the values it names, and the attribute names it needs
/// (`body` goes through a placeholder, as every attribute name could).
type Expression = (
    Option<String>,
    Option<Attributes>,
    Option<HashMap<String, String>>,
);

fn condition(cond: &Condition) -> Expression {
    let ver = |ver: &u64| (":expected".to_string(), AttributeValue::N(ver.to_string()));
    match cond {
        Condition::Always => (None, None, None),
        Condition::NotExists => (Some("attribute_not_exists(pk)".into()), None, None),
        Condition::VersionIs(expected) => (
            Some("ver = :expected".into()),
            Some(HashMap::from([ver(expected)])),
            None,
        ),
        Condition::Unchanged {
            ver: expected,
            body,
        } => (
            Some("ver = :expected AND #body = :body".into()),
            Some(HashMap::from([
                ver(expected),
                (":body".to_string(), s(body)),
            ])),
            Some(HashMap::from([("#body".to_string(), "body".to_string())])),
        ),
    }
}

/// What a refused single write means: its condition failed (with the item it found, which
/// `ReturnValuesOnConditionCheckFailure=ALL_OLD` returns), or it met a transaction in flight on
/// the same item (`TransactionConflict`), as a one-write transaction would have.
enum SingleRefusal {
    ConditionFailed(Option<Attributes>),
    Conflict,
}

fn single_write_error<E, R>(
    error: SdkError<E, R>,
    refusal: impl FnOnce(&E) -> Option<SingleRefusal>,
) -> Refused
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    let refused = match &error {
        SdkError::ServiceError(context) => refusal(context.err()),
        _ => None,
    };
    let (error, found) = match refused {
        Some(SingleRefusal::ConditionFailed(item)) => (
            StoreError::ConditionFailed { failed: vec![0] },
            found_item(item.as_ref())
                .map(|item| (0, item))
                .into_iter()
                .collect(),
        ),
        Some(SingleRefusal::Conflict) => (StoreError::Contended, Vec::new()),
        None => (store_error(error), Vec::new()),
    };
    Refused { error, found }
}

/// The item a failed condition found: `Some(None)` when there was none, `None` when the answer
/// held an item this store cannot read.
fn found_item(item: Option<&Attributes>) -> Option<Option<Item>> {
    match item {
        None => Some(None),
        Some(attrs) if attrs.is_empty() => Some(None),
        Some(attrs) => from_attributes(attrs).ok().map(Some),
    }
}

/// A write's condition, and the item a refusal returns: the same setters on the four builders
/// (PutItem, DeleteItem, a transaction's Put and Delete), which share no trait.
macro_rules! conditioned {
    ($builder:expr, $condition:expr) => {{
        let (expression, values, names) = condition($condition);
        $builder
            .set_condition_expression(expression)
            .set_expression_attribute_values(values)
            .set_expression_attribute_names(names)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }};
}

/// Sends a PutItem or DeleteItem request as one conditional write, its refusal read from the
/// operation's own error type (`$error`: PutItemError or DeleteItemError).
macro_rules! send_single {
    ($store:expr, $request:expr, $condition:expr, $error:ident) => {
        conditioned!($request, $condition)
            .set_return_consumed_capacity($store.consumed_capacity.clone())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| {
                single_write_error(e, |e| match e {
                    $error::ConditionalCheckFailedException(failed) => {
                        Some(SingleRefusal::ConditionFailed(failed.item().cloned()))
                    }
                    $error::TransactionConflictException(_)
                    | $error::ReplicatedWriteConflictException(_) => Some(SingleRefusal::Conflict),
                    _ => None,
                })
            })
    };
}

impl DynamoStore {
    /// One write alone: a plain conditional PutItem or DeleteItem, atomic on its item and billed
    /// as a standard write (1 WRU per KB) where a transaction bills 2.
    async fn write_one(&self, write: &Write) -> Result<(), Refused> {
        let condition = write.condition();
        match write {
            Write::Put { item, .. } => {
                let put = self
                    .client
                    .put_item()
                    .table_name(&self.table)
                    .set_item(Some(to_attributes(item)));
                send_single!(self, put, condition, PutItemError)
            }
            Write::Delete { pk, sk, .. } => {
                let delete = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .key("pk", s(pk))
                    .key("sk", s(sk));
                send_single!(self, delete, condition, DeleteItemError)
            }
        }
    }

    fn transact_item(&self, write: &Write) -> Result<TransactWriteItem, StoreError> {
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
        let condition = write.condition();
        Ok(match write {
            Write::Put { item, .. } => {
                let put = Put::builder()
                    .table_name(&self.table)
                    .set_item(Some(to_attributes(item)));
                let put = conditioned!(put, condition).build().map_err(invalid)?;
                TransactWriteItem::builder().put(put).build()
            }
            Write::Delete { pk, sk, .. } => {
                let delete = Delete::builder()
                    .table_name(&self.table)
                    .key("pk", s(pk))
                    .key("sk", s(sk));
                let delete = conditioned!(delete, condition).build().map_err(invalid)?;
                TransactWriteItem::builder().delete(delete).build()
            }
        })
    }
}

#[async_trait]
impl ItemStore for DynamoStore {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .consistent_read(true)
            .set_return_consumed_capacity(self.consumed_capacity.clone())
            .send()
            .await
            .map_err(store_error)?;
        output.item().map(from_attributes).transpose()
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        if query.backward && matches!(query.range, Range::Index { .. }) {
            return Err(StoreError::Invalid(
                "only a partition is read backwards, not the index".into(),
            ));
        }
        let request = self
            .client
            .query()
            .table_name(&self.table)
            .scan_index_forward(!query.backward)
            .set_return_consumed_capacity(self.consumed_capacity.clone())
            .limit(query.limit.clamp(1, i32::MAX as usize) as i32)
            .set_exclusive_start_key(start_key(query.after)?);
        // An empty string cannot be a key condition value: an empty prefix or lower bound is
        // left out of the condition.
        let (request, key_condition, values) = match query.range {
            Range::Partition { pk, sk_prefix } => {
                let request = request.consistent_read(true);
                match sk_prefix.is_empty() {
                    true => (request, "pk = :pk", vec![(":pk", pk)]),
                    false => (
                        request,
                        "pk = :pk AND begins_with(sk, :prefix)",
                        vec![(":pk", pk), (":prefix", sk_prefix)],
                    ),
                }
            }
            Range::Index { pk, from, to } => {
                let request = request.index_name(INDEX);
                match from.is_empty() {
                    true => (
                        request,
                        "gsi1pk = :pk AND gsi1sk <= :to",
                        vec![(":pk", pk), (":to", to)],
                    ),
                    false => (
                        request,
                        "gsi1pk = :pk AND gsi1sk BETWEEN :from AND :to",
                        vec![(":pk", pk), (":from", from), (":to", to)],
                    ),
                }
            }
        };
        let request = values.into_iter().fold(
            request.key_condition_expression(key_condition),
            |request, (name, value)| request.expression_attribute_values(name, s(value)),
        );
        let output = request.send().await.map_err(store_error)?;
        let items = output
            .items()
            .iter()
            .map(from_attributes)
            .collect::<Result<_, _>>()?;
        Ok(Page {
            items,
            next: cursor_of(output.last_evaluated_key()),
        })
    }

    async fn partitions(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut partitions = std::collections::BTreeSet::new();
        let mut start = None;
        loop {
            let output = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .projection_expression("pk")
                .filter_expression("begins_with(pk, :prefix)")
                .expression_attribute_values(":prefix", s(prefix))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(store_error)?;
            for item in output.items() {
                if let Some(AttributeValue::S(pk)) = item.get("pk") {
                    partitions.insert(pk.clone());
                }
            }
            match output.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(partitions.into_iter().collect()),
            }
        }
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.transact_or_found(writes).await.map_err(|r| r.error)
    }

    fn counters(&self) -> Option<&dyn Counters> {
        self.metrics.as_ref().map(|_| self as &dyn Counters)
    }

    async fn transact_or_found(&self, writes: Vec<Write>) -> Result<(), Refused> {
        let refused = |error| Refused {
            error,
            found: Vec::new(),
        };
        check_transaction(&writes).map_err(refused)?;
        if let [write] = writes.as_slice() {
            return self.write_one(write).await;
        }
        let items = writes
            .iter()
            .map(|w| self.transact_item(w))
            .collect::<Result<Vec<_>, _>>()
            .map_err(refused)?;
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .set_return_consumed_capacity(self.consumed_capacity.clone())
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(context)) => match context.err() {
                TransactWriteItemsError::TransactionCanceledException(cancelled) => {
                    let reasons = cancelled.cancellation_reasons();
                    let failed: Vec<usize> = reasons
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
                        .map(|(i, _)| i)
                        .collect();
                    if !failed.is_empty() {
                        // Each failed write's reason carries the item it found (ALL_OLD).
                        let found = failed
                            .iter()
                            .filter_map(|&i| found_item(reasons[i].item()).map(|item| (i, item)))
                            .collect();
                        return Err(Refused {
                            error: StoreError::ConditionFailed { failed },
                            found,
                        });
                    }
                    // The first reason that names a cause: each write's is "None" but the
                    // one that cancelled it.
                    let cause = reasons.iter().find_map(|r| {
                        refusal(
                            r.code().unwrap_or_default(),
                            r.message().unwrap_or_default(),
                        )
                    });
                    Err(refused(cause.unwrap_or_else(|| {
                        StoreError::Unavailable(format!(
                            "the transaction was cancelled: {cancelled}"
                        ))
                    })))
                }
                _ => Err(refused(store_error(SdkError::ServiceError(context)))),
            },
            Err(other) => Err(refused(store_error(other))),
        }
    }
}

/// Counts reported as they commit, as metric lines, and never read back: CloudWatch keeps them.
#[async_trait]
impl Counters for DynamoStore {
    async fn transact_counting(&self, writes: Vec<Write>, counts: &[Count]) -> Result<(), Refused> {
        self.transact_or_found(writes).await?;
        if let Some(metrics) = &self.metrics {
            metrics.counted(counts, chrono::Utc::now());
        }
        Ok(())
    }

    async fn count(&self, counts: &[Count]) -> Result<(), StoreError> {
        if let Some(metrics) = &self.metrics {
            metrics.counted(counts, chrono::Utc::now());
        }
        Ok(())
    }

    async fn kept(&self, _tenant: Option<&TenantId>) -> Result<Vec<Kept>, StoreError> {
        Ok(Vec::new())
    }

    fn reads_back(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_dynamodb_can_give_is_typed_by_its_cause() {
        let size = "Item size has exceeded the maximum allowed size";
        for code in ["ValidationException", "ValidationError"] {
            assert!(matches!(
                refusal(code, size),
                Some(StoreError::TooLarge {
                    limit: ITEM_LIMIT,
                    ..
                })
            ));
        }
        assert_eq!(
            refusal(
                "ValidationException",
                "One or more parameter values were invalid"
            ),
            Some(StoreError::Invalid(
                "ValidationException: One or more parameter values were invalid".into()
            ))
        );
        for code in [
            "ProvisionedThroughputExceededException",
            "ThrottlingException",
            "RequestLimitExceeded",
            "ThrottlingError",
        ] {
            assert!(
                matches!(refusal(code, ""), Some(StoreError::Throttled(_))),
                "{code}"
            );
        }
        for code in ["TransactionConflict", "TransactionInProgressException"] {
            assert_eq!(refusal(code, ""), Some(StoreError::Contended), "{code}");
        }
        assert!(matches!(
            refusal("AccessDeniedException", "not authorized"),
            Some(StoreError::Invalid(why)) if why.contains("credentials")
        ));
        // DynamoDB failing on its side is the one case of "unavailable".
        assert_eq!(refusal("InternalServerError", "oops"), None);
        assert_eq!(refusal("None", ""), None);
    }
}
