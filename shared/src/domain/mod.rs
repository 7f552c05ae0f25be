//! The domain: pure types and rules, no I/O.

/// The two conversions serde's `try_from`/`into` use for a newtype that is checked when made:
/// `TryFrom<$raw>` through the type's checking constructor, `From<$name>` back to the raw value.
macro_rules! checked_conversions {
    ($name:ident, $raw:ty, $error:ty, |$r:ident| $check:expr, |$v:ident| $into:expr) => {
        impl TryFrom<$raw> for $name {
            type Error = $error;
            fn try_from($r: $raw) -> Result<Self, $error> {
                $check
            }
        }

        impl From<$name> for $raw {
            fn from($v: $name) -> $raw {
                $into
            }
        }
    };
}

/// A count at zero, which serialized records leave out (`skip_serializing_if`): it reads back
/// as zero by `#[serde(default)]`.
pub(crate) fn is_zero<N: Default + PartialEq>(n: &N) -> bool {
    *n == N::default()
}

pub mod action;
pub mod approval;
pub mod args;
pub mod audit;
pub mod budget;
pub mod conversation;
pub mod gate;
pub mod identity;
pub mod ids;
pub mod log_slot;
pub mod money;
pub mod names;
pub mod notice;
pub mod policy;
pub mod run;
pub mod schema;
pub mod toml_text;
