//! One conformance suite for the conditional item store, run against both adapters: the
//! embedded SQLite file and DynamoDB on the local stack (moto over HTTP).

mod support;

use std::sync::Arc;

use shared::adapters::sqlite::SqliteStore;
use shared::ports::store::{
    Condition, ITEM_LIMIT, IndexKey, Item, ItemStore, Query, StoreError, Write, query_all,
};

async fn embedded(name: &str) -> Arc<dyn ItemStore> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!(
        "countersign-conformance-{name}-{}-{nanos}",
        std::process::id()
    ));
    Arc::new(SqliteStore::open_dir(&dir).unwrap())
}

async fn dynamodb(name: &str) -> Arc<dyn ItemStore> {
    support::aws::FreshStack::new(name).await.aws().store
}

fn item(pk: &str, sk: &str, ver: u64, body: &str) -> Item {
    Item {
        pk: pk.into(),
        sk: sk.into(),
        gsi1: None,
        ver,
        body: body.into(),
    }
}

fn indexed(pk: &str, sk: &str, gpk: &str, gsk: &str) -> Item {
    Item {
        gsi1: Some(IndexKey {
            pk: gpk.into(),
            sk: gsk.into(),
        }),
        ..item(pk, sk, 1, "{}")
    }
}

/// Creates one item at version 1 in a transaction of its own: the store's answer.
async fn create_one(
    store: &Arc<dyn ItemStore>,
    pk: &str,
    sk: &str,
    body: &str,
) -> Result<(), StoreError> {
    store.transact(vec![create(item(pk, sk, 1, body))]).await
}

fn create(item: Item) -> Write {
    Write::Put {
        item,
        condition: Condition::NotExists,
    }
}

fn update(item: Item, expected: u64) -> Write {
    Write::Put {
        item,
        condition: Condition::VersionIs(expected),
    }
}

async fn a_created_item_reads_back_whole(store: Arc<dyn ItemStore>) {
    assert_eq!(store.get("P", "a").await.unwrap(), None);
    let written = indexed("P", "a", "IDX", "2026-01-01#a");
    store.transact(vec![create(written.clone())]).await.unwrap();
    assert_eq!(store.get("P", "a").await.unwrap(), Some(written));
}

async fn must_not_exist_refuses_an_existing_item(store: Arc<dyn ItemStore>) {
    create_one(&store, "P", "a", "first").await.unwrap();
    let again = create_one(&store, "P", "a", "second").await;
    assert_eq!(again, Err(StoreError::ConditionFailed { failed: vec![0] }));
    assert_eq!(store.get("P", "a").await.unwrap().unwrap().body, "first");
}

async fn compare_and_set_applies_only_at_the_expected_version(store: Arc<dyn ItemStore>) {
    create_one(&store, "P", "a", "v1").await.unwrap();
    store
        .transact(vec![update(item("P", "a", 2, "v2"), 1)])
        .await
        .unwrap();
    let stale = store
        .transact(vec![update(item("P", "a", 2, "lost"), 1)])
        .await;
    assert_eq!(stale, Err(StoreError::ConditionFailed { failed: vec![0] }));
    let current = store.get("P", "a").await.unwrap().unwrap();
    assert_eq!((current.ver, current.body.as_str()), (2, "v2"));
    let missing = store
        .transact(vec![update(item("P", "nobody", 2, "x"), 1)])
        .await;
    assert_eq!(
        missing,
        Err(StoreError::ConditionFailed { failed: vec![0] }),
        "a version of a missing item never matches"
    );
}

async fn a_failed_transaction_writes_nothing(store: Arc<dyn ItemStore>) {
    create_one(&store, "P", "taken", "x").await.unwrap();
    let writes = vec![
        create(item("P", "new-1", 1, "a")),
        create(item("P", "taken", 1, "b")),
        create(item("Q", "new-2", 1, "c")),
        Write::Delete {
            pk: "P".into(),
            sk: "taken".into(),
            condition: Condition::Always,
        },
    ];
    // The delete targets the same item as write 1: refused before anything is sent.
    assert!(matches!(
        store.transact(writes.clone()).await,
        Err(StoreError::Invalid(_))
    ));
    let result = store.transact(writes[..3].to_vec()).await;
    assert_eq!(result, Err(StoreError::ConditionFailed { failed: vec![1] }));
    assert_eq!(store.get("P", "new-1").await.unwrap(), None);
    assert_eq!(store.get("Q", "new-2").await.unwrap(), None);
    assert_eq!(store.get("P", "taken").await.unwrap().unwrap().body, "x");
}

