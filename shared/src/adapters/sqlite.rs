//! The embedded item store: one SQLite file (WAL), one table with the same columns as the
//! DynamoDB table.
//!
//! One write connection commits every transaction, each reaching the disk (one fsync,
//! `synchronous=FULL`) before it is answered:
//! - A transaction that finds the connection free and nobody waiting commits on its caller's
//!   thread, with no hand-off: on a worker of tokio's multi-thread runtime, inside
//!   `block_in_place`, which hands the worker's other tasks to another thread for the fsync.
//! - Otherwise it waits for the writer thread, which commits the transactions waiting when it is
//!   free in groups: applied in one `BEGIN IMMEDIATE` SQL transaction, each inside a savepoint
//!   of its own so that it checks its own conditions against what the ones before it wrote and
//!   fails alone, the group reaching the disk with one commit before any of them is answered.
//!
//! Reads run on the caller's thread: on the write connection when it is free, whose page cache
//! holds what it last wrote; otherwise on a pool of other connections, which WAL lets read
//! beside a commit.
//!
//! The WAL is copied back into the database file (checkpointed) by a thread of its own, on a
//! connection of its own, beside the commits: a checkpoint on the write connection held every
//! transaction behind it while it copied a thousand pages and synced the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::hooks::Wal;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::oneshot;

use super::sqlite_vfs::{self, WalWrites};
use super::state_dir;
use crate::domain::ids::{AgentName, TenantId};
use crate::ports::counters::{Count, Counters, Kept, Series};
use crate::ports::store::{
    Condition, IndexKey, Item, ItemStore, Page, Query, Range, Refused, StoreError, Write,
    check_transaction, prefix_end, with_found, write_keys,
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
CREATE TABLE IF NOT EXISTS counts (
    tenant  TEXT NOT NULL,
    agent   TEXT NOT NULL,
    name    TEXT NOT NULL,
    label   TEXT NOT NULL,
    n       INTEGER NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (tenant, agent, name, label)
) WITHOUT ROWID;
";

/// The store file's name inside the state directory.
pub const FILE_NAME: &str = "countersign.db";

/// The most transactions one group commit applies.
const MAX_GROUP: usize = 64;
/// Prepared statements kept per connection: more than the store has.
const STATEMENTS: usize = 32;
/// Idle read connections kept open for the next reads.
const MAX_IDLE_READERS: usize = 16;
/// How long a connection waits for another process's lock before the store reports contention.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// WAL pages past which the checkpointer copies the log back into the database file (SQLite's
/// own default for the checkpoint a commit runs itself).
const CHECKPOINT_PAGES: i32 = 1000;
/// WAL pages past which a commit checkpoints itself without waiting for the checkpointer.
const CHECKPOINT_IN_PLACE_PAGES: i32 = 2 * CHECKPOINT_PAGES;

#[derive(Clone)]
pub struct SqliteStore {
    writer: mpsc::Sender<Pending>,
    write: Arc<WriteSide>,
    readers: Arc<Readers>,
    commits: Arc<Commits>,
}

/// The one write connection, and how many transactions wait for the writer thread.
struct WriteSide {
    conn: Mutex<Connection>,
    waiting: AtomicUsize,
    /// The connection's `PRAGMA data_version` when last read ([`SqliteStore::commits_elsewhere`]).
    data_version: AtomicU64,
}

// A commit that panicked left no SQL transaction open that the next `BEGIN` minds: a poisoned
// lock is taken as any other.
impl WriteSide {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The connection, if nobody holds it and no transaction waits for the writer thread
    /// (which a transaction or read taken here would hold up).
    fn free(&self) -> Option<MutexGuard<'_, Connection>> {
        if self.waiting.load(Ordering::Acquire) > 0 {
            return None;
        }
        match self.conn.try_lock() {
            Ok(conn) => Some(conn),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// How many SQL commits (each one fsync) the store made, for how many transactions, how many
/// of those commits their caller's thread made, and the checkpoints made beside them.
#[derive(Debug, Default)]
pub struct Commits {
    groups: AtomicU64,
    transactions: AtomicU64,
    in_place: AtomicU64,
    checkpoints: AtomicU64,
    finished_in_place: AtomicU64,
}

impl Commits {
    /// (SQL commits, transactions they held) since the store was opened.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.groups.load(Ordering::Relaxed),
            self.transactions.load(Ordering::Relaxed),
        )
    }

    /// The commits their caller's thread made, with no hand-off, since the store was opened.
    pub fn in_place(&self) -> u64 {
        self.in_place.load(Ordering::Relaxed)
    }

    /// The checkpoints the checkpointer thread made, beside the commits, since the store was
    /// opened.
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    /// The checkpoints a commit made (finishing the checkpointer's) since the store was opened.
    pub fn checkpoints_in_place(&self) -> u64 {
        self.finished_in_place.load(Ordering::Relaxed)
    }

    fn count(&self, transactions: usize) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.transactions
            .fetch_add(transactions as u64, Ordering::Relaxed);
    }
}

