//! The real Claude Code CLI (`claude` from npm, pinned in tests/npm/claude-code) run headless
//! (`claude -p`) in a scratch project whose `.claude/settings.json` is the settings entry
//! docs/claude-code.md gives, pasted with this build's paths. The model is a scripted Anthropic
//! Messages API on loopback (`ANTHROPIC_BASE_URL`) that asks for one Bash command the shipped
//! claude-code policy sends to a lead; the lead decides from another process.
//!
//! The CLI is installed once under `${XDG_CACHE_HOME:-~/.cache}/countersign/claude-code` by
//! scripts/mcp-npm (npm the first time, offline after); `COUNTERSIGN_CLAUDE` names another
//! `claude` of the pinned version.

mod common;
#[allow(dead_code)]
#[path = "../shared/tests/support/mcp_servers.rs"]
mod mcp_servers;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use common::Countersign;
use common::claude_code::{
    ScriptedMessages, claude_code_dir, harness, lead_approves, lead_rejects, waiting_approval,
};
use serde_json::Value;

const PINNED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/npm/claude-code/package.json"
);
const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/claude-code.md");

/// What the scripted model asks to run: a recursive rm, which waits for a lead, then one line
/// appended to out.txt and printed.
const COMMAND: &str = "rm -rf build && echo ran | tee -a out.txt";
/// What Claude Code is asked to do.
const TASK: &str = "Clean the build and note it.";

/// The `claude` the tests run, of the version tests/npm/claude-code pins.
fn claude() -> &'static Path {
    static CLAUDE: OnceLock<PathBuf> = OnceLock::new();
    CLAUDE.get_or_init(|| {
        let claude = std::env::var_os("COUNTERSIGN_CLAUDE")
            .map(PathBuf::from)
            .unwrap_or_else(mcp_servers::claude_code);
        let manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(PINNED).unwrap()).unwrap();
        let pinned = manifest["dependencies"]["@anthropic-ai/claude-code"]
            .as_str()
            .unwrap();
        let version = common::stdout_of(Command::new(&claude).arg("--version"), "claude");
        let version = String::from_utf8_lossy(&version);
        assert_eq!(
            version.split_whitespace().next(),
            Some(pinned),
            "{} is not the pinned Claude Code {pinned}: {version}",
            claude.display()
        );
        claude
    })
}

/// The settings entry docs/claude-code.md gives under `heading`, with each documented text
/// replaced by this test's.
fn documented(heading: &str, replacements: &[(&str, String)]) -> Value {
    let docs = std::fs::read_to_string(DOCS).unwrap();
    let section = &docs[docs.find(heading).expect("the section")..];
    let entry = section
        .split_once("```json\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .expect("the section's JSON block")
        .0;
    let mut pasted = entry.to_string();
    for (documented, here) in replacements {
        assert!(pasted.contains(documented), "the entry has {documented}");
        pasted = pasted.replace(documented, here);
    }
    serde_json::from_str(&pasted).expect("the documented entry is JSON")
}

/// The command hook's settings entry, with this build's binary, `cs`'s state and the shipped
/// claude-code agent where the page has `/srv/countersign/...`.
fn documented_settings(cs: &Countersign) -> Value {
    documented(
        "## The settings entry",
        &[
            (
                "\"countersign --state",
                format!("\"{} --state", env!("CARGO_BIN_EXE_countersign")),
            ),
            ("/srv/countersign/state", cs.state().display().to_string()),
            ("/srv/countersign/examples/claude-code", claude_code_dir()),
        ],
    )
}

/// A project Claude Code works in, and the scratch home it runs with; removed when dropped.
struct Project {
    dir: PathBuf,
    home: PathBuf,
}

impl Project {
    /// A project whose `.claude/settings.json` holds `settings`.
    fn with_settings(name: &str, settings: &Value) -> Self {
        let dir = common::fresh_path(&format!("claude-project-{name}"));
        let home = common::fresh_path(&format!("claude-home-{name}"));
        std::fs::create_dir_all(dir.join(".claude")).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(
            dir.join(".claude/settings.json"),
            serde_json::to_string_pretty(settings).unwrap(),
        )
        .unwrap();
        Self { dir, home }
    }

    /// `claude -p --output-format json ARGS` in the project, against `model`, with nothing of
    /// the shell's environment but its PATH, and none of Claude Code's non-essential traffic.
    fn claude(&self, model: &str, args: &[&str]) -> Child {
        self.claude_with(model, &[], args)
    }

    /// [`Project::claude`] with the variables `env` too.
    fn claude_with(&self, model: &str, env: &[(&str, &str)], args: &[&str]) -> Child {
        Command::new(claude())
            .args(["-p", "--output-format", "json"])
            .args(args)
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("ANTHROPIC_BASE_URL", model)
            .env("ANTHROPIC_API_KEY", "sk-ant-scripted")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("claude starts")
    }

    /// What out.txt holds, if the command ever ran.
    fn out(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("out.txt")).ok()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// A project with the documented command hook, and `claude -p` started in it on a model that
/// asks for [`COMMAND`] as the call `tool_use_id`: running, its call waiting for the lead.
fn asked_with_the_command_hook(
    name: &str,
    tool_use_id: &str,
) -> (Countersign, ScriptedMessages, Project, Child) {
    let cs = harness(&format!("claude-cli-{name}"));
    let model = ScriptedMessages::asking_bash(tool_use_id, COMMAND);
    let project = Project::with_settings(name, &documented_settings(&cs));
    let claude = project.claude(&model.serve(), &[TASK]);
    (cs, model, project, claude)
}

/// The call `tool_use_id` waits for the lead, who approves it from another process; `claude`
/// then finishes, having run the command once. The approval, as the lead saw it.
#[track_caller]
fn approved_and_ran_once(
    cs: &Countersign,
    project: &Project,
    claude: Child,
    tool_use_id: &str,
) -> Value {
    let approval = waiting_approval(cs);
    assert_eq!(approval["tool_use_id"], tool_use_id);
    assert_eq!(project.out(), None, "it waits for the lead");
    lead_approves(cs, approval["id"].as_str().unwrap());

    let result = finished(claude);
    assert_eq!(result["result"], "Done.", "{result}");
    assert_eq!(project.out().as_deref(), Some("ran\n"), "it ran once");
    approval
}

/// The result `claude -p --output-format json` printed, once it exited 0.
#[track_caller]
fn finished(claude: Child) -> Value {
    let output = claude.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "claude failed: {stderr}");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&output.stdout)))
}