async fn every_failed_condition_is_named(store: Arc<dyn ItemStore>) {
    store
        .transact(vec![
            create(item("P", "a", 1, "x")),
            create(item("P", "c", 1, "x")),
        ])
        .await
        .unwrap();
    let result = store
        .transact(vec![
            create(item("P", "a", 1, "y")),
            create(item("P", "b", 1, "y")),
            update(item("P", "c", 3, "y"), 2),
        ])
        .await;
    assert_eq!(
        result,
        Err(StoreError::ConditionFailed { failed: vec![0, 2] })
    );
}

async fn deletes_take_conditions_too(store: Arc<dyn ItemStore>) {
    create_one(&store, "P", "a", "x").await.unwrap();
    let stale = store
        .transact(vec![Write::Delete {
            pk: "P".into(),
            sk: "a".into(),
            condition: Condition::VersionIs(9),
        }])
        .await;
    assert_eq!(stale, Err(StoreError::ConditionFailed { failed: vec![0] }));
    store
        .transact(vec![Write::Delete {
            pk: "P".into(),
            sk: "a".into(),
            condition: Condition::VersionIs(1),
        }])
        .await
        .unwrap();
    assert_eq!(store.get("P", "a").await.unwrap(), None);
    let absent = Write::Delete {
        pk: "P".into(),
        sk: "a".into(),
        condition: Condition::Always,
    };
    store.transact(vec![absent]).await.unwrap();
}

