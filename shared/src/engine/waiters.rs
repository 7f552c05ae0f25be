//! Wake-ups for callers waiting on a call through the gate: a waiter registers on its run, and
//! every transaction this process commits that writes the run's items (its record, its action,
//! its audit) wakes the run's waiters, which read the call again. No thread and no polling per
//! waiter; a change made by another process is seen by the waiter's slow re-read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::records::keys;
use crate::domain::ids::{RunId, TenantId};
use crate::ports::store::Write;

/// The runs someone in this process waits on, each with the signal that wakes its waiters.
#[derive(Default)]
pub(super) struct Waiters {
    runs: Mutex<HashMap<String, Arc<Notify>>>,
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
        let signal = runs.entry(pk.clone()).or_default().clone();
        Watch {
            waiters: self,
            pk,
            signal,
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
            if let Some(signal) = runs.get(write.key().0)
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
        // The map's and this one: no other waiter holds the run.
        if Arc::strong_count(&self.signal) <= 2 {
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
