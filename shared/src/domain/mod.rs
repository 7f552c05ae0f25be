//! The domain: pure types and rules, no I/O.

pub mod action;
pub mod approval;
pub mod args;
pub mod audit;
pub mod conversation;
pub mod identity;
pub mod ids;
pub mod money;
pub mod names;
pub mod notice;
pub mod policy;
pub mod run;
