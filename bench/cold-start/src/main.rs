//! Cold start and size of the Lambda functions, against a hello-world `lambda_runtime` binary
//! built with the same profile.
//!
//! For each binary it starts the process with a Lambda-like environment whose
//! `AWS_LAMBDA_RUNTIME_API` points at a stub on loopback, and records the time from just before
//! the process is spawned to the moment the stub receives its first
//! `GET /2018-06-01/runtime/invocation/next`: everything the function does before it can take
//! an event. The stub never answers; the process is killed once the request arrived.
//! The binaries are started in turn, one start of each per round, so that the machine's load
//! weighs on them alike.
//!
//! ```text
//! cold-start [--runs N] [--bin-dir target/release] [--lambda-dir target/lambda]
//!            [--baseline hello-lambda] [--env KEY=VALUE]... NAME...
//! ```
//!
//! `--env` adds to (or overrides) the Lambda-like environment every process gets.
//!
//! Sizes: the binary in `--bin-dir` (the build that runs here), and, when present, the arm64
//! packages `cargo lambda build --release --arm64` left in `--lambda-dir/NAME/`
//! (`bootstrap`, and `bootstrap.zip` with `--output-format zip`).

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NEXT: &str = "GET /2018-06-01/runtime/invocation/next";
/// How long one start may take before it counts as failed.
const PATIENCE: Duration = Duration::from_secs(20);

struct Options {
    runs: usize,
    bin_dir: PathBuf,
    lambda_dir: PathBuf,
    baseline: String,
    env: Vec<(String, String)>,
    names: Vec<String>,
}

fn usage(why: &str) -> ExitCode {
    eprintln!("error: {why}");
    eprintln!(
        "usage: cold-start [--runs N] [--bin-dir DIR] [--lambda-dir DIR] [--baseline NAME] [--env KEY=VALUE]... NAME..."
    );
    ExitCode::from(2)
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        runs: 30,
        bin_dir: PathBuf::from("target/release"),
        lambda_dir: PathBuf::from("target/lambda"),
        baseline: "hello-lambda".into(),
        env: Vec::new(),
        names: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--runs" => {
                options.runs = value("--runs")?
                    .parse()
                    .map_err(|_| "--runs takes a number".to_string())?
            }
            "--bin-dir" => options.bin_dir = value("--bin-dir")?.into(),
            "--lambda-dir" => options.lambda_dir = value("--lambda-dir")?.into(),
            "--baseline" => options.baseline = value("--baseline")?,
            "--env" => {
                let pair = value("--env")?;
                let (key, val) = pair
                    .split_once('=')
                    .ok_or(format!("--env takes KEY=VALUE, not {pair:?}"))?;
                options.env.push((key.to_string(), val.to_string()));
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            name => options.names.push(name.to_string()),
        }
    }
    if options.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    if !options.names.contains(&options.baseline) {
        options.names.insert(0, options.baseline.clone());
    }
    Ok(options)
}

/// The environment Lambda gives a `provided.al2023` function, with the Countersign variables
/// template.yaml sets. Nothing is inherited from this process, so the figures do not depend on
/// the shell they were taken from.
fn lambda_env(name: &str, runtime_api: &str) -> Vec<(&'static str, String)> {
    let region = "us-east-1";
    vec![
        ("AWS_LAMBDA_RUNTIME_API", runtime_api.to_string()),
        ("AWS_LAMBDA_FUNCTION_NAME", format!("countersign-{name}")),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128".into()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".into()),
        (
            "AWS_LAMBDA_LOG_GROUP_NAME",
            format!("/aws/lambda/countersign-{name}"),
        ),
        (
            "AWS_LAMBDA_LOG_STREAM_NAME",
            "2026/01/01/[$LATEST]0123456789abcdef".into(),
        ),
        ("AWS_LAMBDA_LOG_FORMAT", "JSON".into()),
        ("AWS_REGION", region.into()),
        ("AWS_DEFAULT_REGION", region.into()),
        ("AWS_ACCESS_KEY_ID", "ASIABENCHBENCHBENCH0".into()),
        (
            "AWS_SECRET_ACCESS_KEY",
            "bench-secret-key-not-used-for-anything".into(),
        ),
        ("AWS_SESSION_TOKEN", "bench-session-token".into()),
        ("LAMBDA_TASK_ROOT", "/var/task".into()),
        ("LAMBDA_RUNTIME_DIR", "/var/runtime".into()),
        ("_HANDLER", "bootstrap".into()),
        ("TZ", ":UTC".into()),
        ("LANG", "en_US.UTF-8".into()),
        ("PATH", "/usr/local/bin:/usr/bin/:/bin:/opt/bin".into()),
        ("RUST_LOG", "info".into()),
        ("COUNTERSIGN_STORE", "dynamodb".into()),
        ("COUNTERSIGN_TABLE", "countersign-Table".into()),
        (
            "COUNTERSIGN_QUEUE_URL",
            format!("https://sqs.{region}.amazonaws.com/123456789012/countersign-resume.fifo"),
        ),
        ("COUNTERSIGN_SCHEDULE_GROUP", "countersign-wakeups".into()),
        (
            "COUNTERSIGN_SCHEDULER_ROLE_ARN",
            "arn:aws:iam::123456789012:role/countersign-SchedulerRole".into(),
        ),
        (
            "COUNTERSIGN_SWEEP_ARN",
            format!("arn:aws:lambda:{region}:123456789012:function:countersign-sweep"),
        ),
    ]
}