/// A transaction waiting for the writer, and where its outcome goes.
struct Pending {
    writes: Vec<Write>,
    /// Counts added in the same transaction ([`Counters`]).
    counts: Vec<Count>,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// Read connections, opened when needed and kept for reuse.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
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
        let mut conn = connect(path).map_err(unavailable)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(unavailable)?;
        // A savepoint's undo records are needed only until its group commits: memory will do.
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(unavailable)?;
        conn.execute_batch(SCHEMA).map_err(unavailable)?;
        let commits = Arc::new(Commits::default());
        let mut checkpoints = Checkpoints {
            checkpointer: checkpointer(path, commits.clone()),
            commits: commits.clone(),
            asked: None,
        };
        // In place of the checkpoint a commit runs itself past 1,000 pages of log (the hook
        // replaces it).
        conn.wal_hook(Some(move |wal: &mut Wal, pages| {
            checkpoints.after_commit(wal, pages);
            // The commit stands whatever a checkpoint did: an error here would report it failed.
            Ok(())
        }))
        .map_err(unavailable)?;
        let (writer, queue) = mpsc::channel();
        let write = Arc::new(WriteSide {
            conn: Mutex::new(conn),
            waiting: AtomicUsize::new(0),
            data_version: AtomicU64::new(0),
        });
        let (counted, side) = (commits.clone(), write.clone());
        std::thread::Builder::new()
            .name("countersign-store-writer".into())
            .spawn(move || write_groups(&side, queue, &counted))
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the store's writer: {e}"))
            })?;
        Ok(Self {
            writer,
            write,
            commits,
            readers: Arc::new(Readers {
                path: path.to_path_buf(),
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    /// What the writer has committed so far: how well transactions share a commit.
    pub fn commits(&self) -> &Commits {
        &self.commits
    }

    /// The writes the write connection's WAL file was asked for and those it made
    /// ([`sqlite_vfs`]); `None` before the store's first commit.
    pub fn wal_writes(&self) -> Option<WalWrites> {
        sqlite_vfs::wal_writes(&self.write.lock())
    }

    /// Commits a transaction on the caller's thread when the write connection is free and no
    /// transaction waits for the writer thread; `None` (nothing done) otherwise. Only on tokio's
    /// multi-thread runtime, inside `block_in_place`: a worker held for an fsync would hold up
    /// every task queued on it (the MCP gateway's p50 doubled when commits simply ran there),
    /// and `block_in_place` hands them to another thread first. A current-thread runtime has
    /// no other thread to hand them to, so its transactions go to the writer thread.
    fn commit_in_place(
        &self,
        writes: &[Write],
        counts: &[Count],
    ) -> Option<Result<(), StoreError>> {
        let multi_thread = Handle::try_current()
            .is_ok_and(|runtime| runtime.runtime_flavor() == RuntimeFlavor::MultiThread);
        if !multi_thread {
            return None;
        }
        let mut conn = self.write.free()?;
        let outcome = tokio::task::block_in_place(|| {
            commit_group(&mut conn, std::iter::once((writes, counts)))
                .pop()
                .expect("one outcome per transaction")
        });
        drop(conn);
        self.commits.count(1);
        self.commits.in_place.fetch_add(1, Ordering::Relaxed);
        Some(outcome)
    }

    /// Runs a read on the caller's thread: a read of the page cache takes microseconds, a
    /// hand-off to a blocking thread and back about as many again. On the write connection when
    /// it is free and no transaction waits for it: its page cache holds what its last commits
    /// wrote, where a read connection's cache is dropped at every commit and read again from
    /// the file (`pread`). Otherwise on a connection of the pool, which WAL lets read beside a
    /// commit.
    fn read<T>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(conn) = self.write.free() {
            return work(&conn);
        }
        let conn = self.readers.take()?;
        let result = work(&conn);
        self.readers.give_back(conn);
        result
    }
}

/// A connection as every one of the store's is set up.
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    // A commit's WAL frames go to the file in one write (`sqlite_vfs`), which needs the
    // `synchronous=FULL` set below.
    let conn = match sqlite_vfs::name() {
        Some(vfs) => Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs)?,
        None => Connection::open(path)?,
    };
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Money moves on these commits: every commit reaches the disk before it returns.
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Room for every statement the store prepares, the writes' and the reads' (the write
    // connection runs both).
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    // The query plans stay those of the statements' first preparation. Without this, SQLite
    // (built with STAT4, as rusqlite bundles it) marks the parameters of range and LIMIT terms as
    // able to change a plan and prepares the statement again whenever one is bound: every page
    // read paid a parse and a plan. The store's queries have one sensible plan each.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(conn)
}

impl Readers {
    fn take(&self) -> Result<Connection, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        match idle {
            Some(conn) => Ok(conn),
            None => connect(&self.path)
                .map_err(|e| StoreError::Unavailable(format!("{}: {e}", self.path.display()))),
        }
    }

    fn give_back(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE_READERS
        {
            idle.push(conn);
        }
    }
}

/// Starts the checkpointer thread, on a connection of its own: each message asks it for a
/// `PASSIVE` checkpoint, which copies the log's committed pages into the database file and
/// syncs it without waiting for the commits or the reads going on. It ends when the write
/// connection, which holds the sender, is closed. The sender, or `None` if the thread could not
/// start (commits then checkpoint in place).
fn checkpointer(path: &Path, commits: Arc<Commits>) -> Option<mpsc::SyncSender<()>> {
    let conn = connect(path)
        .inspect_err(|e| tracing::warn!(error = %e, "the store's checkpointer has no connection"))
        .ok()?;
    let (due, asked) = mpsc::sync_channel(1);
    let run = move || {
        while asked.recv().is_ok() {
            // Its first column says whether another checkpoint (a commit finishing one) was
            // at it.
            match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                row.get::<_, i64>(0)
            }) {
                Ok(0) => {
                    commits.checkpoints.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_busy) => {}
                Err(e) => tracing::warn!(error = %e, "a checkpoint of the store failed"),
            }
        }
    };
    std::thread::Builder::new()
        .name("countersign-store-checkpointer".into())
        .spawn(run)
        .inspect_err(|e| tracing::warn!(error = %e, "the store's checkpointer did not start"))
        .ok()?;
    Some(due)
}

/// When the log is checkpointed, seen from the commits. The checkpointer copies what was
/// committed when it began; commits that go on meanwhile would leave the log never wholly
/// copied, so never started over, and growing. So once the checkpointer is done, the next
/// commit copies what it left (little, while it holds off the commits after it), and the log
/// starts over at the commit after.
struct Checkpoints {
    /// Asks the checkpointer thread for a checkpoint; `None` if it could not start.
    checkpointer: Option<mpsc::SyncSender<()>>,
    /// Counts the checkpoints it finished.
    commits: Arc<Commits>,
    /// Its count of finished checkpoints when it was last asked, until the log starts over.
    asked: Option<u64>,
}

