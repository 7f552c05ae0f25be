//! The reference MCP servers from npm (pinned in the workspace's tests/mcp-servers.txt), which
//! the tests run as upstream servers: installed once under
//! `${XDG_CACHE_HOME:-~/.cache}/countersign/mcp-servers` (npm the first time, offline after),
//! as scripts/test-all installs them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const PINS: &str = include_str!("../../../tests/mcp-servers.txt");

/// `@modelcontextprotocol/server-filesystem`: files under the directories it is given.
pub const FILESYSTEM: &str = "@modelcontextprotocol/server-filesystem";
/// `@modelcontextprotocol/server-everything`: the protocol's reference server.
pub const EVERYTHING: &str = "@modelcontextprotocol/server-everything";

/// The script that starts `package` (run it with `node`), installed on first use.
pub fn server_script(package: &str) -> PathBuf {
    let prefix = installed();
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(manifest(prefix, package)).expect("the server is installed"),
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
    prefix.join("node_modules").join(package).join(bin)
}

fn manifest(prefix: &Path, package: &str) -> PathBuf {
    prefix
        .join("node_modules")
        .join(package)
        .join("package.json")
}

fn installed() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let prefix = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
            .join("countersign/mcp-servers");
        let pins: Vec<&str> = PINS
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let version_of = |package: &str| {
            let text = std::fs::read_to_string(manifest(&prefix, package)).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            json["version"].as_str().map(String::from)
        };
        let missing = pins.iter().any(|pin| {
            let (package, version) = pin.rsplit_once('@').unwrap();
            version_of(package).as_deref() != Some(version)
        });
        if missing {
            std::fs::create_dir_all(&prefix).unwrap();
            let status = Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
                .arg(&prefix)
                .args(&pins)
                .status()
                .expect("npm runs");
            assert!(
                status.success(),
                "installing the reference MCP servers failed: npm, and the npm registry once, \
                 are needed (scripts/test-all installs them too)"
            );
        }
        prefix
    })
}
