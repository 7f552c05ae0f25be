//! The refunds example's orders service as a real process: `orders serve` on a free port over a
//! SQLite file of its own, killed and removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The bearer token the service demands and the refunds definition sends from `ORDERS_TOKEN`.
pub const TOKEN: &str = "orders-test-token";

pub struct OrdersService {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:PORT`, for `ORDERS_URL`.
    pub url: String,
}

/// The `orders` binary, built beside `countersign` by `cargo test --workspace`.
fn orders_binary() -> PathBuf {
    let binary = Path::new(env!("CARGO_BIN_EXE_countersign"))
        .with_file_name(format!("orders{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the orders service's binary is missing at {}: `cargo build -p orders` provides it \
         (`cargo test --workspace` builds it too)",
        binary.display()
    );
    binary
}

impl OrdersService {
    /// A fresh service, seeded with the example's orders (ord_55 among them).
    pub fn start(name: &str) -> Self {
        Self::start_with(name, &[])
    }

    /// A fresh service started with more `orders serve` arguments (`--fault commit-then-500`).
    pub fn start_with(name: &str, args: &[&str]) -> Self {
        let dir = super::fresh_path(&format!("countersign-orders-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(orders_binary())
            .arg("serve")
            .arg("--db")
            .arg(dir.join("orders.db"))
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .env("ORDERS_TOKEN", TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("orders serve starts");
        let url = super::listening_url(&mut child, "orders serve", Duration::from_secs(30));
        Self { child, dir, url }
    }

    /// What a `countersign` process needs to reach the service as the refunds agent.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ORDERS_URL", self.url.clone()),
            ("ORDERS_TOKEN", TOKEN.into()),
        ]
    }

    /// [`Self::env`] for a `countersign` process on the embedded store.
    pub fn embedded_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("COUNTERSIGN_STORE", "embedded".to_string())];
        env.extend(self.env());
        env
    }

    /// The one refund made for `order`, checked to be of `amount_cents` under `key`.
    #[track_caller]
    pub fn only_refund(&self, order: &str, amount_cents: i64, key: &str) -> Value {
        let refunds = self.refunds(order);
        assert_eq!(refunds.len(), 1, "{refunds:?}");
        assert_eq!(refunds[0]["amount_cents"], amount_cents);
        assert_eq!(refunds[0]["idempotency_key"], key);
        refunds[0].clone()
    }

    /// `orders refunds --order ORDER --json`: the refunds made for one order, oldest first.
    pub fn refunds(&self, order: &str) -> Vec<Value> {
        let stdout = super::stdout_of(
            Command::new(orders_binary())
                .arg("refunds")
                .arg("--db")
                .arg(self.dir.join("orders.db"))
                .args(["--order", order, "--json"]),
            "orders refunds",
        );
        serde_json::from_slice(&stdout).expect("orders refunds --json prints an array")
    }
}

impl Drop for OrdersService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
