//! Driving `countersign` as real processes over one state directory.

#![allow(dead_code)]

pub mod agents;
pub mod claude_code;
pub mod orders;
pub mod server;
pub mod walkthrough;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// `countersign --state <state>` on the embedded store with the shipped example, whatever the
/// shell running the tests has configured (a model key, another store, other data files, a
/// clock offset, notifications, an OTLP endpoint).
pub fn countersign(state: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_countersign"));
    command
        .arg("--state")
        .arg(state)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("COUNTERSIGN_STORE")
        .env_remove("COUNTERSIGN_AGENTS")
        .env_remove("COUNTERSIGN_POLICY")
        .env_remove("COUNTERSIGN_PEOPLE")
        .env_remove("COUNTERSIGN_CLAIMS")
        .env_remove("COUNTERSIGN_CLOCK_OFFSET")
        .env_remove("COUNTERSIGN_NOTIFY_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    command
}

/// The address a server just spawned with a piped stdout prints on its first line
/// (`listening on <url>`). The child is stopped, and the test fails, if that line does not come
/// within `within` or says something else.
pub fn listening_url(child: &mut Child, what: &str, within: Duration) -> String {
    let stdout = child.stdout.take().expect("the server's stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(within).unwrap_or_default();
    match line.trim().strip_prefix("listening on ") {
        Some(url) => url.to_string(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} printed no address within {within:?}: first line {line:?}");
        }
    }
}

pub struct Countersign {
    state: PathBuf,
    env: Vec<(&'static str, String)>,
}

/// What a command printed for people.
pub struct Printed {
    pub exit: i32,
    pub stdout: String,
    pub stderr: String,
}

pub struct Ran {
    pub exit: i32,
    pub json: Value,
    pub stderr: String,
}

/// `countersign serve` over a harness's state, not sweeping; killed when dropped.
pub struct Served {
    child: Child,
    pub base: String,
}

impl Served {
    /// Ends the server at once, as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Countersign {
    /// `countersign serve` on a free loopback port over this state, with this harness's
    /// variables, not sweeping, so what a test sees is only what it did.
    pub fn serve(&self) -> Served {
        self.serve_with(&[])
    }

    /// [`Countersign::serve`] with more of `serve`'s flags.
    pub fn serve_with(&self, args: &[&str]) -> Served {
        let mut child = countersign(&self.state)
            .args(["serve", "--addr", "127.0.0.1:0", "--sweep-every", "0s"])
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("countersign serve starts");
        let base = listening_url(&mut child, "countersign serve", Duration::from_secs(60));
        Served { child, base }
    }

    /// The embedded store in a fresh state directory.
    pub fn fresh(name: &str) -> Self {
        Self {
            state: fresh_path(&format!("countersign-{name}")),
            env: vec![("COUNTERSIGN_STORE", "embedded".into())],
        }
    }

    /// The state directory every command of this harness works on.
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// The variables every command of this harness gets.
    pub fn env(&self) -> &[(&'static str, String)] {
        &self.env
    }

    /// Every process also gets these variables (to point it at another store).
    pub fn with_env(mut self, env: Vec<(&'static str, String)>) -> Self {
        self.env = env;
        self
    }

    /// `countersign ARGS` over this state directory, with this harness's variables.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_countersign"));
        command
            .args(args)
            .arg("--state")
            .arg(&self.state)
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("COUNTERSIGN_AGENTS")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    pub fn run(&self, args: &[&str]) -> Ran {
        let output = self
            .command(args)
            .arg("--json")
            .output()
            .expect("countersign runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let json = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
        Ran {
            exit: output.status.code().unwrap_or(-1),
            json,
            stderr: String::from_utf8_lossy(&output.stderr).into(),
        }
    }

    /// `countersign ARGS` as a person runs it, without `--json`: what it printed.
    pub fn print(&self, args: &[&str]) -> Printed {
        let output = self.command(args).output().expect("countersign runs");
        Printed {
            exit: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into(),
            stderr: String::from_utf8_lossy(&output.stderr).into(),
        }
    }

    /// [`Countersign::print`] of a command that must be refused as bad usage (exit 2) with a
    /// message on stderr saying each of `saying`.
    #[track_caller]
    pub fn refuses(&self, args: &[&str], saying: &[&str]) {
        let refused = self.print(args);
        assert_eq!(refused.exit, 2, "{args:?}: {}", refused.stderr);
        for said in saying {
            assert!(
                refused.stderr.contains(said),
                "{args:?} does not say {said:?}: {}",
                refused.stderr
            );
        }
    }

    /// [`Countersign::print`] of a command that must succeed: its stdout.
    #[track_caller]
    pub fn printed(&self, args: &[&str]) -> String {
        let printed = self.print(args);
        assert_eq!(printed.exit, 0, "{args:?} failed: {}", printed.stderr);
        printed.stdout
    }

    /// A development bearer token for `person`, as `countersign token` issues it.
    #[track_caller]
    pub fn token(&self, person: &str) -> String {
        self.printed(&["token", "--as", person]).trim().to_string()
    }

    pub fn ok(&self, args: &[&str]) -> Value {
        let ran = self.run(args);
        assert_eq!(ran.exit, 0, "{args:?} failed: {}", ran.stderr);
        ran.json
    }
}

impl Drop for Countersign {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// The one approval a paused run waits on: its id and its record.
pub fn only_approval(run: &Value) -> (String, Value) {
    let approvals = run["approvals"]
        .as_array()
        .expect("a paused run lists its approvals");
    assert_eq!(approvals.len(), 1, "{run}");
    (
        approvals[0]["id"].as_str().unwrap().to_string(),
        approvals[0].clone(),
    )
}

/// A path in the temporary directory that no other test, process or run uses: `prefix`, this
/// process's id and the time in nanoseconds.
pub fn fresh_path(prefix: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()))
}

/// Runs `command` (`what`, in messages) and checks it succeeded: what it printed.
pub fn stdout_of(command: &mut Command, what: &str) -> Vec<u8> {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The text `field` of every item of the JSON array `list`, in order.
#[track_caller]
pub fn texts<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .map(|item| item[field].as_str().unwrap())
        .collect()
}

/// The first item of the JSON array `list` whose `field` is `value`.
#[track_caller]
pub fn item_where<'a>(list: &'a Value, field: &str, value: &str) -> &'a Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .find(|item| item[field] == value)
        .unwrap_or_else(|| panic!("no item whose {field} is {value} in {list}"))
}

/// Serves `app` on loopback, on a runtime of its own thread: its base URL, `http://127.0.0.1:…`.
pub fn serve_on_a_thread(app: axum::Router) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    url
}

/// Where the tests' Python tools are installed, as scripts/test-all installs them.
pub fn tools_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
        .join("countersign")
}