/// The approval `id`'s call, by its audit: the hook claimed it for Claude Code within a second
/// of the approval (the allow answer follows the claim), and PostToolUse reported that it
/// succeeded, printing "ran".
#[track_caller]
fn handed_within_a_second_and_reported(cs: &Countersign, id: &str) {
    let audit = cs.ok(&["audit", id]);
    let handed = recorded(&audit, "executing") - recorded(&audit, "decision");
    assert!(
        handed < chrono::Duration::seconds(1),
        "allowed {handed} after the approval"
    );
    let executed = common::item_where(&audit["entries"], "event", "executed");
    assert_eq!(executed["succeeded"], true, "{audit}");
    let output: Value = serde_json::from_str(executed["result"].as_str().unwrap()).unwrap();
    assert_eq!(output["stdout"], "ran", "{audit}");
    assert_eq!(audit["actions"][0]["status"], "succeeded");
}

/// When the audit entry `event` was recorded.
#[track_caller]
fn recorded(audit: &Value, event: &str) -> DateTime<Utc> {
    let entry = common::item_where(&audit["entries"], "event", event);
    entry["at"].as_str().unwrap().parse().unwrap()
}

#[test]
fn given_claude_asks_for_a_gated_command_when_a_lead_approves_from_another_process_then_it_runs_once()
 {
    let (cs, model, project, claude) = asked_with_the_command_hook("approve", "toolu_01CliApprove");

    let approval = approved_and_ran_once(&cs, &project, claude, "toolu_01CliApprove");
    assert_eq!(approval["args"]["command"], COMMAND);
    assert_eq!(approval["reason"], "A recursive rm needs a lead.");
    let id = approval["id"].as_str().unwrap();
    let told = model.tool_results();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["tool_use_id"], "toolu_01CliApprove");
    assert_eq!(told[0]["content"], "ran");

    handed_within_a_second_and_reported(&cs, id);
}

#[test]
fn given_claude_asks_for_a_gated_command_when_the_lead_rejects_it_then_it_never_runs_and_claude_is_told_why()
 {
    let (cs, model, project, claude) = asked_with_the_command_hook("reject", "toolu_01CliReject");

    let approval = waiting_approval(&cs);
    let id = approval["id"].as_str().unwrap();
    lead_rejects(&cs, id, "the build directory is shared");

    let result = finished(claude);
    assert_eq!(result["result"], "Done.", "{result}");
    assert_eq!(project.out(), None, "the command never ran");
    let told = model.tool_results();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["is_error"], true, "{told:?}");
    assert!(
        told[0]["content"]
            .to_string()
            .contains("the build directory is shared"),
        "{told:?}"
    );
    let audit = cs.ok(&["audit", id]);
    assert_eq!(audit["actions"][0]["status"], "rejected", "{audit}");
}