impl Checkpoints {
    /// After each commit, with the log's length in pages: past [`CHECKPOINT_PAGES`] the
    /// checkpointer is asked, once; when it is done, or past [`CHECKPOINT_IN_PLACE_PAGES`], or
    /// with no checkpointer, the commit checkpoints itself.
    fn after_commit(&mut self, wal: &mut Wal, pages: i32) {
        if pages < CHECKPOINT_PAGES {
            // The log started over.
            self.asked = None;
            return;
        }
        let finished = self.commits.checkpoints();
        let in_place = match (self.asked, &self.checkpointer) {
            (Some(asked), _) => finished > asked || pages >= CHECKPOINT_IN_PLACE_PAGES,
            (None, Some(due)) => match due.try_send(()) {
                // Asked now, or busy with an earlier request that covers this one.
                Ok(()) | Err(TrySendError::Full(())) => {
                    self.asked = Some(finished);
                    false
                }
                Err(TrySendError::Disconnected(())) => true,
            },
            (None, None) => true,
        };
        if !in_place {
            return;
        }
        match wal.checkpoint() {
            // The checkpointer is asked again if the log does not start over.
            Ok(()) => {
                self.commits
                    .finished_in_place
                    .fetch_add(1, Ordering::Relaxed);
                self.asked = None;
            }
            // The checkpointer is at it: the next commit tries again.
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
            Err(e) => tracing::warn!(error = %e, "a checkpoint of the store failed"),
        }
    }
}

/// The writer thread: once a transaction waits, takes the write connection (after a commit in
/// place, if one holds it) and every transaction waiting by then, commits them as one group,
/// answers each, and waits for the next. It ends when the last handle on the store is dropped.
fn write_groups(write: &WriteSide, queue: mpsc::Receiver<Pending>, commits: &Commits) {
    while let Ok(first) = queue.recv() {
        let mut conn = write.lock();
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        write.waiting.fetch_sub(group.len(), Ordering::AcqRel);
        let transactions = group
            .iter()
            .map(|p| (p.writes.as_slice(), p.counts.as_slice()));
        let outcomes = commit_group(&mut conn, transactions);
        drop(conn);
        commits.count(group.len());
        for (pending, outcome) in group.into_iter().zip(outcomes) {
            // The caller may have gone (its task was cancelled); the outcome stands either way.
            let _ = pending.done.send(outcome);
        }
    }
}

/// Applies each transaction of a group in a savepoint of its own, then commits those that held
/// in one SQL transaction. A transaction whose condition fails, or whose statements fail, is
/// rolled back to its savepoint alone; if the commit fails, none of them was written.
///
/// The transaction and savepoint statements are prepared once per connection and kept, as the
/// writes' are: parsing `BEGIN IMMEDIATE` and `COMMIT` again at every commit was CPU for nothing.
fn commit_group<'a>(
    conn: &mut Connection,
    group: impl ExactSizeIterator<Item = (&'a [Write], &'a [Count])>,
) -> Vec<Result<(), StoreError>> {
    let n = group.len();
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        return vec![Err(sql_error(e)); n];
    }
    let mut outcomes = Vec::with_capacity(n);
    // Set when a transaction's writes could not be undone alone: the group is not written.
    let mut broken = None;
    for (writes, counts) in group {
        outcomes.push(match n {
            // Alone in its group (always, one lifecycle at a time): the SQL transaction is its
            // own and rolls back whole if it fails, so it needs no savepoint.
            1 => apply(conn, writes, counts),
            _ => in_savepoint(conn, writes, counts).unwrap_or_else(|undo| {
                let outcome = Err(undo.clone());
                broken = Some(undo);
                outcome
            }),
        });
    }
    let committed = match (broken, outcomes.iter().any(Result::is_ok)) {
        (Some(failed), _) => Err(failed),
        (None, true) => run_cached(conn, "COMMIT").map_err(sql_error),
        (None, false) => {
            let _ = run_cached(conn, "ROLLBACK");
            return outcomes;
        }
    };
    if let Err(failed) = committed {
        // Nothing of the group stays. A transaction SQLite rolled back already has nothing
        // left to roll back, so this one's refusal changes nothing.
        let _ = run_cached(conn, "ROLLBACK");
        for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
            *outcome = Err(failed.clone());
        }
    }
    outcomes
}

/// One transaction of a group: its writes in a savepoint, released if they all held, rolled
/// back to it if not. The outer error says its writes could not be undone alone.
fn in_savepoint(
    conn: &Connection,
    writes: &[Write],
    counts: &[Count],
) -> Result<Result<(), StoreError>, StoreError> {
    if let Err(e) = run_cached(conn, "SAVEPOINT tx") {
        return Ok(Err(sql_error(e)));
    }
    let outcome = apply(conn, writes, counts)
        .and_then(|()| run_cached(conn, "RELEASE tx").map_err(sql_error));
    if outcome.is_err() {
        run_cached(conn, "ROLLBACK TO tx")
            .and_then(|()| run_cached(conn, "RELEASE tx"))
            .map_err(sql_error)?;
    }
    Ok(outcome)
}

/// Runs a statement without parameters or rows, prepared once per connection.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Applies the writes, each checking its own condition in the statement that writes it: a
/// conditional put is an `UPDATE ... WHERE ver = ?` or an `INSERT ... ON CONFLICT DO NOTHING`
/// that holds if it changed a row, with no `SELECT` before it. On the first that fails, the
/// writes after it are checked against the store as it stood (no write before touched their
/// items: a transaction's keys are distinct) and every failed one is reported; the caller
/// rolls back what was written. Once every write held, the counts are added.
fn apply(tx: &Connection, writes: &[Write], counts: &[Count]) -> Result<(), StoreError> {
    for (i, write) in writes.iter().enumerate() {
        if !write_if(tx, write)? {
            let mut failed = vec![i];
            for (j, later) in writes.iter().enumerate().skip(i + 1) {
                if !holds(tx, later)? {
                    failed.push(j);
                }
            }
            return Err(StoreError::ConditionFailed { failed });
        }
    }
    for count in counts {
        let (name, label) = count.series.key();
        let (tenant, agent) = (count.tenant.as_str(), count.agent.as_str());
        let row = params![tenant, agent, name, label, count.n as i64, count.seconds];
        execute(tx, ADD_COUNT, row)?;
    }
    Ok(())
}

