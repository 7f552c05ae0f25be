//! The embedded item store: one SQLite file (WAL), one table with the same columns as the
//! DynamoDB table, each transaction one `BEGIN IMMEDIATE` SQL transaction.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::state_dir;
use crate::ports::store::{
    Condition, IndexKey, Item, ItemStore, Page, StoreError, Write, check_transaction, prefix_end,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS items (
    pk     TEXT NOT NULL,
    sk     TEXT NOT NULL,
    gsi1pk TEXT,
    gsi1sk TEXT,
    ver    INTEGER NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (pk, sk)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gsi1 ON items (gsi1pk, gsi1sk, pk, sk) WHERE gsi1pk IS NOT NULL;
";

/// The store file's name inside the state directory.
pub const FILE_NAME: &str = "countersign.db";

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens (creating if needed) the store in a state directory, private to its owner: the
    /// directory 0700, the database and its `-wal` and `-shm` files 0600.
    pub fn open_dir(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(FILE_NAME);
        state_dir::prepare(dir)
            .and_then(|()| state_dir::create_private_file(&path))
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot create the state directory {}: {e}",
                    dir.display()
                ))
            })?;
        Self::open(&path)
    }

    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let unavailable =
            |e: rusqlite::Error| StoreError::Unavailable(format!("{}: {e}", path.display()));
        let conn = Connection::open(path).map_err(unavailable)?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(unavailable)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(unavailable)?;
        // Money moves on these commits: every commit reaches the disk before it returns.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(unavailable)?;
        conn.execute_batch(SCHEMA).map_err(unavailable)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn
                .lock()
                .map_err(|_| StoreError::Unavailable("the store's lock was poisoned".into()))?;
            work(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("the store's worker stopped: {e}")))?
    }
}

fn sql_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Contended
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

fn row_to_item(row: &rusqlite::Row<'_>) -> rusqlite::Result<Item> {
    let gsi1pk: Option<String> = row.get(2)?;
    let gsi1sk: Option<String> = row.get(3)?;
    Ok(Item {
        pk: row.get(0)?,
        sk: row.get(1)?,
        gsi1: gsi1pk.zip(gsi1sk).map(|(pk, sk)| IndexKey { pk, sk }),
        ver: row.get::<_, i64>(4)? as u64,
        body: row.get(5)?,
    })
}

/// Index cursors name the last item by its index key and primary key.
fn index_cursor(item: &Item) -> String {
    let gsi = item
        .gsi1
        .as_ref()
        .map(|g| g.sk.as_str())
        .unwrap_or_default();
    serde_json::json!([gsi, item.pk, item.sk]).to_string()
}

/// Partition cursors name the last item by its sort key.
fn read_cursor(cursor: &str) -> Result<String, StoreError> {
    let [sk]: [String; 1] = serde_json::from_str(cursor)
        .map_err(|_| StoreError::Invalid(format!("not a cursor of this store: {cursor:?}")))?;
    Ok(sk)
}

fn read_index_cursor(cursor: &str) -> Result<(String, String, String), StoreError> {
    serde_json::from_str(cursor)
        .map_err(|_| StoreError::Invalid(format!("not a cursor of this store: {cursor:?}")))
}

fn page(mut items: Vec<Item>, limit: usize, cursor: impl Fn(&Item) -> String) -> Page {
    let more = items.len() > limit;
    items.truncate(limit);
    let next = if more { items.last().map(cursor) } else { None };
    Page { items, next }
}

#[async_trait]
impl ItemStore for SqliteStore {
    async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        let (pk, sk) = (pk.to_string(), sk.to_string());
        self.with_conn(move |conn| {
            conn.prepare_cached(
                "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk = ?2",
            )
            .and_then(|mut stmt| stmt.query_row(params![pk, sk], row_to_item).optional())
            .map_err(sql_error)
        })
        .await
    }

    async fn query(
        &self,
        pk: &str,
        sk_prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let after = after.map(read_cursor).transpose()?;
        let exclusive = after.is_some();
        let (pk, from, to) = (
            pk.to_string(),
            after.unwrap_or_else(|| sk_prefix.to_string()),
            prefix_end(sk_prefix),
        );
        let limit = limit.max(1);
        self.with_conn(move |conn| {
            let sql = if exclusive {
                "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk > ?2 AND sk < ?3 ORDER BY sk LIMIT ?4"
            } else {
                "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk >= ?2 AND sk < ?3 ORDER BY sk LIMIT ?4"
            };
            let mut stmt = conn.prepare_cached(sql).map_err(sql_error)?;
            let items = stmt
                .query_map(params![pk, from, to, (limit + 1) as i64], row_to_item)
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(sql_error)?;
            Ok(page(items, limit, |i| serde_json::json!([i.sk]).to_string()))
        })
        .await
    }

    async fn query_index(
        &self,
        pk: &str,
        from: &str,
        to: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let (pk, from, to) = (pk.to_string(), from.to_string(), to.to_string());
        let after = after.map(read_index_cursor).transpose()?;
        let limit = limit.max(1);
        self.with_conn(move |conn| {
            let (a_gsi, a_pk, a_sk) = after.unwrap_or_default();
            let mut stmt = conn
                .prepare_cached(
                    "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items
                     WHERE gsi1pk = ?1 AND gsi1sk >= ?2 AND gsi1sk <= ?3 AND (gsi1sk, pk, sk) > (?4, ?5, ?6)
                     ORDER BY gsi1sk, pk, sk LIMIT ?7",
                )
                .map_err(sql_error)?;
            let items = stmt
                .query_map(params![pk, from, to, a_gsi, a_pk, a_sk, (limit + 1) as i64], row_to_item)
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(sql_error)?;
            Ok(page(items, limit, index_cursor))
        })
        .await
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        check_transaction(&writes)?;
        self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql_error)?;
            let mut failed = Vec::new();
            for (i, write) in writes.iter().enumerate() {
                let (pk, sk) = write.key();
                let current: Option<i64> = tx
                    .prepare_cached("SELECT ver FROM items WHERE pk = ?1 AND sk = ?2")
                    .and_then(|mut stmt| stmt.query_row(params![pk, sk], |r| r.get(0)).optional())
                    .map_err(sql_error)?;
                let holds = match write.condition() {
                    Condition::Always => true,
                    Condition::NotExists => current.is_none(),
                    Condition::VersionIs(v) => current == Some(v as i64),
                };
                if !holds {
                    failed.push(i);
                }
            }
            if !failed.is_empty() {
                return Err(StoreError::ConditionFailed { failed });
            }
            for write in &writes {
                match write {
                    Write::Put { item, .. } => {
                        let (gpk, gsk) = match &item.gsi1 {
                            Some(g) => (Some(g.pk.as_str()), Some(g.sk.as_str())),
                            None => (None, None),
                        };
                        tx.prepare_cached(
                            "INSERT OR REPLACE INTO items (pk, sk, gsi1pk, gsi1sk, ver, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        )
                        .and_then(|mut stmt| stmt.execute(params![item.pk, item.sk, gpk, gsk, item.ver as i64, item.body]))
                        .map_err(sql_error)?;
                    }
                    Write::Delete { pk, sk, .. } => {
                        tx.prepare_cached("DELETE FROM items WHERE pk = ?1 AND sk = ?2")
                            .and_then(|mut stmt| stmt.execute(params![pk, sk]))
                            .map_err(sql_error)?;
                    }
                }
            }
            tx.commit().map_err(sql_error)
        })
        .await
    }
}
