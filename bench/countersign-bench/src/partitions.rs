//! Write units per partition key, and the ceiling they imply.
//!
//! DynamoDB serves one partition key at about 1,000 write units a second, on the table and on
//! each index alike; past that, writes to the key are throttled (and a throttled index holds
//! back the table's writes). The bench records, at the item-store port (so on both stores),
//! the write units each successful transaction would cost DynamoDB on each partition key it
//! touches: on the table 1 per KB (2 in a transaction of several writes, 1 for a transaction of
//! one write, which the DynamoDB adapter sends as a plain PutItem or DeleteItem), on the sparse
//! index 1 per KB for each image in it (a moved index key is a delete and a put).
//!
//! Keys are grouped into families by what they are keyed by: one key for the whole deployment
//! (the tenant registry, an unsharded index), one of the shards of an index, one per tenant (its
//! pending approvals), or one per record (a run, an approval: written a few times in its own
//! lifecycle, never a hot key however many lifecycles run). The busiest key at L lifecycles a
//! second takes L x (units per lifecycle of its family / how many keys the family spreads over);
//! the ceiling is the L at which that reaches 1,000.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use shared::engine::records::{IndexShards, keys};
use shared::ports::store::{IndexKey, Write};

/// What DynamoDB serves one partition key, in write units a second.
pub const KEY_WCU_PER_SECOND: f64 = 1_000.0;

/// How a family of partition keys spreads its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Spread {
    /// One key for every tenant.
    Global,
    /// One of the index's shards, chosen by a hash of the record's id.
    Sharded,
    /// One key per tenant.
    PerTenant,
    /// One key per run or approval.
    PerRecord,
}

#[derive(Debug, Clone)]
struct Shadow {
    bytes: u64,
    index: Option<IndexKey>,
}

/// Write units per partition key since the last [`KeyLoad::take`].
#[derive(Debug, Default)]
pub struct KeyLoad {
    shadows: HashMap<(String, String), Shadow>,
    units: BTreeMap<(bool, String), f64>,
    /// The tenant registry item's size, for what writing it on every start would cost.
    registry_bytes: u64,
}

/// DynamoDB's size of an item as the adapter stores it: names plus values.
fn size(item: &shared::ports::store::Item) -> u64 {
    let mut bytes = 2 + item.pk.len() + 2 + item.sk.len() + 3 + 4 + 4 + item.body.len();
    if let Some(index) = &item.gsi1 {
        bytes += 6 + index.pk.len() + 6 + index.sk.len();
    }
    bytes as u64
}

/// What [`KeyLoad::record`] needs of a write, taken before it is handed to the store: its key,
/// and for a put the item's size and index key (the body is not copied).
#[derive(Debug)]
pub struct Written {
    key: (String, String),
    put: Option<Shadow>,
}

impl Written {
    pub fn of(write: &Write) -> Self {
        let (pk, sk) = write.key();
        let put = match write {
            Write::Put { item, .. } => Some(Shadow {
                bytes: size(item),
                index: item.gsi1.clone(),
            }),
            Write::Delete { .. } => None,
        };
        Self {
            key: (pk.to_string(), sk.to_string()),
            put,
        }
    }
}

fn units(bytes: u64) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

impl KeyLoad {
    /// A transaction that committed.
    pub fn record(&mut self, writes: Vec<Written>) {
        let factor = if writes.len() == 1 { 1.0 } else { 2.0 };
        for Written { key, put: next } in writes {
            if key.0 == keys::TENANTS_PK {
                self.registry_bytes = next.as_ref().map_or(0, |n| n.bytes);
            }
            let before = match &next {
                Some(next) => self.shadows.insert(key.clone(), next.clone()),
                None => self.shadows.remove(&key),
            };
            let (old_bytes, old_index) = before.map_or((0, None), |s| (s.bytes, s.index));
            let new_bytes = next.as_ref().map_or(0, |s| s.bytes);
            *self.units.entry((false, key.0)).or_default() +=
                factor * units(old_bytes.max(new_bytes));
            let new_index = next.and_then(|s| s.index);
            let mut charge = |index: &IndexKey, u: f64| {
                *self.units.entry((true, index.pk.clone())).or_default() += u;
            };
            match (old_index, new_index) {
                (None, None) => {}
                (None, Some(b)) => charge(&b, units(new_bytes)),
                (Some(a), None) => charge(&a, units(old_bytes)),
                (Some(a), Some(b)) if a == b => charge(&a, units(old_bytes.max(new_bytes))),
                (Some(a), Some(b)) => {
                    charge(&a, units(old_bytes));
                    charge(&b, units(new_bytes));
                }
            }
        }
    }

