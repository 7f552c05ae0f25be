//! The DynamoDB backend of the scenario harness, for the test crates that also have the local
//! AWS stack's `support` module.

use std::sync::Arc;

use async_trait::async_trait;
use shared::ports::store::ItemStore;

use crate::harness::Backend;
use crate::support::aws::FreshStack;

/// DynamoDB on the local AWS stack: a table of this test's own; every connection is a new
/// client, as another process would have.
pub struct DynamoDb {
    stack: FreshStack,
}

impl DynamoDb {
    pub async fn fresh(name: &str) -> Self {
        Self {
            stack: FreshStack::new(name).await,
        }
    }
}

#[async_trait]
impl Backend for DynamoDb {
    fn name(&self) -> &'static str {
        "dynamodb"
    }

    async fn connect(&self) -> Arc<dyn ItemStore> {
        self.stack.aws().store
    }
}