const ADD_COUNT: &str = "INSERT INTO counts (tenant, agent, name, label, n, seconds) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
    ON CONFLICT (tenant, agent, name, label) DO UPDATE SET n = n + excluded.n, seconds = seconds + excluded.seconds";

/// Writes one item if its condition holds; whether it held.
fn write_if(tx: &Connection, write: &Write) -> Result<bool, StoreError> {
    let changed = match write {
        Write::Put { item, condition } => {
            let (gpk, gsk) = match &item.gsi1 {
                Some(g) => (Some(g.pk.as_str()), Some(g.sk.as_str())),
                None => (None, None),
            };
            let (pk, sk, ver, body) = (&item.pk, &item.sk, item.ver as i64, &item.body);
            let row = params![pk, sk, gpk, gsk, ver, body];
            match condition {
                Condition::Always => return execute(tx, PUT, row).map(|_| true),
                Condition::NotExists => execute(tx, PUT_NEW, row)?,
                Condition::VersionIs(at) => execute(
                    tx,
                    PUT_OVER_VERSION,
                    params![pk, sk, gpk, gsk, ver, body, *at as i64],
                )?,
                Condition::Unchanged { ver: at, body: was } => execute(
                    tx,
                    PUT_OVER_UNCHANGED,
                    params![pk, sk, gpk, gsk, ver, body, *at as i64, was],
                )?,
            }
        }
        Write::Delete { pk, sk, condition } => match condition {
            Condition::Always => return execute(tx, DELETE, params![pk, sk]).map(|_| true),
            // Nothing to delete where nothing may be.
            Condition::NotExists => return Ok(current_ver(tx, pk, sk)?.is_none()),
            Condition::VersionIs(at) => execute(tx, DELETE_VERSION, params![pk, sk, *at as i64])?,
            Condition::Unchanged { ver: at, body: was } => {
                execute(tx, DELETE_UNCHANGED, params![pk, sk, *at as i64, was])?
            }
        },
    };
    Ok(changed == 1)
}

/// Whether a write's condition holds against the store as it stands, writing nothing.
fn holds(tx: &Connection, write: &Write) -> Result<bool, StoreError> {
    let (pk, sk) = write.key();
    Ok(match write.condition() {
        Condition::Always => true,
        Condition::NotExists => current_ver(tx, pk, sk)?.is_none(),
        Condition::VersionIs(v) => current_ver(tx, pk, sk)? == Some(*v as i64),
        Condition::Unchanged { ver, body } => is_unchanged(tx, pk, sk, *ver, body)?,
    })
}

const PUT: &str = "INSERT OR REPLACE INTO items (pk, sk, gsi1pk, gsi1sk, ver, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const PUT_NEW: &str = "INSERT INTO items (pk, sk, gsi1pk, gsi1sk, ver, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (pk, sk) DO NOTHING";
const PUT_OVER_VERSION: &str = "UPDATE items SET gsi1pk = ?3, gsi1sk = ?4, ver = ?5, body = ?6 WHERE pk = ?1 AND sk = ?2 AND ver = ?7";
const PUT_OVER_UNCHANGED: &str = "UPDATE items SET gsi1pk = ?3, gsi1sk = ?4, ver = ?5, body = ?6 WHERE pk = ?1 AND sk = ?2 AND ver = ?7 AND body = ?8";
const DELETE: &str = "DELETE FROM items WHERE pk = ?1 AND sk = ?2";
const DELETE_VERSION: &str = "DELETE FROM items WHERE pk = ?1 AND sk = ?2 AND ver = ?3";
const DELETE_UNCHANGED: &str =
    "DELETE FROM items WHERE pk = ?1 AND sk = ?2 AND ver = ?3 AND body = ?4";

/// Runs a write statement, prepared once per connection; the rows it changed.
fn execute(tx: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<usize, StoreError> {
    tx.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params))
        .map_err(sql_error)
}

/// The version of the item at `pk`/`sk`, if there is one.
fn current_ver(tx: &Connection, pk: &str, sk: &str) -> Result<Option<i64>, StoreError> {
    tx.prepare_cached("SELECT ver FROM items WHERE pk = ?1 AND sk = ?2")
        .and_then(|mut stmt| stmt.query_row(params![pk, sk], |r| r.get(0)).optional())
        .map_err(sql_error)
}

/// Whether the item at `pk`/`sk` is there at version `ver` holding exactly `body`.
fn is_unchanged(
    tx: &Connection,
    pk: &str,
    sk: &str,
    ver: u64,
    body: &str,
) -> Result<bool, StoreError> {
    tx.prepare_cached("SELECT 1 FROM items WHERE pk = ?1 AND sk = ?2 AND ver = ?3 AND body = ?4")
        .and_then(|mut stmt| stmt.exists(params![pk, sk, ver as i64, body]))
        .map_err(sql_error)
}

fn sql_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Contended
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

const PARTITION_FROM: &str = "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk >= ?2 AND sk < ?3 ORDER BY sk LIMIT ?4";
const PARTITION_AFTER: &str = "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk > ?2 AND sk < ?3 ORDER BY sk LIMIT ?4";
const PARTITION_BACK: &str = "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk >= ?2 AND sk < ?3 ORDER BY sk DESC LIMIT ?4";
const INDEX_PAGE: &str = "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items
    WHERE gsi1pk = ?1 AND gsi1sk >= ?2 AND gsi1sk <= ?3 AND (gsi1sk, pk, sk) > (?4, ?5, ?6)
    ORDER BY gsi1sk, pk, sk LIMIT ?7";

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

