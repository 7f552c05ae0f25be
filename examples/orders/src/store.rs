//! The orders database: one SQLite file in WAL mode with `synchronous=FULL`, so a refund that
//! was answered survives a crash. Each request is one IMMEDIATE transaction: writers take turns,
//! even across processes, and the checks and the write see the same state.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

use crate::refund::{Cents, IdempotencyKey, Item, Order, Refund, RefundAsk, Refusal};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the orders database failed: {0}")]
    Database(#[from] rusqlite::Error),
}

/// What a refund POST did: made the refund now, or found the one its key made before.
#[derive(Debug)]
pub enum Outcome {
    Created(Refund),
    Replayed(Refund),
}

pub struct Store {
    // One connection: requests take turns, which a small service can afford.
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders (
    id          TEXT PRIMARY KEY,
    customer    TEXT NOT NULL,
    currency    TEXT NOT NULL,
    paid_cents  INTEGER NOT NULL CHECK (paid_cents >= 0),
    note        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    order_id    TEXT NOT NULL REFERENCES orders (id),
    position    INTEGER NOT NULL,
    sku         TEXT NOT NULL,
    name        TEXT NOT NULL,
    quantity    INTEGER NOT NULL CHECK (quantity > 0),
    price_cents INTEGER NOT NULL CHECK (price_cents >= 0),
    PRIMARY KEY (order_id, position)
);
-- seq orders refunds oldest first; the UNIQUE key is what makes a refund happen once.
CREATE TABLE IF NOT EXISTS refunds (
    seq             INTEGER PRIMARY KEY,
    refund_id       TEXT NOT NULL UNIQUE,
    order_id        TEXT NOT NULL REFERENCES orders (id),
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    currency        TEXT NOT NULL,
    reason          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    created_at      TEXT NOT NULL
);
-- Keys a lookup found nothing for: no refund may ever be made with them.
CREATE TABLE IF NOT EXISTS void_keys (
    idempotency_key TEXT PRIMARY KEY,
    voided_at       TEXT NOT NULL
);
";

/// The example's orders. `INSERT OR IGNORE` makes seeding on every open harmless.
const SEED: &str = "
INSERT OR IGNORE INTO orders VALUES
    ('ord_55', 'cus_18', 'USD', 14900, 'The blender arrived with a cracked jar; the customer sent photos.'),
    ('ord_42', 'cus_07', 'USD', 4800, 'Both mugs were lost in transit and refunded in full.'),
    ('ord_77', 'cus_31', 'EUR', 8990, 'Delivered; no complaint.');
INSERT OR IGNORE INTO items VALUES
    ('ord_55', 1, 'BLD-200', 'Countertop blender', 1, 14900),
    ('ord_42', 1, 'MUG-12', 'Stoneware mug', 2, 2400),
    ('ord_77', 1, 'HPH-3', 'Wireless headphones', 1, 8990);
INSERT OR IGNORE INTO refunds
    (refund_id, order_id, amount_cents, currency, reason, idempotency_key, created_at)
VALUES
    ('re_seed_ord_42', 'ord_42', 4800, 'USD', 'lost_in_transit', 'seed:ord_42', '2026-11-02T14:05:00Z');
";

impl Store {
    /// Opens the database, creating and seeding it on first open.
    pub fn open(path: &Path) -> Result<Self, rusqlite::Error> {
        let mut conn = Connection::open(path)?;
        // Another process (`orders refunds`, a second server) may hold the write lock briefly.
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(SEED)?;
        tx.commit()?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    pub fn order(&self, order_id: &str) -> Result<Option<Order>, rusqlite::Error> {
        order(&self.conn(), order_id)
    }

    /// Makes the refund the key stands for, at most once. In one transaction: a void key is
    /// refused; a key already used answers its refund if the ask is the same, else refuses;
    /// otherwise the hard limits are checked against the order as it is now and the refund is
    /// written.
    pub fn refund(&self, key: &IdempotencyKey, ask: &RefundAsk) -> Result<Outcome, Error> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if is_void(&tx, key)? {
            return Err(Refusal::KeyVoid(key.to_string()).into());
        }
        if let Some(earlier) = refund_by_key(&tx, key)? {
            return match earlier.answers(ask) {
                true => Ok(Outcome::Replayed(earlier)),
                false => Err(Refusal::KeyReused(key.to_string()).into()),
            };
        }
        let order = order(&tx, &ask.order_id)?
            .ok_or_else(|| Refusal::UnknownOrder(ask.order_id.clone()))?;
        order.check(ask)?;
        let refund = Refund {
            refund_id: format!("re_{:016x}", rand::random::<u64>()),
            ask: ask.clone(),
            idempotency_key: key.to_string(),
            created_at: now(),
        };
        tx.execute(
            "INSERT INTO refunds
                (refund_id, order_id, amount_cents, currency, reason, idempotency_key, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                refund.refund_id,
                refund.ask.order_id,
                refund.ask.amount_cents.0,
                refund.ask.currency,
                refund.ask.reason,
                refund.idempotency_key,
                refund.created_at,
            ],
        )?;
        tx.commit()?;
        Ok(Outcome::Created(refund))
    }

