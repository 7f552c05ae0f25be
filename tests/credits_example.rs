//! The README's "your own agent in five minutes", as a new user follows it: the credits service
//! of `examples/credits` (standard-library Python) as a process, the example's definition and
//! people file given to every `countersign` process, a run, a refused self-approval, a support
//! lead's approval, and the one credit the service then holds under the call's key. The README
//! shows the example's files as they are.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Countersign, only_approval};
use serde_json::Value;

const TASK: &str = "Credit cus_7: their order arrived a week late.";

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/credits")
}

/// `python3 examples/credits/service.py` on a free port over a SQLite file of its own.
struct CreditsService {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl CreditsService {
    fn start() -> Self {
        let dir = common::fresh_path("countersign-credits-service");
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new("python3")
            .arg(example().join("service.py"))
            .arg("--db")
            .arg(dir.join("credits.db"))
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the credits service: install Python 3 (Debian: apt-get install python3)");
        let url = common::listening_url(&mut child, "the credits service", Duration::from_secs(30));
        Self { child, dir, url }
    }

    /// The service's lookup for `key`: its status and body.
    fn lookup(&self, key: &str) -> (u16, Value) {
        let url = format!("{}/credits/by-key/{key}", self.url);
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let answer = reqwest::get(&url).await.expect("the lookup answers");
            let status = answer.status().as_u16();
            (
                status,
                answer.json().await.expect("the lookup answers JSON"),
            )
        })
    }
}

impl Drop for CreditsService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn countersign(service: &CreditsService) -> Countersign {
    Countersign::fresh("credits-example").with_env(vec![
        ("COUNTERSIGN_STORE", "embedded".into()),
        ("COUNTERSIGN_AGENTS", example().display().to_string()),
        (
            "COUNTERSIGN_PEOPLE",
            example().join("people.toml").display().to_string(),
        ),
        ("CREDITS_URL", service.url.clone()),
    ])
}

#[test]
fn a_credit_above_usd_20_waits_for_a_support_lead_and_is_made_once_under_its_key() {
    let service = CreditsService::start();
    let cs = countersign(&service);

    // Given lee asks for a credit of USD 25, which policy puts before a support lead.
    let started = cs.ok(&["run", "--agent", "credits", TASK, "--as", "lee"]);
    assert_eq!(started["status"], "awaiting_approval", "{started}");
    let (approval_id, approval) = only_approval(&started);
    assert_eq!(approval["tool"], "issue_credit");
    assert_eq!(approval["args"]["amount_cents"], 2_500);
    assert_eq!(approval["args"]["customer_id"], "cus_7");
    assert_eq!(approval["approver_role"], "support_lead");
    let key = format!("{}:1", approval["action_id"].as_str().unwrap());

    // When lee approves his own request, he is refused.
    let own = cs.run(&["review", "approve", &approval_id, "--as", "lee"]);
    assert_eq!(own.exit, 1, "{}", own.stderr);
    assert_eq!(own.json["error"]["code"], "own_request", "{}", own.json);

    // When kim, a support lead, approves it, the run finishes with the service's answer.
    let decided = cs.printed(&["review", "approve", &approval_id, "--as", "kim"]);
    assert!(
        decided.contains(&format!("issue_credit {key} succeeded")),
        "{decided}"
    );
    assert!(decided.contains("done: Credited cus_7:"), "{decided}");

    // Then the service holds that one credit, under the call's key.
    let (status, credit) = service.lookup(&key);
    assert_eq!(status, 200, "{credit}");
    assert_eq!(credit["amount_cents"], 2_500);
    assert_eq!(credit["customer_id"], "cus_7");
    assert_eq!(credit["idempotency_key"], key.as_str());
}

#[test]
fn a_small_credit_runs_at_once_without_a_person() {
    let service = CreditsService::start();
    let cs = countersign(&service);

    let done = cs.ok(&[
        "run",
        "--agent",
        "credits",
        "Credit cus_9, small: a missing sticker.",
        "--as",
        "lee",
    ]);
    assert_eq!(done["status"], "done", "{done}");
    let answer = done["answer"].as_str().unwrap_or_default();
    assert!(answer.contains("\"amount_cents\":1000"), "{done}");
}

#[test]
fn the_readme_shows_the_example_files_as_they_are() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for file in ["agent.toml", "policy.toml", "people.toml"] {
        let text = std::fs::read_to_string(example().join(file)).unwrap();
        assert!(
            readme.contains(&format!("```toml\n{text}```")),
            "README.md does not show examples/credits/{file} as it is"
        );
    }
}