async fn a_one_write_transaction_keeps_every_condition(store: Arc<dyn ItemStore>) {
    // One write alone may go out as a plain conditional write: the same conditions hold, and a
    // refusal names write 0 and changes nothing.
    let first = indexed("P", "one", "IDX", "2026-01-01#one");
    store.transact(vec![create(first.clone())]).await.unwrap();
    assert_eq!(
        create_one(&store, "P", "one", "again").await,
        Err(StoreError::ConditionFailed { failed: vec![0] })
    );
    assert_eq!(
        store
            .transact(vec![update(item("P", "one", 3, "stale"), 2)])
            .await,
        Err(StoreError::ConditionFailed { failed: vec![0] })
    );
    assert_eq!(store.get("P", "one").await.unwrap(), Some(first));
    store
        .transact(vec![update(
            item("P", "one", 2, "moved out of the index"),
            1,
        )])
        .await
        .unwrap();
    assert!(
        store
            .query_index("IDX", "", "2026-12-31", None, 10)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let delete = |condition| Write::Delete {
        pk: "P".into(),
        sk: "one".into(),
        condition,
    };
    assert_eq!(
        store.transact(vec![delete(Condition::VersionIs(1))]).await,
        Err(StoreError::ConditionFailed { failed: vec![0] })
    );
    assert_eq!(
        store.transact(vec![delete(Condition::NotExists)]).await,
        Err(StoreError::ConditionFailed { failed: vec![0] }),
        "a delete that must not find its item is refused when it does"
    );
    assert!(store.get("P", "one").await.unwrap().is_some());
    store
        .transact(vec![delete(Condition::VersionIs(2))])
        .await
        .unwrap();
    assert_eq!(store.get("P", "one").await.unwrap(), None);
    assert_eq!(
        store.transact(vec![delete(Condition::VersionIs(2))]).await,
        Err(StoreError::ConditionFailed { failed: vec![0] }),
        "a version of a deleted item never matches"
    );
    store
        .transact(vec![Write::Put {
            item: item("P", "one", 7, "blind"),
            condition: Condition::Always,
        }])
        .await
        .unwrap();
    assert_eq!(store.get("P", "one").await.unwrap().unwrap().ver, 7);
}

async fn a_query_returns_one_partition_by_prefix_in_key_order(store: Arc<dyn ItemStore>) {
    let writes = ["AUDIT#2", "ACTION#b", "RUN", "ACTION#a", "AUDIT#1"]
        .iter()
        .map(|sk| create(item("RUN#1", sk, 1, sk)))
        .collect();
    store.transact(writes).await.unwrap();
    create_one(&store, "RUN#2", "ACTION#z", "other run")
        .await
        .unwrap();
    // The sort keys of partition `pk` that start with `prefix`, as the query returns them.
    let sort_keys = |pk: &'static str, prefix: &'static str| {
        let store = store.clone();
        async move {
            let items = query_all(store.as_ref(), pk, prefix).await.unwrap();
            items.into_iter().map(|i| i.sk).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        sort_keys("RUN#1", "ACTION#").await,
        ["ACTION#a", "ACTION#b"]
    );
    assert_eq!(
        sort_keys("RUN#1", "").await,
        ["ACTION#a", "ACTION#b", "AUDIT#1", "AUDIT#2", "RUN"]
    );
    assert!(sort_keys("RUN#3", "").await.is_empty());
}

async fn partitions_are_listed_by_prefix_once_each_in_order(store: Arc<dyn ItemStore>) {
    let writes = [
        ("T#a#RUN#2", "RUN"),
        ("T#a#RUN#1", "RUN"),
        ("T#a#RUN#1", "ACTION#x"),
    ]
    .iter()
    .map(|(pk, sk)| create(item(pk, sk, 1, "{}")))
    .collect();
    store.transact(writes).await.unwrap();
    create_one(&store, "T#b#RUN#1", "RUN", "another tenant")
        .await
        .unwrap();

    assert_eq!(
        store.partitions("T#a#RUN#").await.unwrap(),
        ["T#a#RUN#1", "T#a#RUN#2"]
    );
    assert_eq!(store.partitions("T#b#").await.unwrap(), ["T#b#RUN#1"]);
    assert!(store.partitions("T#c#").await.unwrap().is_empty());
}

async fn pages_resume_where_the_last_one_ended(store: Arc<dyn ItemStore>) {
    let writes = (0..7)
        .map(|n| create(item("P", &format!("K#{n}"), 1, "x")))
        .collect();
    store.transact(writes).await.unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store.query("P", "K#", after.as_deref(), 3).await.unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.into_iter().map(|i| i.sk));
        pages += 1;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, (0..7).map(|n| format!("K#{n}")).collect::<Vec<_>>());
    assert!(pages >= 3);
}

async fn a_partition_reads_backwards_the_last_key_first_a_page_at_a_time(
    store: Arc<dyn ItemStore>,
) {
    let writes = (0..7)
        .map(|n| create(item("P", &format!("K#{n:02}"), 1, "x")))
        .chain(["A#1", "L#1"].map(|sk| create(item("P", sk, 1, "other prefix"))))
        .collect();
    store.transact(writes).await.unwrap();
    create_one(&store, "Q", "K#99", "other partition")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .page(Query::partition("P", "K#", after.as_deref(), 3).newest_first())
            .await
            .unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.into_iter().map(|i| i.sk));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let newest_first: Vec<String> = (0..7).rev().map(|n| format!("K#{n:02}")).collect();
    assert_eq!(seen, newest_first);
    // One page of one item reads the newest alone.
    let newest = store
        .page(Query::partition("P", "K#", None, 1).newest_first())
        .await
        .unwrap();
    assert_eq!(newest.items[0].sk, "K#06");
    assert!(newest.next.is_some());
    assert!(
        store
            .page(Query::partition("R", "K#", None, 5).newest_first())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // The index is read forwards only: backwards is refused, not read wrongly.
    let index = store
        .page(Query {
            range: shared::ports::store::Range::Index {
                pk: "IDX",
                from: "",
                to: "z",
            },
            after: None,
            limit: 5,
            backward: true,
        })
        .await;
    assert!(matches!(index, Err(StoreError::Invalid(_))), "{index:?}");
}

