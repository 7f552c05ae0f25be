//! Slots for requests that wait: a gate long-poll (`GET /gate/calls/{id}?wait=`) and an MCP
//! call held open for a person's decision. A waiting request holds a connection and a task for
//! up to its whole wait, so a server takes at most [`WaitLimits::total`] of them at once, and
//! one person (a tenant's person, from the token) at most [`WaitLimits::per_person`]: past their
//! share, their next wait is answered at once with the call as it stands (a long-poll with 429
//! `too_many_waits` and `Retry-After`), while everyone else's still waits.
//!
//! The slots are the server's: `countersign serve` gives every request its [`WaitSlots`] and
//! its connection ([`ConnectionSlot`]) as request extensions, and lends a waiting request's
//! connection slot back while it waits, so waiters never keep another client's request out.
//! A request given no slots (in Lambda, where an instance serves one request at a time) waits
//! without one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::Extensions;
use axum::http::request::Parts;

use crate::domain::identity::Identity;
use crate::domain::ids::{PersonId, TenantId};

/// How long a caller refused a wait is told to leave before it asks again (`Retry-After`): a
/// slot frees as soon as one of its waits ends, and a wait ends within 25 s.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// How many requests may wait at once, in all and per person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    pub total: u32,
    pub per_person: u32,
}

impl WaitLimits {
    /// The local server's defaults: 1,024 waiting requests, at most 64 of them one person's,
    /// so at least 16 people can each wait their whole share at once.
    pub const DEFAULT: WaitLimits = WaitLimits {
        total: 1024,
        per_person: 64,
    };
}

impl Default for WaitLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why a request may not wait now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitRefused {
    #[error(
        "{person} already has {limit} requests waiting, the most one person may; ask again once \
         one of them has its answer"
    )]
    Person { person: PersonId, limit: u32 },
    #[error("the server holds {limit} waiting requests, the most it takes; ask again shortly")]
    Full { limit: u32 },
}

/// The waiting requests of one server, counted in all and per person.
#[derive(Debug)]
pub struct WaitSlots {
    limits: WaitLimits,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: u32,
    by_person: HashMap<(TenantId, PersonId), u32>,
}

impl Default for WaitSlots {
    fn default() -> Self {
        Self::new(WaitLimits::DEFAULT)
    }
}

impl WaitSlots {
    pub fn new(limits: WaitLimits) -> Self {
        Self {
            limits,
            held: Mutex::default(),
        }
    }

    pub fn limits(&self) -> WaitLimits {
        self.limits
    }

    /// A slot for `who` to wait in, if their share and the server's room allow; while it is
    /// held, the request's connection (when the server lends one) gives its slot back.
    pub fn take(
        self: &Arc<Self>,
        who: &Identity,
        connection: Option<ConnectionSlot>,
    ) -> Result<WaitSlot, WaitRefused> {
        let key = (who.tenant.clone(), who.person.clone());
        {
            let mut held = self.lock();
            let theirs = held.by_person.get(&key).copied().unwrap_or(0);
            if theirs >= self.limits.per_person {
                return Err(WaitRefused::Person {
                    person: who.person.clone(),
                    limit: self.limits.per_person,
                });
            }
            if held.total >= self.limits.total {
                return Err(WaitRefused::Full {
                    limit: self.limits.total,
                });
            }
            held.total += 1;
            *held.by_person.entry(key.clone()).or_default() += 1;
        }
        if let Some(connection) = &connection {
            connection.0.lend();
        }
        Ok(WaitSlot {
            slots: self.clone(),
            key,
            connection,
        })
    }