/// What a query of the index backwards is told: only a partition reads that way.
fn backward_index() -> StoreError {
    StoreError::Invalid("only a partition is read backwards, not the index".into())
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
        self.read(|conn| {
            conn.prepare_cached(
                "SELECT pk, sk, gsi1pk, gsi1sk, ver, body FROM items WHERE pk = ?1 AND sk = ?2",
            )
            .and_then(|mut stmt| stmt.query_row(params![pk, sk], row_to_item).optional())
            .map_err(sql_error)
        })
    }

    async fn partitions(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let to = prefix_end(prefix);
        self.read(|conn| {
            conn.prepare_cached(
                "SELECT DISTINCT pk FROM items WHERE pk >= ?1 AND pk < ?2 ORDER BY pk",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![prefix, to], |row| row.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()
            })
            .map_err(sql_error)
        })
    }

    async fn page(&self, query: Query<'_>) -> Result<Page, StoreError> {
        let Query {
            range,
            after,
            limit,
            backward,
        } = query;
        let limit = limit.max(1);
        match range {
            Range::Partition { pk, sk_prefix } => {
                let after = after.map(read_cursor).transpose()?;
                let end = prefix_end(sk_prefix);
                // Forwards from the prefix or past the cursor; backwards down from the end of
                // the prefix's keys or the cursor, down to the prefix.
                let (sql, from, to) = match (&after, backward) {
                    (Some(sk), false) => (PARTITION_AFTER, sk.as_str(), end.as_str()),
                    (None, false) => (PARTITION_FROM, sk_prefix, end.as_str()),
                    (Some(sk), true) => (PARTITION_BACK, sk_prefix, sk.as_str()),
                    (None, true) => (PARTITION_BACK, sk_prefix, end.as_str()),
                };
                self.read(|conn| {
                    let mut stmt = conn.prepare_cached(sql).map_err(sql_error)?;
                    let items = stmt
                        .query_map(params![pk, from, to, (limit + 1) as i64], row_to_item)
                        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                        .map_err(sql_error)?;
                    Ok(page(items, limit, |i| {
                        serde_json::json!([i.sk]).to_string()
                    }))
                })
            }
            Range::Index { .. } if backward => Err(backward_index()),
            Range::Index { pk, from, to } => {
                let (a_gsi, a_pk, a_sk) = after
                    .map(read_index_cursor)
                    .transpose()?
                    .unwrap_or_default();
                self.read(|conn| {
                    let mut stmt = conn.prepare_cached(INDEX_PAGE).map_err(sql_error)?;
                    let items = stmt
                        .query_map(
                            params![pk, from, to, a_gsi, a_pk, a_sk, (limit + 1) as i64],
                            row_to_item,
                        )
                        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                        .map_err(sql_error)?;
                    Ok(page(items, limit, index_cursor))
                })
            }
        }
    }

    /// The write connection's `PRAGMA data_version`, which SQLite moves when another connection
    /// commits and never for the connection's own commits: read from shared memory, in
    /// microseconds. While the connection is busy committing, the value last read (the next
    /// look reads it).
    fn commits_elsewhere(&self) -> Option<u64> {
        if let Some(conn) = self.write.free() {
            let read = conn
                .prepare_cached("PRAGMA data_version")
                .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)));
            if let Ok(version) = read {
                self.write
                    .data_version
                    .store(version as u64, Ordering::Relaxed);
            }
        }
        Some(self.write.data_version.load(Ordering::Relaxed))
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.commit(writes, Vec::new()).await
    }

    fn counters(&self) -> Option<&dyn Counters> {
        Some(self)
    }
}

impl SqliteStore {
    /// Commits `writes` and adds `counts` in one SQL transaction: here when the connection is
    /// free, else on the writer thread.
    async fn commit(&self, writes: Vec<Write>, counts: Vec<Count>) -> Result<(), StoreError> {
        // Counts alone ([`Counters::count`]) are the one transaction of no write taken.
        let counts_alone = writes.is_empty() && !counts.is_empty();
        if !counts_alone {
            check_transaction(&writes)?;
        }
        if let Some(outcome) = self.commit_in_place(&writes, &counts) {
            return outcome;
        }
        let stopped = || StoreError::Unavailable("the store's writer stopped".into());
        let (done, outcome) = oneshot::channel();
        self.write.waiting.fetch_add(1, Ordering::AcqRel);
        let pending = Pending {
            writes,
            counts,
            done,
        };
        if self.writer.send(pending).is_err() {
            self.write.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(stopped());
        }
        outcome.await.map_err(|_| stopped())?
    }
}

#[async_trait]
impl Counters for SqliteStore {
    async fn transact_counting(&self, writes: Vec<Write>, counts: &[Count]) -> Result<(), Refused> {
        let keys = write_keys(&writes);
        let sent = self.commit(writes, counts.to_vec()).await;
        with_found(self, &keys, sent).await
    }

    async fn count(&self, counts: &[Count]) -> Result<(), StoreError> {
        if counts.is_empty() {
            return Ok(());
        }
        self.commit(Vec::new(), counts.to_vec()).await
    }

