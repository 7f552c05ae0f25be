//! Adapters: the ports implemented on real things.

pub mod anthropic;
pub mod sqlite;