    /// The refund the key made, if it made one. If it made none, the key is voided in the same
    /// transaction, so a request still in flight with it can never take effect afterwards:
    /// `NoRefundForKey` means "did not take effect, and never will".
    pub fn refund_by_key_or_void(&self, key: &IdempotencyKey) -> Result<Refund, Error> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(refund) = refund_by_key(&tx, key)? {
            return Ok(refund);
        }
        tx.execute(
            "INSERT OR IGNORE INTO void_keys (idempotency_key, voided_at) VALUES (?1, ?2)",
            params![key.as_str(), now()],
        )?;
        tx.commit()?;
        Err(Refusal::NoRefundForKey(key.to_string()).into())
    }

    /// Every refund made, oldest first.
    pub fn refunds(&self) -> Result<Vec<Refund>, rusqlite::Error> {
        let conn = self.conn();
        let mut select = conn.prepare(&format!("{SELECT_REFUND} ORDER BY seq"))?;
        select.query_map([], refund_from_row)?.collect()
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic mid-request dropped its transaction, which rolled back: the connection is fine.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn order(conn: &Connection, order_id: &str) -> Result<Option<Order>, rusqlite::Error> {
    let Some(mut order) = conn
        .query_row(
            "SELECT id, customer, currency, paid_cents, note,
                    (SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = orders.id)
             FROM orders WHERE id = ?1",
            [order_id],
            |row| {
                Ok(Order {
                    id: row.get(0)?,
                    customer: row.get(1)?,
                    currency: row.get(2)?,
                    paid_cents: Cents(row.get(3)?),
                    note: row.get(4)?,
                    refunded_cents: Cents(row.get(5)?),
                    items: Vec::new(),
                })
            },
        )
        .optional()?
    else {
        return Ok(None);
    };
    let mut items = conn.prepare(
        "SELECT sku, name, quantity, price_cents FROM items WHERE order_id = ?1 ORDER BY position",
    )?;
    order.items = items
        .query_map([order_id], |row| {
            Ok(Item {
                sku: row.get(0)?,
                name: row.get(1)?,
                quantity: row.get(2)?,
                price_cents: Cents(row.get(3)?),
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(Some(order))
}

fn is_void(conn: &Connection, key: &IdempotencyKey) -> Result<bool, rusqlite::Error> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM void_keys WHERE idempotency_key = ?1)",
        [key.as_str()],
        |row| row.get(0),
    )
}

const SELECT_REFUND: &str = "SELECT refund_id, order_id, amount_cents, currency, reason,
    idempotency_key, created_at FROM refunds";

fn refund_by_key(
    conn: &Connection,
    key: &IdempotencyKey,
) -> Result<Option<Refund>, rusqlite::Error> {
    conn.query_row(
        &format!("{SELECT_REFUND} WHERE idempotency_key = ?1"),
        [key.as_str()],
        refund_from_row,
    )
    .optional()
}

fn refund_from_row(row: &rusqlite::Row<'_>) -> Result<Refund, rusqlite::Error> {
    Ok(Refund {
        refund_id: row.get(0)?,
        ask: RefundAsk {
            order_id: row.get(1)?,
            amount_cents: Cents(row.get(2)?),
            currency: row.get(3)?,
            reason: row.get(4)?,
        },
        idempotency_key: row.get(5)?,
        created_at: row.get(6)?,
    })
}
