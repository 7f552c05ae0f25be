//! A run's history as the HTTP API answers it, for tests that hold what it shows.

use std::sync::Arc;

use shared::api::{Authenticate, BearerJwt};
use shared::domain::ids::RunId;
use shared::engine::Engine;
use shared::example::expense::default_directory;

/// The run's history as `GET /runs/{id}/audit` answers it, over loopback, read by ben.
pub async fn audit_over_http(engine: Engine, run: &RunId) -> String {
    let jwt = BearerJwt::hs256(&[7; 32]).unwrap();
    let ben = default_directory().identify("ben").unwrap();
    let token = jwt
        .issue(
            &ben,
            chrono::Utc::now(),
            std::time::Duration::from_secs(300),
        )
        .unwrap();
    let auth: Arc<dyn Authenticate> = Arc::new(jwt);
    let router = shared::api::router(Arc::new(engine), auth);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let answer = reqwest::Client::new()
        .get(format!("{api}/runs/{run}/audit"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.text().await.unwrap()
}