async fn a_query_reads_past_one_megabyte_pages(store: Arc<dyn ItemStore>) {
    // 30 items of 60 KB: 1.8 MB, more than one DynamoDB response holds.
    let body = format!("\"{}\"", "x".repeat(60_000));
    for chunk in (0..30).collect::<Vec<_>>().chunks(10) {
        let writes = chunk
            .iter()
            .map(|n| create(item("BIG", &format!("K#{n:02}"), 1, &body)))
            .collect();
        store.transact(writes).await.unwrap();
    }
    let first = store.query("BIG", "K#", None, 1000).await.unwrap();
    assert!(first.next.is_some() || first.items.len() == 30);
    let all = query_all(store.as_ref(), "BIG", "K#").await.unwrap();
    assert_eq!(all.len(), 30);
    assert!(all.windows(2).all(|w| w[0].sk < w[1].sk));
    assert!(all.iter().all(|i| i.body.len() == body.len()));
}

async fn the_index_is_sparse_and_read_by_range(store: Arc<dyn ItemStore>) {
    let writes = vec![
        create(indexed("A", "1", "DUE", "2026-01-01T00:00:00.000Z#a")),
        create(indexed("B", "1", "DUE", "2026-01-03T00:00:00.000Z#b")),
        create(indexed("C", "1", "DUE", "2026-01-02T00:00:00.000Z#c")),
        create(indexed("D", "1", "OTHER", "2026-01-01T00:00:00.000Z#d")),
        create(item("E", "1", 1, "not indexed")),
    ];
    store.transact(writes).await.unwrap();
    // The partition keys of the DUE index between two keys, in index order.
    let due = |from: &'static str, to: &'static str| {
        let store = store.clone();
        async move {
            let page = store.query_index("DUE", from, to, None, 100).await.unwrap();
            page.items.into_iter().map(|i| i.pk).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        due("", "2026-01-02T23:59:59.999Z#\u{10FFFF}").await,
        ["A", "C"],
        "in index order, up to the bound"
    );
    assert_eq!(due("2026-01-02", "2026-12-31").await, ["C", "B"]);

    // Writing the item without its index key takes it out of the index.
    store
        .transact(vec![update(item("A", "1", 2, "resolved"), 1)])
        .await
        .unwrap();
    assert_eq!(due("", "2026-12-31").await, ["C", "B"]);
}

async fn index_pages_resume_too(store: Arc<dyn ItemStore>) {
    let writes = (0..5)
        .map(|n| {
            create(indexed(
                &format!("P{n}"),
                "1",
                "DUE",
                &format!("2026-01-0{}#x", n + 1),
            ))
        })
        .collect();
    store.transact(writes).await.unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .query_index("DUE", "", "2026-12-31", after.as_deref(), 2)
            .await
            .unwrap();
        seen.extend(page.items.into_iter().map(|i| i.pk));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["P0", "P1", "P2", "P3", "P4"]);
}

