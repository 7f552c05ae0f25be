//! Wake-ups for callers waiting on a call through the gate: a waiter registers on its run, and
//! every transaction this process commits that writes the run's items (its record, its action,
//! its audit) wakes the run's waiters, which read the call again. A change made by another
//! process is seen by a glance, every [`GLANCE`], at whether anyone else committed to the store
//! (where the store can tell cheaply: the embedded one), shared by every waiter of the process,
//! and otherwise by the waiter's slow re-read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::records::keys;
use crate::domain::ids::{RunId, TenantId};
use crate::ports::store::{ItemStore, Write};

/// How often a waiter glances at whether another process committed to the store.
pub const GLANCE: Duration = Duration::from_millis(50);

/// The runs someone in this process waits on, each with the signal that wakes its waiters.
#[derive(Default)]
pub(super) struct Waiters {
    /// Each watched run's signal, and how many waiters hold it.
    runs: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
    /// The store's count of commits elsewhere, and when it was looked at: one look serves
    /// every waiter that glances within half a [`GLANCE`] of it.
    glanced: Mutex<Option<(Instant, Option<u64>)>>,
}

/// One waiter's registration; dropping the last one of a run forgets the run.
pub(super) struct Watch<'a> {
    waiters: &'a Waiters,
    pk: String,
    pub(super) signal: Arc<Notify>,
}

impl Waiters {
    /// Registers a waiter on a run.
    pub(super) fn watch(&self, tenant: &TenantId, run: &RunId) -> Watch<'_> {
        let pk = keys::run_pk(tenant, run);
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let (signal, waiting) = runs.entry(pk.clone()).or_default();
        *waiting += 1;
        let signal = signal.clone();
        Watch {
            waiters: self,
            pk,
            signal,
        }
    }

    /// The store's count of commits made elsewhere ([`ItemStore::commits_elsewhere`]), looked
    /// at again unless another waiter just did.
    pub(super) fn commits_elsewhere(&self, store: &dyn ItemStore) -> Option<u64> {
        let mut glanced = self.glanced.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match *glanced {
            Some((at, count)) if now.duration_since(at) < GLANCE / 2 => count,
            _ => {
                let count = store.commits_elsewhere();
                *glanced = Some((now, count));
                count
            }
        }
    }

    /// Returns once the store's count of commits made elsewhere is no longer `seen`, glancing
    /// every [`GLANCE`]; never where the store cannot tell (`seen` is `None`).
    pub(super) async fn committed_elsewhere(&self, store: &dyn ItemStore, seen: Option<u64>) {
        if seen.is_none() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(GLANCE).await;
            if self.commits_elsewhere(store) != seen {
                return;
            }
        }
    }

    /// The signals of the watched runs these writes touch, to send once they committed.
    pub(super) fn touched(&self, writes: &[Write]) -> Vec<Arc<Notify>> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if runs.is_empty() {
            return Vec::new();
        }
        let mut touched: Vec<Arc<Notify>> = Vec::new();
        for write in writes {
            if let Some((signal, _)) = runs.get(write.key().0)
                && !touched.iter().any(|t| Arc::ptr_eq(t, signal))
            {
                touched.push(signal.clone());
            }
        }
        touched
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut runs = self.waiters.runs.lock().unwrap_or_else(|e| e.into_inner());
        let last = match runs.get_mut(&self.pk) {
            Some((_, waiting)) => {
                *waiting -= 1;
                *waiting == 0
            }
            None => false,
        };
        if last {
            runs.remove(&self.pk);
        }
    }
}

/// Wakes the waiters of runs a committed transaction wrote.
pub(super) fn wake(touched: Vec<Arc<Notify>>) {
    for signal in touched {
        signal.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::store::{Condition, Item};

    fn write_to(pk: String) -> Write {
        Write::Put {
            item: Item {
                pk,
                sk: "RUN".into(),
                gsi1: None,
                ver: 1,
                body: "{}".into(),
            },
            condition: Condition::Always,
        }
    }

    #[test]
    fn a_write_to_a_watched_run_touches_its_waiters_and_the_last_waiter_gone_forgets_it() {
        let waiters = Waiters::default();
        let (tenant, run) = (
            TenantId::parse("acme").unwrap(),
            RunId::parse("run-1").unwrap(),
        );
        let other = RunId::parse("run-2").unwrap();
        let writes = [
            write_to(keys::run_pk(&tenant, &run)),
            write_to(keys::run_pk(&tenant, &other)),
        ];

        assert!(waiters.touched(&writes).is_empty(), "nobody waits");
        let one = waiters.watch(&tenant, &run);
        let two = waiters.watch(&tenant, &run);
        assert_eq!(waiters.touched(&writes).len(), 1, "one signal per run");
        drop(one);
        assert_eq!(
            waiters.touched(&writes).len(),
            1,
            "one waiter is still there"
        );
        drop(two);
        assert!(waiters.runs.lock().unwrap().is_empty());
    }
}
