//! Work a handler leaves running once it has answered: on the local server, the turns of a run
//! `POST /runs` accepted, and the resume of the run a Slack decision settled (Slack wants its
//! answer within three seconds; a tool may take longer). `countersign serve` waits for it
//! before it stops, as for a request in flight.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinSet;

/// The tasks handlers left running; a clone shares them.
#[derive(Clone, Default)]
pub struct Background {
    tasks: Arc<Mutex<JoinSet<()>>>,
}

impl Background {
    /// Runs `work` on its own task, now.
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        // The ones already done are forgotten, so a long-lived server keeps no list of them.
        while let Some(done) = tasks.try_join_next() {
            log_panic(done);
        }
        tasks.spawn(work);
    }

    /// Waits until every task spawned so far has ended.
    pub async fn finished(&self) {
        let mut tasks = {
            let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::take(&mut *tasks)
        };
        while let Some(done) = tasks.join_next().await {
            log_panic(done);
        }
    }
}

fn log_panic(done: Result<(), tokio::task::JoinError>) {
    if let Err(error) = done {
        tracing::error!(%error, "work left running after an answer ended abnormally");
    }
}