    /// The requests waiting now: in all, and `who`'s.
    pub fn waiting(&self, who: &Identity) -> (u32, u32) {
        let held = self.lock();
        let key = (who.tenant.clone(), who.person.clone());
        (held.total, held.by_person.get(&key).copied().unwrap_or(0))
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One request's place among the waiting ones; dropping it gives the place back, and the
/// connection takes its own slot again.
#[derive(Debug)]
pub struct WaitSlot {
    slots: Arc<WaitSlots>,
    key: (TenantId, PersonId),
    connection: Option<ConnectionSlot>,
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        {
            let mut held = self.slots.lock();
            held.total = held.total.saturating_sub(1);
            if let Some(theirs) = held.by_person.get_mut(&self.key) {
                *theirs -= 1;
                if *theirs == 0 {
                    held.by_person.remove(&self.key);
                }
            }
        }
        if let Some(connection) = &self.connection {
            connection.0.reclaim();
        }
    }
}

/// Where a request may wait: its server's slots and its connection, as the server gave them.
#[derive(Debug, Clone, Default)]
pub struct WaitPlace {
    slots: Option<Arc<WaitSlots>>,
    connection: Option<ConnectionSlot>,
}

impl WaitPlace {
    pub fn of(extensions: &Extensions) -> Self {
        Self {
            slots: extensions.get::<Arc<WaitSlots>>().cloned(),
            connection: extensions.get::<ConnectionSlot>().cloned(),
        }
    }

    /// A slot for `who` to wait in; `None` (and no limit) where the server gives no slots.
    pub fn take(&self, who: &Identity) -> Result<Option<WaitSlot>, WaitRefused> {
        match &self.slots {
            Some(slots) => slots.take(who, self.connection.clone()).map(Some),
            None => Ok(None),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for WaitPlace {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::of(&parts.extensions))
    }
}

/// What a server that caps its connections does with a connection whose request waits.
pub trait LendSlot: Send + Sync {
    /// The request begins to wait: the connection's slot goes back to the server, which may
    /// admit another connection with it.
    fn lend(&self);
    /// The wait is over: the connection takes a slot again, or, with none free, ends after its
    /// answer.
    fn reclaim(&self);
}

/// A request's connection, as its server lends it (a request extension); Lambda's requests
/// have none.
#[derive(Clone)]
pub struct ConnectionSlot(pub Arc<dyn LendSlot>);

impl std::fmt::Debug for ConnectionSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionSlot")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI32, Ordering};

    use super::*;

    fn person(tenant: &str, name: &str) -> Identity {
        Identity {
            tenant: TenantId::parse(tenant).unwrap(),
            person: PersonId::parse(name).unwrap(),
            roles: Default::default(),
            claims: Default::default(),
        }
    }

    #[test]
    fn one_person_waits_up_to_their_share_while_another_still_waits_and_a_slot_freed_is_taken_again()
     {
        let slots = Arc::new(WaitSlots::new(WaitLimits {
            total: 3,
            per_person: 2,
        }));
        let (ben, dana) = (person("acme", "ben"), person("acme", "dana"));
        let first = slots.take(&ben, None).unwrap();
        let _second = slots.take(&ben, None).unwrap();

        let refused = slots.take(&ben, None).unwrap_err();
        assert!(matches!(refused, WaitRefused::Person { limit: 2, .. }));
        let _dana = slots.take(&dana, None).unwrap();
        assert_eq!(
            slots.take(&person("globex", "ben"), None).unwrap_err(),
            WaitRefused::Full { limit: 3 },
            "the server is full, whoever asks"
        );
        drop(first);
        assert_eq!(slots.waiting(&ben), (2, 1));
        slots
            .take(&ben, None)
            .expect("the slot freed is theirs again");
    }

    #[test]
    fn a_waiting_request_lends_its_connection_slot_until_its_wait_ends() {
        struct Counted(AtomicI32);
        impl LendSlot for Counted {
            fn lend(&self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
            fn reclaim(&self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let lent = Arc::new(Counted(AtomicI32::new(0)));
        let slots = Arc::new(WaitSlots::default());
        let connection = ConnectionSlot(lent.clone());

        let slot = slots
            .take(&person("acme", "ben"), Some(connection))
            .unwrap();
        assert_eq!(lent.0.load(Ordering::SeqCst), 1);
        drop(slot);
        assert_eq!(lent.0.load(Ordering::SeqCst), 0);
    }
}
