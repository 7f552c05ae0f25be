//! The npm packages the MCP tests run: the reference MCP servers as upstreams, the MCP
//! Inspector as a client, and the Claude Code CLI. The workspace's scripts/mcp-npm installs them exactly as
//! tests/npm/*/package-lock.json pins them, under `${XDG_CACHE_HOME:-~/.cache}/countersign`
//! (npm the first time, offline after); scripts/test-all runs it too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `@modelcontextprotocol/server-filesystem`: files under the directories it is given.
pub const FILESYSTEM: &str = "@modelcontextprotocol/server-filesystem";
/// `@modelcontextprotocol/server-everything`: the protocol's reference server.
pub const EVERYTHING: &str = "@modelcontextprotocol/server-everything";

/// The script that starts `package` (run it with `node`), installed on first use.
pub fn server_script(package: &str) -> PathBuf {
    let installed = installed().join("mcp-servers/node_modules").join(package);
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(installed.join("package.json")).expect("the server is installed"),
    )
    .unwrap();
    let bin = match &manifest["bin"] {
        serde_json::Value::String(bin) => bin.clone(),
        bins => bins
            .as_object()
            .and_then(|bins| bins.values().next())
            .and_then(|bin| bin.as_str())
            .expect("the package names its script")
            .to_string(),
    };
    installed.join(bin)
}

/// `@modelcontextprotocol/sdk`, the TypeScript SDK the reference servers are built on, as their
/// lock pins it: a client of it drives the gateway too. Installed on first use.
#[allow(dead_code)] // each test binary that includes this file uses what it needs
pub fn typescript_sdk() -> PathBuf {
    installed().join("mcp-servers/node_modules/@modelcontextprotocol/sdk")
}

/// The MCP Inspector's launcher, installed on first use.
#[allow(dead_code)] // each test binary that includes this file uses what it needs
pub fn inspector() -> PathBuf {
    installed().join("mcp-inspector/node_modules/.bin/mcp-inspector")
}

/// The Claude Code CLI (`claude`), as tests/npm/claude-code pins it, installed on first use.
#[allow(dead_code)] // each test binary that includes this file uses what it needs
pub fn claude_code() -> PathBuf {
    installed().join("claude-code/node_modules/.bin/claude")
}

/// The cache directory the npm sets are installed under, once scripts/mcp-npm has made them
/// match their locks (a no-op when they do).
fn installed() -> &'static Path {
    static CACHE: OnceLock<PathBuf> = OnceLock::new();
    CACHE.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|dir| dir.join("scripts/mcp-npm"))
            .find(|script| script.exists())
            .expect("the workspace's scripts/mcp-npm");
        let status = Command::new(&script)
            .status()
            .expect("scripts/mcp-npm runs");
        assert!(
            status.success(),
            "installing the MCP tests' npm packages failed: npm, and the npm registry once, are \
             needed (scripts/test-all installs them too)"
        );
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
            .join("countersign")
    })
}