    /// The units counted since the last call (item shadows are kept).
    pub fn take(&mut self) -> BTreeMap<(bool, String), f64> {
        std::mem::take(&mut self.units)
    }

    pub fn registry_bytes(&self) -> u64 {
        self.registry_bytes
    }
}

/// A family of partition keys and what it took per lifecycle.
#[derive(Debug, Clone, Serialize)]
pub struct Family {
    /// `table` or `index`.
    pub on: &'static str,
    /// The key with its tenant, record id or shard abstracted, such as `RUNNING#{shard}`.
    pub key: String,
    pub spread: Spread,
    /// Distinct keys of the family the bench wrote.
    pub keys: usize,
    pub wcu_per_lifecycle: f64,
}

const SHARDED: [&str; 4] = [
    keys::OUTBOX_INDEX,
    keys::RECONCILE_INDEX,
    keys::RUNNING_INDEX,
    keys::ESCALATE_INDEX,
];

fn family_of(pk: &str) -> (String, Spread) {
    if pk == keys::TENANTS_PK || SHARDED.contains(&pk) {
        return (pk.to_string(), Spread::Global);
    }
    if let Some((index, shard)) = pk.split_once('#')
        && SHARDED.contains(&index)
        && shard.bytes().all(|b| b.is_ascii_digit())
    {
        return (format!("{index}#{{shard}}"), Spread::Sharded);
    }
    let parts: Vec<&str> = pk.split('#').collect();
    match parts.as_slice() {
        // A history window's subject: one key per requester or value, one per agent for
        // the whole agent.
        ["TENANT", _, "HISTORY", agent, window, per, ..] => (
            format!("TENANT#{{tenant}}#HISTORY#{agent}#{window}#{per}#{{subject}}"),
            match *per {
                "agent" => Spread::PerTenant,
                _ => Spread::PerRecord,
            },
        ),
        ["TENANT", _, kind, _] => (
            format!("TENANT#{{tenant}}#{kind}#{{id}}"),
            Spread::PerRecord,
        ),
        ["TENANT", _, rest @ ..] => (
            format!("TENANT#{{tenant}}#{}", rest.join("#")),
            Spread::PerTenant,
        ),
        _ => (pk.to_string(), Spread::Global),
    }
}

/// The families written, busiest first.
pub fn families(units: &BTreeMap<(bool, String), f64>, lifecycles: usize) -> Vec<Family> {
    let mut grouped: BTreeMap<(bool, String), (Spread, usize, f64)> = BTreeMap::new();
    for ((index, pk), u) in units {
        let (key, spread) = family_of(pk);
        let entry = grouped.entry((*index, key)).or_insert((spread, 0, 0.0));
        entry.1 += 1;
        entry.2 += u;
    }
    let mut families: Vec<Family> = grouped
        .into_iter()
        .map(|((index, key), (spread, keys, u))| Family {
            on: if index { "index" } else { "table" },
            key,
            spread,
            keys,
            wcu_per_lifecycle: u / lifecycles.max(1) as f64,
        })
        .collect();
    families.sort_by(|a, b| b.wcu_per_lifecycle.total_cmp(&a.wcu_per_lifecycle));
    families
}

/// The lifecycles a second at which the busiest key reaches its 1,000 write units a second.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub tenants: u32,
    pub shards: u32,
    /// The busiest key's family and its write units per lifecycle.
    pub busiest: String,
    pub busiest_wcu_per_lifecycle: f64,
    pub lifecycles_per_second: f64,
}

/// The ceiling for `tenants` tenants sharing the load evenly, the sharded indexes over
/// `shards`, plus `extra` write units per lifecycle on one global key (the tenant registry as
/// it was written before: on every start).
pub fn ceiling(families: &[Family], tenants: u32, shards: IndexShards, extra: f64) -> Ceiling {
    let mut busiest = (String::from("TENANTS (table)"), extra);
    for family in families {
        let per_key = match family.spread {
            Spread::Global => family.wcu_per_lifecycle,
            Spread::Sharded => family.wcu_per_lifecycle / f64::from(shards.get()),
            Spread::PerTenant => family.wcu_per_lifecycle / f64::from(tenants),
            Spread::PerRecord => continue,
        };
        let per_key = if family.key == keys::TENANTS_PK {
            per_key + extra
        } else {
            per_key
        };
        if per_key > busiest.1 {
            let key = match (family.spread, shards.get()) {
                (Spread::Sharded, 1) => family.key.trim_end_matches("#{shard}").to_string(),
                _ => family.key.clone(),
            };
            busiest = (format!("{key} ({})", family.on), per_key);
        }
    }
    Ceiling {
        tenants,
        shards: shards.get(),
        busiest: busiest.0,
        busiest_wcu_per_lifecycle: busiest.1,
        lifecycles_per_second: KEY_WCU_PER_SECOND / busiest.1.max(f64::MIN_POSITIVE),
    }
}