/// The Python of the venv `venv` (under [`tools_cache`]) that has `package` at the version the
/// requirements file `requirements` pins (`package==version`), installed there from PyPI on
/// first use.
pub fn pinned_python(venv: &str, requirements: &str, package: &str) -> PathBuf {
    let venv = tools_cache().join(venv);
    let python = venv.join("bin").join("python");
    let pinned = std::fs::read_to_string(requirements).unwrap();
    let version = pinned
        .lines()
        .find_map(|line| line.trim().strip_prefix(&format!("{package}==")))
        .unwrap_or_else(|| panic!("{requirements} pins no {package}"))
        .to_string();
    if installed(&python, package).as_deref() != Some(version.as_str()) {
        install(Command::new("python3").arg("-m").arg("venv").arg(&venv));
        install(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "-r",
            requirements,
        ]));
        assert_eq!(
            installed(&python, package).as_deref(),
            Some(version.as_str())
        );
    }
    python
}

/// The version of `package` that `python` has, if any.
fn installed(python: &Path, package: &str) -> Option<String> {
    let output = Command::new(python)
        .args([
            "-c",
            &format!("import importlib.metadata as m; print(m.version({package:?}))"),
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[track_caller]
fn install(command: &mut Command) {
    let status = command.status().expect("the installer runs");
    assert!(
        status.success(),
        "installing a test tool failed ({command:?}): python3 with venv and pip, and PyPI once, \
         are needed (scripts/test-all installs them too)"
    );
}

/// A TCP port on loopback that nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends `signal` (`TERM`, `KILL`) to the process group `child` leads, and waits for `child`.
pub fn stop_group(child: &mut Child, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}
