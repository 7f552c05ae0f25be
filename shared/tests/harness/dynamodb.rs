//! The DynamoDB backend of the scenario harness, for the test crates that also have the local
//! AWS stack's `support` module.

use std::sync::Arc;

use async_trait::async_trait;
use shared::adapters::emf::Emf;
use shared::ports::store::ItemStore;

use crate::harness::Backend;
use crate::support::aws::FreshStack;

/// DynamoDB on the local AWS stack: a table of this test's own; every connection is a new
/// client, as another process would have.
pub struct DynamoDb {
    stack: FreshStack,
    /// Where each connection prints its counts as metric lines, as a function's does.
    metrics: Option<Emf>,
}

impl DynamoDb {
    pub async fn fresh(name: &str) -> Self {
        Self {
            stack: FreshStack::new(name).await,
            metrics: None,
        }
    }

    /// A fresh table whose connections print what they count to `metrics`.
    #[allow(dead_code)] // each test binary that includes this file uses what it needs
    pub async fn emitting(name: &str, metrics: Emf) -> Self {
        Self {
            metrics: Some(metrics),
            ..Self::fresh(name).await
        }
    }
}

#[async_trait]
impl Backend for DynamoDb {
    fn name(&self) -> &'static str {
        "dynamodb"
    }

    async fn connect(&self) -> Arc<dyn ItemStore> {
        let store = self.stack.aws().store;
        match &self.metrics {
            Some(metrics) => Arc::new(store.as_ref().clone().emitting(metrics.clone())),
            None => store,
        }
    }
}
