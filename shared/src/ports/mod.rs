//! Ports: the small traits the engine needs from the world. Adapters implement them.

pub mod clock;
pub mod counters;
pub mod model;
pub mod notifier;
pub mod queue;
pub mod scheduler;
pub mod store;
pub mod tools;
