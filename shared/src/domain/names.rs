//! An enum variant's name as serde writes it, so the text a status or an event shows is the one
//! its records store, written once in the `#[serde(...)]` attributes.
//!
//! [`serde_name`] runs the value's own `Serialize` against a serializer that keeps only the
//! name: a unit variant's (`"awaiting_approval"`), or an internally tagged enum's tag, which
//! serde writes first (`{"event": "decision", ...}`); the rest is never serialized.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

use serde::Serialize;
use serde::ser::{self, Impossible};

/// The serde name of `value`'s variant. Panics if `value` is not an enum serde names (a bug in
/// the caller, found by its first test).
pub fn serde_name<T: Serialize + ?Sized>(value: &T) -> &'static str {
    value
        .serialize(Name)
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

/// Tag values arrive as `&str` of the enum's own literals: kept once each, so a name is
/// `&'static` like a unit variant's. There are as many as there are variants.
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

#[derive(Debug)]
struct NotNamed(String);

impl fmt::Display for NotNamed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotNamed {}

impl ser::Error for NotNamed {
    fn custom<M: fmt::Display>(message: M) -> Self {
        NotNamed(message.to_string())
    }
}

fn not_named<T>(what: &str) -> Result<T, NotNamed> {
    Err(NotNamed(format!("a {what}, not an enum variant")))
}

/// The serializer that keeps a variant's name.
struct Name;

/// A variant's fields. An externally tagged variant's name is known before them
/// (`Fields(Some(name))`); an internally tagged one's is the first value, its tag's.
#[derive(Default)]
struct Fields(Option<&'static str>);

impl Fields {
    fn keep<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotNamed> {
        if self.0.is_none() {
            self.0 = Some(value.serialize(Text)?);
        }
        Ok(())
    }

    fn name(self) -> Result<&'static str, NotNamed> {
        self.0
            .ok_or_else(|| NotNamed("a struct without a tag".into()))
    }
}

/// A struct's fields and a struct variant's, which serde hands over alike.
macro_rules! struct_fields {
    ($($serialize:ident),*) => {
        $(
            impl ser::$serialize for Fields {
                type Ok = &'static str;
                type Error = NotNamed;

                fn serialize_field<T: Serialize + ?Sized>(
                    &mut self,
                    _key: &'static str,
                    value: &T,
                ) -> Result<(), NotNamed> {
                    self.keep(value)
                }

                fn end(self) -> Result<&'static str, NotNamed> {
                    self.name()
                }
            }
        )*
    };
}

struct_fields!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Fields {
    type Ok = &'static str;
    type Error = NotNamed;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, _key: &T) -> Result<(), NotNamed> {
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotNamed> {
        self.keep(value)
    }

    fn end(self) -> Result<&'static str, NotNamed> {
        self.name()
    }
}

impl ser::SerializeTupleVariant for Fields {
    type Ok = &'static str;
    type Error = NotNamed;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotNamed> {
        self.keep(value)
    }

    fn end(self) -> Result<&'static str, NotNamed> {
        self.name()
    }
}

/// Serializer methods for what is not a variant's name: each refuses.
macro_rules! refuse {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(
            fn $method(self, $(_: $arg),*) -> Result<&'static str, NotNamed> {
                not_named(stringify!($method))
            }
        )*
    };
}

/// What neither serializer takes: numbers, booleans, bytes, nothing.
macro_rules! refuse_scalars {
    () => {
        refuse!(
            serialize_bool(bool),
            serialize_i8(i8),
            serialize_i16(i16),
            serialize_i32(i32),
            serialize_i64(i64),
            serialize_u8(u8),
            serialize_u16(u16),
            serialize_u32(u32),
            serialize_u64(u64),
            serialize_f32(f32),
            serialize_f64(f64),
            serialize_char(char),
            serialize_bytes(&[u8]),
            serialize_none(),
            serialize_unit(),
            serialize_unit_struct(&'static str),
        );
    };
}

/// What neither serializer takes either: an option's value, sequences and tuples.
macro_rules! refuse_sequences {
    () => {
        fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<&'static str, NotNamed> {
            not_named("option")
        }

        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotNamed> {
            not_named("sequence")
        }

        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotNamed> {
            not_named("tuple")
        }

        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, NotNamed> {
            not_named("tuple struct")
        }
    };
}

impl ser::Serializer for Name {
    type Ok = &'static str;
    type Error = NotNamed;
    type SerializeSeq = Impossible<&'static str, NotNamed>;
    type SerializeTuple = Impossible<&'static str, NotNamed>;
    type SerializeTupleStruct = Impossible<&'static str, NotNamed>;
    type SerializeTupleVariant = Fields;
    type SerializeMap = Fields;
    type SerializeStruct = Fields;
    type SerializeStructVariant = Fields;

    refuse_scalars!();
    refuse!(serialize_str(&str));

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<&'static str, NotNamed> {
        Ok(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<&'static str, NotNamed> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _value: &T,
    ) -> Result<&'static str, NotNamed> {
        Ok(variant)
    }

    refuse_sequences!();

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Fields, NotNamed> {
        Ok(Fields(Some(variant)))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Fields, NotNamed> {
        Ok(Fields::default())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Fields, NotNamed> {
        Ok(Fields::default())
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Fields, NotNamed> {
        Ok(Fields(Some(variant)))
    }
}

/// The serializer that reads a tag's text.
struct Text;

impl ser::Serializer for Text {
    type Ok = &'static str;
    type Error = NotNamed;
    type SerializeSeq = Impossible<&'static str, NotNamed>;
    type SerializeTuple = Impossible<&'static str, NotNamed>;
    type SerializeTupleStruct = Impossible<&'static str, NotNamed>;
    type SerializeTupleVariant = Impossible<&'static str, NotNamed>;
    type SerializeMap = Impossible<&'static str, NotNamed>;
    type SerializeStruct = Impossible<&'static str, NotNamed>;
    type SerializeStructVariant = Impossible<&'static str, NotNamed>;

    fn serialize_str(self, text: &str) -> Result<&'static str, NotNamed> {
        Ok(interned(text))
    }

    refuse_scalars!();
    refuse!(serialize_unit_variant(&'static str, u32, &'static str));

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<&'static str, NotNamed> {
        not_named("newtype")
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<&'static str, NotNamed> {
        not_named("newtype variant")
    }

    refuse_sequences!();

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotNamed> {
        not_named("tuple variant")
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotNamed> {
        not_named("map")
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, NotNamed> {
        not_named("struct")
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotNamed> {
        not_named("struct variant")
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
    fn the_domains_statuses_and_choices_read_as_their_records_store_them() {
        use crate::domain::action::ActionStatus;
        use crate::domain::approval::{ApprovalStatus, Choice};
        use crate::domain::run::RunStatus;
        use crate::ports::scheduler::Wake;

        assert_eq!(ActionStatus::AwaitingApproval.as_str(), "awaiting_approval");
        assert_eq!(ApprovalStatus::Answered.to_string(), "answered");
        assert_eq!(RunStatus::Cancelled.as_str(), "cancelled");
        assert_eq!(Wake::Deadline.as_str(), "deadline");
        let choice = Choice::DidNotTakeEffect { note: None };
        assert_eq!(
            json!(choice.name()),
            serde_json::to_value(&choice).unwrap()["choice"]
        );
    }

    #[test]
    #[should_panic(expected = "has no serde name")]
    fn a_value_that_is_not_an_enum_has_no_name() {
        serde_name(&42);
    }
}
