//! Latency summaries and the shapes a bench prints.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Serialize, Serializer};

use crate::meter::{AwsCounts, Counts, OperationName, Phase, StoreCounts, thread_cpu};

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

pub fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1000.0, 3)
}

pub fn as_ms<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(ms(*d))
}

/// A latency distribution, in milliseconds; percentiles by nearest rank.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(samples: &[Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort();
        let rank = |q: f64| {
            let r = (q * sorted.len() as f64).ceil() as usize;
            sorted[r.clamp(1, sorted.len()) - 1]
        };
        let mean = sorted.iter().sum::<Duration>() / sorted.len() as u32;
        Some(Self {
            count: sorted.len(),
            p50_ms: ms(rank(0.50)),
            p99_ms: ms(rank(0.99)),
            mean_ms: ms(mean),
            max_ms: ms(*sorted.last().expect("not empty")),
        })
    }

    pub fn line(&self) -> String {
        format!(
            "p50 {:>8.2} ms   p99 {:>8.2} ms   mean {:>8.2} ms   max {:>8.2} ms",
            self.p50_ms, self.p99_ms, self.mean_ms, self.max_ms
        )
    }
}

/// What one step (a start, a decision, a resume, one swept item) asks of the store and of AWS,
/// on average.
#[derive(Debug, Clone, Serialize)]
pub struct StepCost {
    pub store: StoreCounts,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub aws: BTreeMap<OperationName, AwsCounts>,
    pub aws_total: AwsCounts,
}

impl StepCost {
    pub fn of(counts: &Counts, phase: Phase, per: usize) -> Self {
        Self {
            store: counts.store(phase).per(per),
            aws: counts
                .aws(phase)
                .into_iter()
                .map(|(op, c)| (op, c.per(per)))
                .collect(),
            aws_total: counts.aws_total(phase).per(per),
        }
    }
}

pub fn step_table(steps: &[(&str, &StepCost)], with_aws: bool) -> String {
    let mut text = format!(
        "  {:<22} {:>6} {:>7} {:>7} {:>7}",
        "per", "reads", "items", "txns", "writes"
    );
    if with_aws {
        text.push_str(&format!(
            " {:>9} {:>7} {:>8} {:>8} {:>8} {:>9}",
            "AWS reqs", "errors", "est RRU", "est WRU", "idx WRU", "reported"
        ));
    }
    text.push('\n');
    for (name, step) in steps {
        let s = &step.store;
        text.push_str(&format!(
            "  {:<22} {:>6.2} {:>7.2} {:>7.2} {:>7.2}",
            name,
            s.reads(),
            s.items_read,
            s.transactions,
            s.writes
        ));
        if with_aws {
            let a = &step.aws_total;
            text.push_str(&format!(
                " {:>9.2} {:>7.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2}",
                a.requests,
                a.errors,
                a.estimated_rru,
                a.estimated_wru,
                a.estimated_index_wru,
                a.reported_capacity
            ));
        }
        text.push('\n');
    }
    if with_aws {
        text.push_str("  AWS requests by operation:\n");
        for (name, step) in steps {
            let ops: Vec<String> = step
                .aws
                .iter()
                .map(|(op, c)| format!("{op} {:.2}", c.requests))
                .collect();
            text.push_str(&format!("    {name:<20} {}\n", ops.join(", ")));
        }
    }
    text
}

/// Each step's writes by the condition they carry, and its one-write transactions, which go to
/// DynamoDB as a plain conditional PutItem or DeleteItem (1 WRU per KB instead of 2).
pub fn condition_table(steps: &[(&str, &StepCost)]) -> String {
    let mut text = format!(
        "  {:<22} {:>7} {:>12} {:>12} {:>9} {:>9} {:>14}\n",
        "per", "writes", "must be new", "version is", "as shown", "no check", "one-write txn"
    );
    for (name, step) in steps {
        let s = &step.store;
        text.push_str(&format!(
            "  {:<22} {:>7.2} {:>12.2} {:>12.2} {:>9.2} {:>9.2} {:>14.2}\n",
            name,
            s.writes,
            s.must_not_exist,
            s.version_is,
            s.unchanged,
            s.unconditional,
            s.single_writes
        ));
    }
    text
}

/// The one-minute load average (Linux), to print beside the timings it makes noisy.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU this process has used so far, user and system, in seconds (Linux): the figure a
/// loaded machine does not inflate the way it does wall time.
pub fn cpu_seconds() -> Option<(f64, f64)> {
    // USER_HZ, in which /proc reports CPU time, is 100 on every Linux architecture Countersign
    // runs on.
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split_whitespace();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let user: f64 = fields.nth(11)?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user / TICKS_PER_SECOND, system / TICKS_PER_SECOND))
}

/// What one commit asks of the disk, measured beside the store: the median time to write a
/// commit's WAL frames over earlier ones and fsync them, as SQLite does at each commit
/// (`synchronous=FULL`; this build of SQLite calls `fsync`), and the CPU that write and fsync
/// take on their own: the kernel's writeback, the device's requests and the wait's task
/// switches, which no change to the engine can take away.
#[derive(Debug, Clone, Copy)]
pub struct DiskFloor {
    pub frame_bytes: usize,
    pub fsync_p50: Duration,
    /// The measuring thread's CPU over the samples, per sample.
    pub cpu_per_commit: Option<Duration>,
}