async fn malformed_transactions_are_refused_before_writing(store: Arc<dyn ItemStore>) {
    assert!(matches!(
        store.transact(vec![]).await,
        Err(StoreError::Invalid(_))
    ));
    let too_many = (0..101)
        .map(|n| create(item("P", &format!("{n}"), 1, "x")))
        .collect();
    assert!(matches!(
        store.transact(too_many).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(store.get("P", "0").await.unwrap().is_none());
    let hundred = (0..100)
        .map(|n| create(item("P", &format!("{n:03}"), 1, "x")))
        .collect();
    store.transact(hundred).await.unwrap();
    assert_eq!(query_all(store.as_ref(), "P", "").await.unwrap().len(), 100);
    assert!(matches!(
        store.query("P", "", Some("not a cursor"), 10).await,
        Err(StoreError::Invalid(_))
    ));
}

async fn a_refusal_says_what_each_failed_write_found(store: Arc<dyn ItemStore>) {
    let winner = indexed("P", "a", "IDX", "2026-01-01#a");
    store.transact(vec![create(winner.clone())]).await.unwrap();
    create_one(&store, "P", "b", "b").await.unwrap();

    // Alone (a plain conditional write on DynamoDB): the item the lost race left.
    let lost = store
        .transact_or_found(vec![update(item("P", "a", 3, "lost"), 2)])
        .await
        .unwrap_err();
    assert_eq!(lost.error, StoreError::ConditionFailed { failed: vec![0] });
    assert_eq!(lost.found(0), Some(&Some(winner.clone())));

    // In a transaction: each failed write's item, none for the one that held; a version of a
    // missing item found nothing.
    let refused = store
        .transact_or_found(vec![
            create(item("P", "a", 1, "again")),
            update(item("P", "b", 2, "b2"), 1),
            update(item("P", "gone", 2, "x"), 1),
        ])
        .await
        .unwrap_err();
    assert_eq!(
        refused.error,
        StoreError::ConditionFailed { failed: vec![0, 2] }
    );
    assert_eq!(refused.found(0), Some(&Some(winner)));
    assert_eq!(refused.found(1), None, "its condition held");
    assert_eq!(refused.found(2), Some(&None));
    assert_eq!(
        store.get("P", "b").await.unwrap().unwrap().ver,
        1,
        "nothing written"
    );

    // A transaction that applies is the same as transact's.
    store
        .transact_or_found(vec![update(item("P", "b", 2, "b2"), 1)])
        .await
        .unwrap();
    assert_eq!(store.get("P", "b").await.unwrap().unwrap().ver, 2);
}

/// What a one-write transaction refused on its condition found.
async fn refused_alone(store: &Arc<dyn ItemStore>, write: Write) -> Option<Item> {
    let refused = store.transact_or_found(vec![write]).await.unwrap_err();
    assert_eq!(
        refused.error,
        StoreError::ConditionFailed { failed: vec![0] }
    );
    refused
        .found(0)
        .cloned()
        .expect("the refusal says what it found")
}

fn unchanged(item: Item, ver: u64, body: &str) -> Write {
    Write::Put {
        item,
        condition: Condition::Unchanged {
            ver,
            body: body.into(),
        },
    }
}

async fn unchanged_holds_only_on_the_same_version_and_body(store: Arc<dyn ItemStore>) {
    let shown = r#"{"status":"awaiting_approval","requested_by":"ann"}"#;
    create_one(&store, "P", "a", shown).await.unwrap();

    // The body differs at the same version (a forged or edited copy): refused, with what is
    // stored, in a transaction and alone.
    let forged = r#"{"status":"awaiting_approval"}"#;
    let refused = store
        .transact_or_found(vec![
            unchanged(item("P", "a", 2, "decided"), 1, forged),
            create(item("P", "other", 1, "{}")),
        ])
        .await
        .unwrap_err();
    assert_eq!(
        refused.error,
        StoreError::ConditionFailed { failed: vec![0] }
    );
    assert_eq!(refused.found(0), Some(&Some(item("P", "a", 1, shown))));
    assert_eq!(
        store.get("P", "other").await.unwrap(),
        None,
        "nothing written"
    );
    let stored = Some(item("P", "a", 1, shown));
    let alone = unchanged(item("P", "a", 2, "decided"), 1, forged);
    assert_eq!(refused_alone(&store, alone).await, stored);

    // The same body at another version: refused.
    let other_version = unchanged(item("P", "a", 3, "decided"), 2, shown);
    assert_eq!(refused_alone(&store, other_version).await, stored);

    // An item that is not there is not unchanged.
    let missing = unchanged(item("P", "gone", 2, "x"), 1, shown);
    assert_eq!(refused_alone(&store, missing).await, None);

    // Exactly as stored: it holds, alone and in a transaction.
    store
        .transact(vec![unchanged(item("P", "a", 2, "decided"), 1, shown)])
        .await
        .unwrap();
    assert_eq!(
        store.get("P", "a").await.unwrap(),
        Some(item("P", "a", 2, "decided"))
    );
    store
        .transact(vec![
            unchanged(item("P", "a", 3, "again"), 2, "decided"),
            create(item("P", "other", 1, "{}")),
        ])
        .await
        .unwrap();
    assert_eq!(store.get("P", "a").await.unwrap().unwrap().ver, 3);
}

/// An indexed item whose size, as both stores count it, is exactly `size`.
fn sized(sk: &str, size: usize) -> Item {
    let mut item = Item {
        body: String::new(),
        ..indexed("LIMIT", sk, "IDX", "2026-01-01#limit")
    };
    let body = size - item.stored_size();
    item.body = format!(
        "\"{}\"",
        "é".repeat((body - 2) / 2) + &"x".repeat((body - 2) % 2)
    );
    assert_eq!(item.stored_size(), size);
    item
}

async fn an_item_at_the_limit_is_kept_and_one_byte_more_is_refused_with_nothing_written(
    store: Arc<dyn ItemStore>,
) {
    let at_limit = sized("at", ITEM_LIMIT);
    store
        .transact(vec![create(at_limit.clone())])
        .await
        .unwrap();
    assert_eq!(store.get("LIMIT", "at").await.unwrap(), Some(at_limit));

    let past = sized("past", ITEM_LIMIT + 1);
    for writes in [
        vec![create(past.clone())],
        vec![
            create(item("LIMIT", "beside", 1, "{}")),
            create(past.clone()),
        ],
    ] {
        let refused = store.transact(writes).await.unwrap_err();
        let StoreError::TooLarge { what, limit } = &refused else {
            panic!("{refused:?}")
        };
        assert_eq!(*limit, ITEM_LIMIT);
        assert!(
            what.contains("LIMIT/past") && what.contains("400001 bytes"),
            "{what}"
        );
        assert_eq!(store.get("LIMIT", "past").await.unwrap(), None);
        assert_eq!(store.get("LIMIT", "beside").await.unwrap(), None);
    }
}

/// DynamoDB itself takes an item the stores count as at the limit, so what passes the stores'
/// one measure is never refused by DynamoDB; one well past its own limit it refuses.
#[tokio::test]
async fn dynamodb_takes_an_item_at_the_limit_as_counted_and_refuses_one_past_its_own() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let stack = support::aws::FreshStack::new("item-limit").await;
    let client = aws_sdk_dynamodb::Client::new(&stack.config);
    let put = |item: Item| {
        let s = |v: &str| AttributeValue::S(v.to_string());
        let index = item.gsi1.clone().unwrap();
        client
            .put_item()
            .table_name(&stack.settings.table)
            .item("pk", s(&item.pk))
            .item("sk", s(&item.sk))
            .item("ver", AttributeValue::N(item.ver.to_string()))
            .item("body", s(&item.body))
            .item("gsi1pk", s(&index.pk))
            .item("gsi1sk", s(&index.sk))
            .send()
    };
    put(sized("at", ITEM_LIMIT))
        .await
        .expect("DynamoDB keeps it");
    let refused = put(sized("past", 410 * 1024))
        .await
        .expect_err("DynamoDB refuses it");
    let refused = aws_sdk_dynamodb::error::DisplayErrorContext(&refused).to_string();
    assert!(refused.contains("Item size has exceeded"), "{refused}");
}

macro_rules! conformance {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::$backend(stringify!($test)).await).await;
                }
            )*
        }
    };
}

macro_rules! both {
    ($($test:ident),* $(,)?) => {
        conformance!(embedded: $($test),*);
        conformance!(dynamodb: $($test),*);
    };
}

both!(
    a_created_item_reads_back_whole,
    must_not_exist_refuses_an_existing_item,
    compare_and_set_applies_only_at_the_expected_version,
    a_failed_transaction_writes_nothing,
    every_failed_condition_is_named,
    deletes_take_conditions_too,
    a_one_write_transaction_keeps_every_condition,
    a_query_returns_one_partition_by_prefix_in_key_order,
    partitions_are_listed_by_prefix_once_each_in_order,
    pages_resume_where_the_last_one_ended,
    a_partition_reads_backwards_the_last_key_first_a_page_at_a_time,
    a_query_reads_past_one_megabyte_pages,
    the_index_is_sparse_and_read_by_range,
    index_pages_resume_too,
    malformed_transactions_are_refused_before_writing,
    a_refusal_says_what_each_failed_write_found,
    unchanged_holds_only_on_the_same_version_and_body,
    an_item_at_the_limit_is_kept_and_one_byte_more_is_refused_with_nothing_written,
);