#[test]
fn given_a_headless_session_the_hook_deferred_when_the_lead_approves_later_then_the_resumed_session_runs_it_once()
 {
    let cs = harness("claude-cli-resume");
    let model = ScriptedMessages::asking_bash("toolu_01CliResume", COMMAND);
    let mut settings = documented_settings(&cs);
    let pre_tool_use = &mut settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"];
    *pre_tool_use = format!(
        "{} --wait 0s --on-timeout defer",
        pre_tool_use.as_str().unwrap()
    )
    .into();
    let project = Project::with_settings("resume", &settings);
    let base = model.serve();

    let deferred = finished(project.claude(&base, &[TASK]));
    assert_eq!(deferred["stop_reason"], "tool_deferred", "{deferred}");
    assert_eq!(deferred["deferred_tool_use"]["id"], "toolu_01CliResume");
    assert_eq!(project.out(), None, "nothing ran while nobody decided");
    let approval = waiting_approval(&cs);
    let id = approval["id"].as_str().unwrap();
    lead_approves(&cs, id);

    let session = deferred["session_id"].as_str().unwrap();
    let resumed = finished(project.claude(&base, &["--resume", session]));
    assert_eq!(resumed["result"], "Done.", "{resumed}");
    assert_eq!(project.out().as_deref(), Some("ran\n"), "it ran once");
    let audit = cs.ok(&["audit", id]);
    assert_eq!(audit["actions"][0]["status"], "succeeded", "{audit}");
    assert_eq!(
        common::texts(&audit["approvals"], "status"),
        ["approved"],
        "one approval, not two"
    );
}

#[test]
fn given_the_http_hook_entry_when_a_lead_approves_from_another_process_then_the_command_runs_once()
{
    let cs = harness("claude-cli-http");
    let served = cs.serve();
    let token = cs.printed(&["token", "--as", "dev-bot"]).trim().to_string();
    let model = ScriptedMessages::asking_bash("toolu_01CliHttp", COMMAND);
    let settings = documented(
        "## Over HTTP",
        &[("https://countersign.example.com", served.base.clone())],
    );
    let project = Project::with_settings("http", &settings);
    let claude = project.claude_with(&model.serve(), &[("COUNTERSIGN_TOKEN", &token)], &[TASK]);

    let approval = approved_and_ran_once(&cs, &project, claude, "toolu_01CliHttp");
    assert_eq!(
        approval["requested_by"],
        serde_json::json!(["dev-bot"]),
        "the token's person asks"
    );
    let id = approval["id"].as_str().unwrap();
    handed_within_a_second_and_reported(&cs, id);
}

#[test]
fn given_the_permission_prompt_tool_when_a_lead_approves_from_another_process_then_the_command_runs_once()
 {
    let cs = harness("claude-cli-prompt");
    let model = ScriptedMessages::asking_bash("toolu_01CliPrompt", COMMAND);
    let mut settings = documented_settings(&cs);
    settings["hooks"]
        .as_object_mut()
        .unwrap()
        .remove("PreToolUse");
    let project = Project::with_settings("prompt", &settings);
    let servers = documented(
        "## The permission prompt tool",
        &[
            (
                "\"command\": \"countersign\"",
                format!("\"command\": \"{}\"", env!("CARGO_BIN_EXE_countersign")),
            ),
            ("/srv/countersign/state", cs.state().display().to_string()),
            ("/srv/countersign/examples/claude-code", claude_code_dir()),
        ],
    );
    let config = project.dir.join("countersign-mcp.json");
    std::fs::write(&config, servers.to_string()).unwrap();
    let claude = project.claude(
        &model.serve(),
        &[
            "--mcp-config",
            config.to_str().unwrap(),
            "--permission-prompt-tool",
            "mcp__countersign__permission_prompt",
            TASK,
        ],
    );

    let approval = approved_and_ran_once(&cs, &project, claude, "toolu_01CliPrompt");
    let id = approval["id"].as_str().unwrap();
    handed_within_a_second_and_reported(&cs, id);
}
