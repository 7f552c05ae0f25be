//! Agent definitions a team writes, as files in a directory removed when the test ends.

use std::path::{Path, PathBuf};

use super::fresh_path;

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = fresh_path(&format!("countersign-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// An agent's directory in it, `name`, holding these files: its path.
    pub fn agent(&self, name: &str, files: &[(&str, &str)]) -> String {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        dir.to_str().unwrap().to_string()
    }

    /// A team's bonuses agent, written as data and played by `script`: `pay_bonus` (an HTTP
    /// tool nothing answers) names in `employee` a person who may not approve their own bonus
    /// (`claimant`), whoever asked for it; a finance manager decides every bonus. The people
    /// it was written for are in `people.toml` beside it.
    pub fn bonuses_agent(&self, script: &str) -> String {
        std::fs::write(self.0.join("people.toml"), BONUSES_PEOPLE).unwrap();
        self.agent(
            "bonuses",
            &[
                ("agent.toml", BONUSES_AGENT),
                ("policy.toml", BONUSES_POLICY),
                ("script.toml", script),
            ],
        )
    }

    /// The people file [`TempDir::bonuses_agent`] wrote.
    pub fn people(&self) -> String {
        self.0.join("people.toml").to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shipped refunds definition copied into `into/returns`, renamed "returns", its
/// `agent.toml` as `edit` leaves it: a team's own agent, two files and no Rust.
pub fn returns_agent(into: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/refunds");
    let dir = into.join("returns");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["agent.toml", "policy.toml", "script.toml"] {
        let text = std::fs::read_to_string(shipped.join(file)).unwrap();
        let text = match file {
            "agent.toml" => edit(text.replacen("name = \"refunds\"", "name = \"returns\"", 1)),
            _ => text,
        };
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

pub const BONUSES_AGENT: &str = r#"name = "bonuses"
system_prompt = "You pay the bonuses a manager asks for."

[model]
provider = "scripted"
offline = "script.toml"

[tools.pay_bonus]
description = "Pays an employee a bonus, in cents."
input_schema = { type = "object", properties = { employee = { type = "string" }, amount_cents = { type = "integer", minimum = 1 } }, required = ["employee", "amount_cents"], additionalProperties = false }
claimant = "employee"

[tools.pay_bonus.http]
method = "POST"
url = "http://127.0.0.1:9/bonuses"
timeout = "1s"
"#;

pub const BONUSES_POLICY: &str = r#"name = "bonuses"
version = 1
default_ttl = "1h"

[tools.pay_bonus]
decision = "approve"
approver_role = "finance_manager"
quorum = 1
reason = "Every bonus needs a finance manager."
"#;

pub const BONUSES_PEOPLE: &str = r#"[[people]]
name = "sam"
tenant = "acme"
roles = ["employee"]

[[people]]
name = "mia"
tenant = "acme"
roles = ["employee", "finance_manager"]

[[people]]
name = "max"
tenant = "acme"
roles = ["employee", "finance_manager"]
"#;
