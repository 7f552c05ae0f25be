//! An upstream MCP server started as a local process over stdio: the protocol's reference
//! "everything" server (npm, pinned in tests/npm/servers), run by `node`. It is started
//! when first needed, sees only the environment it is given (its `env` values never come back
//! in a result), is started again when it has exited, and a call in flight when it dies is an
//! unknown outcome, never sent again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use shared::adapters::mcp_tool::{McpError, McpServer, McpServerBinding};
use shared::domain::action::ToolOutcome;

use super::{answered, call, mcp_servers, secret_forms};

/// The value the binding's `env` gives the server: a secret, which a JSON string escapes.
const GREETING: &str = "hello \"from\" the binding";

/// The everything server over stdio, through `sh` so the test knows the server's process id
/// (the shell writes it to `pid_file`, then becomes the server).
async fn everything(pid_file: &Path) -> McpServer {
    let script = mcp_servers::server_script(mcp_servers::EVERYTHING);
    let text = format!(
        r#"
        [mcp.everything]
        command = "sh"
        args = ["-c", "echo $$ > '{}'; exec node '{}' stdio"]
        env = {{ GREETING = "${{TEST_GREETING}}" }}
        timeout = "20s"
        "#,
        pid_file.display(),
        script.display()
    );
    #[derive(serde::Deserialize)]
    struct Definition {
        mcp: BTreeMap<String, McpServerBinding>,
    }
    let definition: Definition = toml::from_str(&text).unwrap();
    let env = |name: &str| (name == "TEST_GREETING").then(|| GREETING.to_string());
    let resolved = definition.mcp["everything"]
        .resolve("mcp.everything", &env)
        .unwrap();
    McpServer::connect(resolved)
        .await
        .expect("the server starts")
}

fn pid(pid_file: &Path) -> u32 {
    std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn kill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "countersign-stdio-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_stdio_server_is_started_lists_its_tools_and_sees_only_the_environment_it_is_given() {
    let dir = scratch("env");
    let server = everything(&dir.join("pid")).await;
    let tools = server.tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.remote_name()).collect();
    assert!(
        names.contains(&"echo") && names.contains(&"get-env"),
        "{names:?}"
    );

    let echo = server.tool("echo").await.unwrap();
    let echoed = call(&echo, json!({"message": "over stdio"}), "act-s1:1").await;
    let result = answered(&echoed);
    assert!(result.to_string().contains("over stdio"), "{result}");

    let get_env = server.tool("get-env").await.unwrap();
    let answer = answered(&call(&get_env, json!({}), "act-s2:1").await);
    // The server echoes its environment, as JSON in a text block: the binding's value reached
    // it, and comes back as the variable's name.
    let text = answer["content"][0]["text"].as_str().unwrap();
    secret_forms::assert_no_secret_in("get-env's result", text.as_bytes(), &[GREETING]);
    let seen = serde_json::from_str::<Value>(text).unwrap().to_string();
    assert!(seen.contains(r#""GREETING":"${TEST_GREETING}""#), "{seen}");
    assert!(seen.contains("PATH"), "{seen}");
    // This process's own settings (cargo gives a test its manifest's directory) stay here.
    assert!(!seen.contains("CARGO_MANIFEST_DIR"), "{seen}");

    let pid = pid(&dir.join("pid"));
    assert!(alive(pid));
    drop((echo, get_env, tools, server));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!alive(pid), "the server's process outlived its session");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_stdio_server_that_has_exited_is_started_again_for_the_next_call() {
    let dir = scratch("restart");
    let server = everything(&dir.join("pid")).await;
    let echo = server.tool("echo").await.unwrap();
    let first = pid(&dir.join("pid"));
    kill(first);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let answer = call(&echo, json!({"message": "again"}), "act-s3:1").await;
    assert!(
        answered(&answer).to_string().contains("again"),
        "{answer:?}"
    );
    let second = pid(&dir.join("pid"));
    assert_ne!(first, second, "a new process answered");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_call_in_flight_when_the_server_dies_is_unknown_and_not_sent_again() {
    let dir = scratch("dies");
    let server = everything(&dir.join("pid")).await;
    let slow = server.tool("trigger-long-running-operation").await.unwrap();
    let first = pid(&dir.join("pid"));
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        kill(first);
    });
    let answer = call(&slow, json!({"duration": 5, "steps": 5}), "act-s4:1").await;
    killer.await.unwrap();
    let ToolOutcome::Unknown { detail } = &answer else {
        panic!("{answer:?}");
    };
    assert!(detail.contains("may have taken effect"), "{detail}");
    // What the server last wrote to its stderr, read to its end before the outcome was told.
    assert!(
        detail.contains("its stderr said: Starting default (STDIO) server..."),
        "{detail}"
    );
    // Nothing started the server again to send the call a second time.
    assert_eq!(pid(&dir.join("pid")), first);
    std::fs::remove_dir_all(dir).ok();
}

/// A stdio server, the shell script `script`, that exits before it answers `initialize`; its
/// `env` gives it `${NOTES_DIR}` as `DIR`.
async fn failing_to_start(script: &str) -> McpError {
    let dir = scratch("failing");
    let file = dir.join("server.sh");
    std::fs::write(&file, format!("{script}\nexit 1\n")).unwrap();
    let text = format!(
        r#"
        [mcp.notes]
        command = "sh"
        args = ['{}']
        env = {{ DIR = "${{NOTES_DIR}}" }}
        timeout = "10s"
        "#,
        file.display()
    );
    #[derive(serde::Deserialize)]
    struct Definition {
        mcp: BTreeMap<String, McpServerBinding>,
    }
    let definition: Definition = toml::from_str(&text).unwrap();
    let env = |name: &str| (name == "NOTES_DIR").then(|| NOTES_DIR.to_string());
    let resolved = definition.mcp["notes"].resolve("mcp.notes", &env).unwrap();
    let error = McpServer::connect(resolved).await.unwrap_err();
    std::fs::remove_dir_all(dir).ok();
    error
}

/// A directory the binding names: a secret, as every value a `${VAR}` fills in.
const NOTES_DIR: &str = "/srv/private-notes-4471";

#[tokio::test]
async fn a_stdio_server_that_will_not_start_is_unreachable_in_its_own_last_words() {
    let error = failing_to_start(
        r#"for n in 1 2 3 4 5; do echo "noise $n" >&2; done
printf 'Error: Access denied - %s\n' "$DIR" >&2
printf 'None of the specified directories are accessible\r\033[2K\n' >&2"#,
    )
    .await;

    let McpError::Unreachable { server, detail } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(server, "notes");
    // The transport's reason, then the last five lines: redacted, escaped, in order.
    assert!(
        detail.ends_with(
            r"; its stderr said: noise 3 | noise 4 | noise 5 | Error: Access denied - ${NOTES_DIR} | None of the specified directories are accessible\r\u{1b}[2K"
        ),
        "{detail}"
    );
    assert!(!detail.contains("noise 2"), "{detail}");
    secret_forms::assert_no_secret_in("the error", error.to_string().as_bytes(), &[NOTES_DIR]);
}

#[tokio::test]
async fn a_long_stderr_line_is_quoted_cut_short() {
    let long = "x".repeat(1000);
    let error = failing_to_start(&format!("echo {long} >&2")).await;

    let detail = error.to_string();
    let quoted = detail.split("its stderr said: ").nth(1).unwrap();
    assert_eq!(quoted, format!("{}…", "x".repeat(240)));
}