pub fn table(families: &[Family], ceilings: &[(&str, Ceiling)]) -> String {
    let mut out = String::from(
        "write units per lifecycle on each family of partition keys (DynamoDB holds one key to about 1,000 a second):\n",
    );
    out.push_str(&format!(
        "  {:<6} {:<34} {:<11} {:>5} {:>9}\n",
        "on", "partition key", "spread", "keys", "WCU/life"
    ));
    for f in families {
        let spread = match f.spread {
            Spread::Global => "global",
            Spread::Sharded => "sharded",
            Spread::PerTenant => "per tenant",
            Spread::PerRecord => "per record",
        };
        out.push_str(&format!(
            "  {:<6} {:<34} {:<11} {:>5} {:>9.2}\n",
            f.on, f.key, spread, f.keys, f.wcu_per_lifecycle
        ));
    }
    out.push_str("the ceiling: lifecycles a second at which the busiest key reaches 1,000 WCU/s\n");
    for (name, c) in ceilings {
        out.push_str(&format!(
            "  {name:<46} {:>5} tenants, {:>3} shards: {:>9.0} lifecycles/s (busiest {} at {:.3} WCU per lifecycle)\n",
            c.tenants, c.shards, c.lifecycles_per_second, c.busiest, c.busiest_wcu_per_lifecycle
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fall_into_the_families_that_say_how_they_spread() {
        assert_eq!(family_of("TENANTS"), ("TENANTS".into(), Spread::Global));
        assert_eq!(family_of("RUNNING"), ("RUNNING".into(), Spread::Global));
        assert_eq!(
            family_of("OUTBOX#7"),
            ("OUTBOX#{shard}".into(), Spread::Sharded)
        );
        assert_eq!(
            family_of("TENANT#bench#PENDING"),
            ("TENANT#{tenant}#PENDING".into(), Spread::PerTenant)
        );
        assert_eq!(
            family_of("TENANT#bench#RUN#run-1"),
            ("TENANT#{tenant}#RUN#{id}".into(), Spread::PerRecord)
        );
        let window = "TENANT#{tenant}#HISTORY#expense#sent_1h";
        assert_eq!(
            family_of("TENANT#bench#HISTORY#expense#sent_1h#requester#emp-1"),
            (format!("{window}#requester#{{subject}}"), Spread::PerRecord)
        );
        assert_eq!(
            family_of("TENANT#bench#HISTORY#expense#sent_1h#agent#expense"),
            (format!("{window}#agent#{{subject}}"), Spread::PerTenant)
        );
    }

    #[test]
    fn the_busiest_key_sets_the_ceiling() {
        let families = [
            Family {
                on: "index",
                key: "RUNNING#{shard}".into(),
                spread: Spread::Sharded,
                keys: 16,
                wcu_per_lifecycle: 8.0,
            },
            Family {
                on: "index",
                key: "TENANT#{tenant}#PENDING".into(),
                spread: Spread::PerTenant,
                keys: 1,
                wcu_per_lifecycle: 2.0,
            },
        ];
        let one = IndexShards::new(1).unwrap();
        let sixteen = IndexShards::new(16).unwrap();
        assert_eq!(ceiling(&families, 1, one, 0.0).lifecycles_per_second, 125.0);
        assert_eq!(
            ceiling(&families, 1, sixteen, 0.0).lifecycles_per_second,
            500.0
        );
        let many = ceiling(&families, 1_000, sixteen, 0.0);
        assert_eq!(many.lifecycles_per_second, 2_000.0);
        assert_eq!(many.busiest, "RUNNING#{shard} (index)");
        assert_eq!(
            ceiling(&families, 1_000, sixteen, 2.0).lifecycles_per_second,
            500.0
        );
    }
}