/// Reads one HTTP request line from a connection.
fn request_line(stream: TcpStream) -> Option<String> {
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    Some(line.trim_end().to_string())
}

/// One cold start: spawn, wait for the first `next`, kill. Returns the time to that request.
fn one_start(binary: &Path, name: &str, extra: &[(String, String)]) -> Result<Duration, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let runtime_api = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let (seen, arrived) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let at = Instant::now();
            let line = request_line(stream.try_clone().expect("a socket clones"));
            // Keep the connection open and unanswered, as a runtime API with no event would.
            std::mem::forget(stream);
            if seen.send((at, line)).is_err() {
                return;
            }
        }
    });
    let mut command = Command::new(binary);
    command
        .env_clear()
        .envs(lambda_env(name, &runtime_api))
        .envs(extra.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let spawned = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let outcome = match arrived.recv_timeout(PATIENCE) {
        Ok((at, Some(line))) if line.starts_with(NEXT) => Ok(at - spawned),
        Ok((_, line)) => Err(format!(
            "the first request was not `next`: {}",
            line.unwrap_or_default()
        )),
        Err(_) => Err(format!("no request within {PATIENCE:?}")),
    };
    stop(&mut child, outcome)
}

fn stop(child: &mut Child, outcome: Result<Duration, String>) -> Result<Duration, String> {
    let exited_early = child.try_wait().ok().flatten();
    let _ = child.kill();
    let _ = child.wait();
    match (outcome, exited_early) {
        (Ok(took), _) => Ok(took),
        (Err(why), status) => {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            let status = status
                .map(|s| format!(" (exited: {s})"))
                .unwrap_or_default();
            Err(format!("{why}{status}; stderr: {}", stderr.trim()))
        }
    }
}

fn size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

fn mib(bytes: Option<u64>) -> String {
    bytes
        .map(|b| format!("{:.2} MiB", b as f64 / 1_048_576.0))
        .unwrap_or_else(|| "-".into())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The value at quantile `q` of sorted samples (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

struct Row {
    name: String,
    arm64: Option<u64>,
    arm64_zip: Option<u64>,
    native: Option<u64>,
    samples: Vec<Duration>,
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(why) => return usage(&why),
    };
    let mut binaries = Vec::new();
    for name in &options.names {
        let binary = options.bin_dir.join(name);
        if !binary.exists() {
            return usage(&format!("no binary {}", binary.display()));
        }
        // One start first, not counted: it brings the binary into the page cache.
        if let Err(why) = one_start(&binary, name, &options.env) {
            eprintln!("error: {name}: {why}");
            return ExitCode::FAILURE;
        }
        binaries.push(binary);
    }
    // The binaries are started in turn, one start of each per round, so that a change in the
    // machine's load during the run weighs on each of them alike, the baseline included.
    let mut taken = vec![Vec::with_capacity(options.runs); binaries.len()];
    for _ in 0..options.runs {
        for ((binary, name), samples) in binaries.iter().zip(&options.names).zip(&mut taken) {
            match one_start(binary, name, &options.env) {
                Ok(took) => samples.push(took),
                Err(why) => {
                    eprintln!("error: {name}: {why}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let mut rows = Vec::new();
    for ((name, binary), mut samples) in options.names.iter().zip(&binaries).zip(taken) {
        samples.sort();
        let package = options.lambda_dir.join(name);
        rows.push(Row {
            name: name.clone(),
            arm64: size(&package.join("bootstrap")),
            arm64_zip: size(&package.join("bootstrap.zip")),
            native: size(binary),
            samples,
        });
    }
    let baseline = rows
        .iter()
        .find(|r| r.name == options.baseline)
        .map(|r| quantile(&r.samples, 0.5))
        .expect("the baseline was measured");
    println!(
        "cold start: process start to the first GET .../invocation/next on a loopback stub, {} runs each (after one uncounted)",
        options.runs
    );
    println!(
        "{:<13} {:>13} {:>13} {:>13} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "binary", "arm64", "arm64 zip", "here", "min ms", "p50 ms", "p90 ms", "max ms", "p50/base"
    );
    for row in &rows {
        let p50 = quantile(&row.samples, 0.5);
        println!(
            "{:<13} {:>13} {:>13} {:>13} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2}",
            row.name,
            mib(row.arm64),
            mib(row.arm64_zip),
            mib(row.native),
            ms(row.samples[0]),
            ms(p50),
            ms(quantile(&row.samples, 0.9)),
            ms(*row.samples.last().expect("at least one run")),
            ms(p50) / ms(baseline),
        );
    }
    ExitCode::SUCCESS
}