    async fn kept(&self, tenant: Option<&TenantId>) -> Result<Vec<Kept>, StoreError> {
        let rows: Vec<(String, String, String, String, i64, f64)> = self.read(|conn| {
            conn.prepare_cached(
                "SELECT tenant, agent, name, label, n, seconds FROM counts
                 WHERE ?1 IS NULL OR tenant = ?1 ORDER BY tenant, agent, name, label",
            )
            .and_then(|mut stmt| {
                let row = |r: &rusqlite::Row<'_>| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                };
                stmt.query_map(params![tenant.map(TenantId::as_str)], row)?
                    .collect()
            })
            .map_err(sql_error)
        })?;
        let mut kept = Vec::with_capacity(rows.len());
        for (tenant, agent, name, label, n, seconds) in rows {
            // A series a later release added, or a row written by hand, is not this one's.
            let (Some(series), Ok(tenant), Ok(agent)) = (
                Series::parse(&name, &label),
                TenantId::parse(&tenant),
                AgentName::parse(&agent),
            ) else {
                continue;
            };
            kept.push(Kept {
                tenant,
                agent,
                series,
                n: n as u64,
                seconds,
            });
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = crate::testing::scratch_dir(&format!("sqlite-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(FILE_NAME)
    }

    fn put(pk: &str, ver: u64, condition: Condition) -> Write {
        Write::Put {
            item: Item {
                pk: pk.into(),
                sk: "s".into(),
                gsi1: None,
                ver,
                body: format!("\"{pk} v{ver}\""),
            },
            condition,
        }
    }

    /// A new item (version 1, must not exist) with `body`.
    fn new_with_body(pk: &str, body: String) -> Write {
        let mut write = put(pk, 1, Condition::NotExists);
        let Write::Put { item, .. } = &mut write else {
            unreachable!("`put` is a put")
        };
        item.body = body;
        write
    }

    #[tokio::test]
    async fn a_count_is_kept_with_the_writes_that_commit_once_for_every_connection_and_not_with_refused_ones()
     {
        use crate::ports::counters::DecisionOutcome;
        let path = scratch("counts");
        let (store, other) = (
            SqliteStore::open(&path).unwrap(),
            SqliteStore::open(&path).unwrap(),
        );
        let approved = |seconds| Count {
            seconds,
            ..Count::one(
                &TenantId::parse("acme").unwrap(),
                &AgentName::parse("expense").unwrap(),
                Series::Decisions(DecisionOutcome::Approved),
            )
        };

        store
            .transact_counting(vec![put("A", 1, Condition::NotExists)], &[approved(2.5)])
            .await
            .unwrap();
        let refused = other
            .transact_counting(vec![put("A", 1, Condition::NotExists)], &[approved(7.0)])
            .await
            .unwrap_err();
        other
            .transact_counting(vec![put("B", 1, Condition::NotExists)], &[approved(1.5)])
            .await
            .unwrap();

        assert_eq!(
            refused.error,
            StoreError::ConditionFailed { failed: vec![0] }
        );
        assert!(
            refused.found(0).is_some_and(Option::is_some),
            "the winner's item"
        );
        for reader in [&store, &other] {
            let kept = reader.kept(None).await.unwrap();
            assert_eq!(kept.len(), 1, "{kept:?}");
            assert_eq!((kept[0].n, kept[0].seconds), (2, 4.0));
        }
        let globex = TenantId::parse("globex").unwrap();
        assert!(store.kept(Some(&globex)).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn counts_kept_alone_add_how_many_each_says_and_a_transaction_of_nothing_is_still_refused()
     {
        use crate::ports::counters::TokenKind;
        let path = scratch("counts-alone");
        let (store, other) = (
            SqliteStore::open(&path).unwrap(),
            SqliteStore::open(&path).unwrap(),
        );
        let tokens = |n| Count {
            n,
            ..Count::one(
                &TenantId::parse("acme").unwrap(),
                &AgentName::parse("expense").unwrap(),
                Series::ModelTokens(TokenKind::Input),
            )
        };

        store.count(&[tokens(1200)]).await.unwrap();
        other.count(&[tokens(300)]).await.unwrap();
        store.count(&[]).await.unwrap();

        let kept = other.kept(None).await.unwrap();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(
            (kept[0].series, kept[0].n),
            (Series::ModelTokens(TokenKind::Input), 1500)
        );
        assert!(matches!(
            store.transact(Vec::new()).await,
            Err(StoreError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn in_one_group_each_transaction_checks_what_the_earlier_ones_wrote_and_fails_alone() {
        let path = scratch("group");
        let store = SqliteStore::open(&path).unwrap();
        store
            .transact(vec![put("B", 1, Condition::NotExists)])
            .await
            .unwrap();
        let mut conn = connect(&path).unwrap();
        let group = [
            vec![put("A", 1, Condition::NotExists)],
            vec![put("A", 1, Condition::NotExists)],
            vec![
                put("C", 1, Condition::NotExists),
                put("B", 3, Condition::VersionIs(2)),
            ],
            vec![
                put("B", 2, Condition::VersionIs(1)),
                put("D", 1, Condition::NotExists),
            ],
            vec![put("B", 3, Condition::VersionIs(2))],
        ];
        let outcomes = commit_group(&mut conn, group.iter().map(|w| (w.as_slice(), &[][..])));
        assert_eq!(
            outcomes,
            [
                Ok(()),
                Err(StoreError::ConditionFailed { failed: vec![0] }),
                Err(StoreError::ConditionFailed { failed: vec![1] }),
                Ok(()),
                Ok(()),
            ]
        );
        let ver = |pk: &'static str| {
            let store = store.clone();
            async move { store.get(pk, "s").await.unwrap().map(|i| i.ver) }
        };
        assert_eq!(ver("A").await, Some(1));
        assert_eq!(ver("B").await, Some(3));
        assert_eq!(ver("C").await, None, "a failed transaction writes nothing");
        assert_eq!(ver("D").await, Some(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn of_many_concurrent_compare_and_sets_on_one_version_exactly_one_wins() {
        let store = SqliteStore::open(&scratch("race")).unwrap();
        store
            .transact(vec![put("A", 1, Condition::NotExists)])
            .await
            .unwrap();
        let mut racers = tokio::task::JoinSet::new();
        for n in 0..32 {
            let store = store.clone();
            racers.spawn(async move {
                let own = put(&format!("own-{n}"), 1, Condition::NotExists);
                store
                    .transact(vec![own, put("A", 2, Condition::VersionIs(1))])
                    .await
            });
        }
        let outcomes = racers.join_all().await;
        let won = outcomes.iter().filter(|o| o.is_ok()).count();
        assert_eq!(won, 1, "{outcomes:?}");
        assert!(
            outcomes
                .iter()
                .filter(|o| o.is_err())
                .all(|o| *o == Err(StoreError::ConditionFailed { failed: vec![1] }))
        );
        let written = query_count(&store);
        assert_eq!(
            written, 2,
            "the winner's own item and A, nothing of the losers"
        );
    }

    /// Polls a transaction once, as its task's first poll would.
    fn first_poll(
        store: &SqliteStore,
        writes: Vec<Write>,
    ) -> std::task::Poll<Result<(), StoreError>> {
        use std::future::Future;
        use std::task::{Context, Waker};
        let transact = store.transact(writes);
        std::pin::pin!(transact).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test]
    async fn the_count_of_commits_elsewhere_moves_for_another_connections_commit_not_its_own() {
        let path = scratch("elsewhere");
        let here = SqliteStore::open(&path).unwrap();
        let there = SqliteStore::open(&path).unwrap();
        let before = here.commits_elsewhere().unwrap();

        here.transact(vec![put("mine", 1, Condition::NotExists)])
            .await
            .unwrap();
        let after_own = here.commits_elsewhere().unwrap();
        there
            .transact(vec![put("theirs", 1, Condition::NotExists)])
            .await
            .unwrap();
        let after_theirs = here.commits_elsewhere().unwrap();

        assert_eq!(after_own, before, "its own commit");
        assert_ne!(after_theirs, after_own, "another connection's commit");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_the_multi_thread_runtime_a_lone_transaction_commits_durably_on_its_callers_thread()
    {
        let path = scratch("in-place");
        let store = SqliteStore::open(&path).unwrap();
        let polled = first_poll(&store, vec![put("A", 1, Condition::NotExists)]);
        assert_eq!(
            polled,
            std::task::Poll::Ready(Ok(())),
            "committed at its first poll"
        );
        assert_eq!(store.commits().in_place(), 1);
        assert_eq!(store.commits().counts(), (1, 1));
        // On the disk, as another connection reads it.
        let conn = connect(&path).unwrap();
        let ver: i64 = conn
            .query_row("SELECT ver FROM items WHERE pk = 'A'", [], |row| row.get(0))
            .unwrap();
        assert_eq!(ver, 1);
        // A worker's task commits in place too; its condition is checked there.
        let again = store.clone();
        let refused = tokio::spawn(async move {
            again
                .transact(vec![put("A", 1, Condition::NotExists)])
                .await
        });
        assert_eq!(
            refused.await.unwrap(),
            Err(StoreError::ConditionFailed { failed: vec![0] })
        );
        assert_eq!(store.commits().in_place(), 2);
    }

    #[tokio::test]
    async fn on_a_current_thread_runtime_a_transaction_goes_to_the_writer_thread() {
        let store = SqliteStore::open(&scratch("current-thread")).unwrap();
        let polled = first_poll(&store, vec![put("A", 1, Condition::NotExists)]);
        assert!(
            polled.is_pending(),
            "its thread runs every task: {polled:?}"
        );
        store
            .transact(vec![put("B", 1, Condition::NotExists)])
            .await
            .unwrap();
        assert_eq!(store.commits().in_place(), 0);
        assert_eq!(store.get("B", "s").await.unwrap().map(|i| i.ver), Some(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(
        clippy::await_holding_lock,
        reason = "the test holds the write connection"
    )]
    async fn transactions_that_find_the_connection_taken_queue_and_commit_as_one_group() {
        let store = SqliteStore::open(&scratch("queued")).unwrap();
        let held = store.write.lock();
        let mut queued = tokio::task::JoinSet::new();
        for n in 0..8 {
            let store = store.clone();
            queued.spawn(async move {
                store
                    .transact(vec![put(&format!("q{n}"), 1, Condition::NotExists)])
                    .await
            });
        }
        // Each finds the connection taken and waits for the writer thread, which has taken the
        // first of them and waits for the connection.
        while store.write.waiting.load(Ordering::Acquire) < 8 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        assert!(queued.join_all().await.iter().all(Result::is_ok));
        assert_eq!(store.commits().counts(), (1, 8), "one commit for the eight");
        assert_eq!(store.commits().in_place(), 0);
        assert_eq!(query_count(&store), 8);
    }

    // The lock is held on purpose across the read, which only ever tries it.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test]
    async fn a_read_takes_the_write_connection_when_it_is_free_and_a_pooled_one_when_not() {
        let store = SqliteStore::open(&scratch("read-on-writer")).unwrap();
        let idle = || store.readers.idle.lock().unwrap().len();
        store
            .transact(vec![put("A", 1, Condition::NotExists)])
            .await
            .unwrap();
        let item = store.get("A", "s").await.unwrap().unwrap();
        assert_eq!((item.ver, idle()), (1, 0), "read on the write connection");
        let held = store.write.lock();
        let item = store.get("A", "s").await.unwrap().unwrap();
        assert_eq!(
            (item.ver, idle()),
            (1, 1),
            "read on a connection of the pool"
        );
        drop(held);
        store
            .transact(vec![put("A", 2, Condition::VersionIs(1))])
            .await
            .unwrap();
        let item = store.get("A", "s").await.unwrap().unwrap();
        assert_eq!(
            item.ver, 2,
            "the write connection reads its own last commit"
        );
    }

    #[tokio::test]
    async fn a_read_is_answered_on_its_callers_thread_at_its_first_poll() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let store = SqliteStore::open(&scratch("inline-read")).unwrap();
        store
            .transact(vec![put("A", 1, Condition::NotExists)])
            .await
            .unwrap();
        let read = store.get("A", "s");
        let polled = std::pin::pin!(read).poll(&mut Context::from_waker(Waker::noop()));
        let Poll::Ready(Ok(Some(item))) = polled else {
            panic!("the read was not answered at once: {polled:?}");
        };
        assert_eq!(item.ver, 1);
    }

    #[tokio::test]
    async fn pages_of_any_size_reuse_their_prepared_statements() {
        let store = SqliteStore::open(&scratch("pages")).unwrap();
        let item = |sk: String| Item {
            pk: "P".into(),
            sk,
            gsi1: Some(IndexKey {
                pk: "I".into(),
                sk: "k".into(),
            }),
            ver: 1,
            body: "{}".into(),
        };
        let writes = (0..5)
            .map(|n| Write::Put {
                item: item(format!("s{n}")),
                condition: Condition::NotExists,
            })
            .collect();
        store.transact(writes).await.unwrap();
        let dyn_store: &dyn ItemStore = &store;
        for limit in 1..=4 {
            let page = dyn_store.query("P", "s", None, limit).await.unwrap();
            assert_eq!(page.items.len(), limit);
            let after = dyn_store
                .query("P", "s", page.next.as_deref(), limit)
                .await
                .unwrap();
            assert_eq!(after.items.len(), limit.min(5 - limit));
            let newest = dyn_store
                .page(Query::partition("P", "s", None, limit).newest_first())
                .await
                .unwrap();
            let older = dyn_store
                .page(Query::partition("P", "s", newest.next.as_deref(), limit).newest_first())
                .await
                .unwrap();
            assert_eq!(older.items.len(), limit.min(5 - limit));
            let index = dyn_store
                .query_index("I", "a", "z", None, limit)
                .await
                .unwrap();
            assert_eq!(index.items.len(), limit);
        }
        // One lifecycle at a time, every read took the one pooled connection.
        let reprepared = store
            .read(|conn| {
                [PARTITION_FROM, PARTITION_AFTER, PARTITION_BACK, INDEX_PAGE]
                    .iter()
                    .map(|sql| {
                        conn.prepare_cached(sql)
                            .map(|stmt| stmt.get_status(rusqlite::StatementStatus::RePrepare))
                            .map_err(sql_error)
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap();
        assert_eq!(reprepared, [0, 0, 0, 0]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_is_checkpointed_beside_the_commits_and_starts_over_while_they_keep_coming() {
        let path = scratch("checkpoints");
        let store = SqliteStore::open(&path).unwrap();
        // About ten pages a commit, 10,000 pages in all: five times what the log may hold.
        let body = format!("\"{}\"", "x".repeat(40_000));
        for n in 0..1_000 {
            let write = new_with_body(&format!("big{n}"), body.clone());
            store.transact(vec![write]).await.unwrap();
        }
        let frame = 24 + 4096;
        let wal = std::fs::metadata(path.with_extension("db-wal"))
            .unwrap()
            .len();
        assert!(
            wal < 32 + 3 * frame * CHECKPOINT_IN_PLACE_PAGES as u64,
            "the log grew to {} pages",
            wal / frame
        );
        assert!(
            store.commits().checkpoints() > 0,
            "the checkpointer made none"
        );
        let conn = connect(&path).unwrap();
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM items", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1_000);
    }

    #[tokio::test]
    async fn a_commits_log_frames_reach_the_file_in_one_write_and_a_big_ones_in_pieces_it_takes() {
        let path = scratch("wal-writes");
        let store = SqliteStore::open(&path).unwrap();
        store
            .transact(vec![put("first", 1, Condition::NotExists)])
            .await
            .unwrap();
        let before = store
            .wal_writes()
            .expect("the log opened through the store's VFS");
        for n in 0..50 {
            let writes = vec![
                put(&format!("a{n}"), 1, Condition::NotExists),
                put(&format!("b{n}"), 1, Condition::NotExists),
            ];
            store.transact(writes).await.unwrap();
        }
        let after = store.wal_writes().unwrap();
        let (asked, made) = (after.asked - before.asked, after.made - before.made);
        assert_eq!(made, 50, "one write a commit: {before:?} then {after:?}");
        assert!(
            asked >= 2 * made,
            "a frame is two writes: {before:?} then {after:?}"
        );

        // About 75 pages in one commit: more than the platform writes in one call.
        let big = new_with_body("big", format!("\"{}\"", "x".repeat(300_000)));
        store.transact(vec![big]).await.unwrap();
        let last = store.wal_writes().unwrap();
        let (asked, made) = (last.asked - after.asked, last.made - after.made);
        assert!(
            (2..asked / 10).contains(&made),
            "{asked} asked, {made} made"
        );

        // Another connection reads every commit: each was in the file before it was published.
        let conn = connect(&path).unwrap();
        let (rows, longest): (i64, i64) = conn
            .query_row("SELECT count(*), max(length(body)) FROM items", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((rows, longest), (102, 300_002));
    }

    fn query_count(store: &SqliteStore) -> usize {
        store
            .read(|conn| {
                conn.query_row("SELECT count(*) FROM items", [], |r| r.get::<_, i64>(0))
                    .map_err(sql_error)
            })
            .unwrap() as usize
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_new_state_directory_and_its_store_files_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let dir = crate::testing::scratch_dir("state-new").join("nested");
        let store = SqliteStore::open_dir(&dir).unwrap();
        let item = Item {
            pk: "pk".into(),
            sk: "sk".into(),
            gsi1: None,
            ver: 1,
            body: "{}".into(),
        };
        store
            .transact(vec![Write::Put {
                item,
                condition: Condition::NotExists,
            }])
            .await
            .unwrap();

        assert_eq!(mode(&dir), 0o700);
        for file in [
            FILE_NAME.to_string(),
            format!("{FILE_NAME}-wal"),
            format!("{FILE_NAME}-shm"),
        ] {
            assert_eq!(mode(&dir.join(&file)), 0o600, "{file}");
        }
        assert!(state_dir::wider_than_private(&dir).unwrap().is_empty());
        drop(store);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
