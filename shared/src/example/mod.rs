//! The example shipped with Countersign: an expense agent that pays claims within policy and
//! asks finance before paying much, paying twice, or saying no.

pub mod expense;