impl DiskFloor {
    /// Four pages of 4 KiB with their frame headers: what a lifecycle's commit writes to the
    /// WAL at the median (BENCHMARKS.md, section 14, from `strace`).
    const FRAME_BYTES: usize = 4 * (4096 + 24);
    const SAMPLES: usize = 300;
    /// The WAL is written over from its start after each checkpoint: so are these frames.
    const SPAN: usize = 64;

    pub fn measure(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::FileExt;
        let path = dir.join("disk-floor.probe");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        let frame = vec![0x5a_u8; Self::FRAME_BYTES];
        let at = |n: usize| ((n % Self::SPAN) * Self::FRAME_BYTES) as u64;
        for n in 0..Self::SPAN {
            file.write_all_at(&frame, at(n))?;
        }
        file.sync_all()?;
        let mut samples = Vec::with_capacity(Self::SAMPLES);
        let cpu_before = thread_cpu();
        for n in 0..Self::SAMPLES {
            let started = Instant::now();
            file.write_all_at(&frame, at(n))?;
            file.sync_all()?;
            samples.push(started.elapsed());
        }
        let cpu = thread_cpu()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before) / Self::SAMPLES as u32);
        std::fs::remove_file(&path)?;
        samples.sort();
        Ok(Self {
            frame_bytes: Self::FRAME_BYTES,
            fsync_p50: samples[Self::SAMPLES / 2],
            cpu_per_commit: cpu,
        })
    }
}

/// A lifecycle's wall time and CPU beside what its commits ask of the disk alone.
#[derive(Debug, Serialize)]
pub struct Floor {
    frame_bytes: usize,
    fsync_p50_ms: f64,
    commits_per_lifecycle: f64,
    floor_ms_per_lifecycle: f64,
    /// The run's wall time over its lifecycles.
    wall_ms_per_lifecycle: f64,
    times_the_floor: f64,
    /// The CPU of one commit's write and fsync, measured alone.
    disk_cpu_ms_per_commit: Option<f64>,
    /// That, for each of a lifecycle's commits.
    disk_cpu_ms_per_lifecycle: Option<f64>,
    /// A lifecycle's CPU less its commits' write and fsync: what the engine, SQLite and the
    /// rest of the kernel's work take.
    cpu_ms_less_the_disk: Option<f64>,
}

impl Floor {
    /// `cpu_ms` is a lifecycle's CPU in the same run.
    pub fn of(
        disk: DiskFloor,
        commits_per_lifecycle: f64,
        elapsed: Duration,
        runs: usize,
        cpu_ms: Option<f64>,
    ) -> Self {
        let floor = ms(disk.fsync_p50) * commits_per_lifecycle;
        let wall = ms(elapsed) / runs as f64;
        let disk_cpu = disk.cpu_per_commit.map(|cpu| cpu.as_secs_f64() * 1000.0);
        let disk_cpu_per_lifecycle = disk_cpu.map(|cpu| cpu * commits_per_lifecycle);
        Self {
            frame_bytes: disk.frame_bytes,
            fsync_p50_ms: ms(disk.fsync_p50),
            commits_per_lifecycle,
            floor_ms_per_lifecycle: floor,
            wall_ms_per_lifecycle: wall,
            times_the_floor: wall / floor,
            disk_cpu_ms_per_commit: disk_cpu.map(|cpu| round(cpu, 4)),
            disk_cpu_ms_per_lifecycle: disk_cpu_per_lifecycle.map(|cpu| round(cpu, 3)),
            cpu_ms_less_the_disk: cpu_ms
                .zip(disk_cpu_per_lifecycle)
                .map(|(cpu, disk)| round(cpu - disk, 3)),
        }
    }

    pub fn line(&self) -> String {
        let mut line = format!(
            "  disk       fsync of a commit's {} bytes of WAL frames p50 {:.3} ms x {:.2} commits per lifecycle: a floor of {:.3} ms; a lifecycle took {:.3} ms (run time / runs): {:.2}x the floor\n",
            self.frame_bytes,
            self.fsync_p50_ms,
            self.commits_per_lifecycle,
            self.floor_ms_per_lifecycle,
            self.wall_ms_per_lifecycle,
            self.times_the_floor,
        );
        if let (Some(commit), Some(lifecycle)) =
            (self.disk_cpu_ms_per_commit, self.disk_cpu_ms_per_lifecycle)
        {
            line.push_str(&format!(
                "  disk cpu   that write and fsync took {commit:.3} ms of CPU each, measured alone: {lifecycle:.3} ms of CPU per lifecycle is the disk's"
            ));
            if let Some(rest) = self.cpu_ms_less_the_disk {
                line.push_str(&format!("; the rest, {rest:.3} ms, is the engine's, SQLite's and the rest of the kernel's"));
            }
            line.push('\n');
        }
        line
    }
}
