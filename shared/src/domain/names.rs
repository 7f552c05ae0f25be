//! An enum variant's name as serde writes it, so the text a status or an event shows is the one
//! its records store, written once in the `#[serde(...)]` attributes.
//!
//! [`serde_name`] writes the value as JSON and reads back the name: a unit variant's
//! (`"awaiting_approval"`), or an internally tagged enum's tag, which serde writes first
//! (`{"event": "decision", ...}`).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The serde name of `value`'s variant. Panics if `value` is not an enum serde names (a bug in
/// the caller, found by its first test).
pub fn serde_name<T: Serialize + ?Sized>(value: &T) -> &'static str {
    serde_json::to_string(value)
        .and_then(|json| serde_json::from_str::<FirstText>(&json))
        .map(|FirstText(name)| interned(&name))
        .unwrap_or_else(|e| panic!("{} has no serde name: {e}", std::any::type_name::<T>()))
}

/// `as_str` and `Display` for a unit-variant enum, both its serde name: the text a status shows
/// is the one its records store.
macro_rules! shown_by_serde_name {
    ($($ty:ty),* $(,)?) => {
        $(
            impl $ty {
                pub fn as_str(self) -> &'static str {
                    $crate::domain::names::serde_name(&self)
                }
            }

            impl std::fmt::Display for $ty {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(self.as_str())
                }
            }
        )*
    };
}
pub(crate) use shown_by_serde_name;

/// Names are kept once each, so a name is `&'static`. There are as many as there are variants.
fn interned(text: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(name) = names.get(text) {
        return name;
    }
    let name: &'static str = Box::leak(text.to_owned().into_boxed_str());
    names.insert(name);
    name
}

/// A JSON text that is a string, or the string value of an object's first entry.
struct FirstText(String);

impl<'de> Deserialize<'de> for FirstText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FirstTextVisitor)
    }
}

struct FirstTextVisitor;

impl<'de> Visitor<'de> for FirstTextVisitor {
    type Value = FirstText;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an enum variant: a name, or an object whose first entry is its tag")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<FirstText, E> {
        Ok(FirstText(text.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FirstText, A::Error> {
        let Some((IgnoredAny, tag)) = map.next_entry::<IgnoredAny, String>()? else {
            return Err(de::Error::custom("an object without a tag"));
        };
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(FirstText(tag))
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use serde_json::json;

    use super::serde_name;

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Status {
        AwaitingApproval,
        #[serde(rename = "done_at_last")]
        Done,
    }

    #[derive(Serialize)]
    #[serde(tag = "event", rename_all = "snake_case")]
    enum Event {
        Started,
        Proposed {
            tool: String,
        },
        Decided(Inner),
        Flattened {
            #[serde(flatten)]
            inner: Inner,
        },
    }

    #[derive(Serialize)]
    struct Inner {
        by: String,
    }

    #[test]
    fn a_unit_variant_is_named_as_serde_writes_it() {
        assert_eq!(serde_name(&Status::AwaitingApproval), "awaiting_approval");
        assert_eq!(serde_name(&Status::Done), "done_at_last");
    }

    #[test]
    fn an_internally_tagged_variant_is_named_by_its_tag_whatever_its_fields() {
        let inner = || Inner { by: "dana".into() };
        let events = [
            Event::Started,
            Event::Proposed {
                tool: "reimburse".into(),
            },
            Event::Decided(inner()),
            Event::Flattened { inner: inner() },
        ];
        for event in &events {
            let written = serde_json::to_value(event).unwrap();
            assert_eq!(json!(serde_name(event)), written["event"], "{written}");
        }
        // The same name twice is the same text.
        assert!(std::ptr::eq(
            serde_name(&events[1]),
            serde_name(&Event::Proposed { tool: "x".into() })
        ));
    }

    #[test]
    #[should_panic(expected = "has no serde name")]
    fn a_value_that_is_not_an_enum_has_no_name() {
        serde_name(&42);
    }
}
