//! Progress a running sweep shows from outside: each run keeps `status.json` in its output
//! directory (phase, points done of its total, rate, ETA, its host and pid), rewritten whole
//! as batches finish, so a user watching a job array sees where every shard stands
//! (`tandem status DIR…`). The file is a report of the run, not a result: it is not part of
//! the bytes a sweep guarantees.

use crate::output::write_atomic;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const STATUS_JSON: &str = "status.json";

/// Least time between two rewrites of the file while a phase runs.
const EVERY: Duration = Duration::from_secs(1);

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    Running,
    Done,
    Failed,
}

/// The contents of `status.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepStatus {
    /// `screen`, `exact` or `screen+exact`.
    pub phase: String,
    pub state: RunState,
    /// What is counted: `configurations` (screen) or `points` (exact).
    pub unit: String,
    pub done: u64,
    pub total: u64,
    /// Counted per second since the phase started (0 until something is done).
    pub rate_per_s: f64,
    /// Seconds left at that rate (absent until something is done).
    pub eta_s: Option<f64>,
    pub host: String,
    pub pid: u32,
    pub updated_unix_s: u64,
    /// Why the run failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

fn now_unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This machine's host name (where a pid can be checked).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Keeps a directory's `status.json` current for one phase of a run. Writing it is best
/// effort: a status that cannot be written never stops the sweep.
#[derive(Debug)]
pub struct StatusFile {
    path: PathBuf,
    phase: String,
    unit: String,
    total: u64,
    /// Counted before this process started (a resumed run).
    already: u64,
    /// Counted so far (the last progress reported).
    done: u64,
    started: Instant,
    last_write: Option<Instant>,
}

impl StatusFile {
    pub fn start(dir: &Path, phase: &str, unit: &str, total: u64, already: u64) -> StatusFile {
        let mut file = StatusFile {
            path: dir.join(STATUS_JSON),
            phase: phase.to_string(),
            unit: unit.to_string(),
            total,
            already,
            done: already,
            started: Instant::now(),
            last_write: None,
        };
        file.write(already, RunState::Running, "");
        file
    }

    /// Records `done` of the total, at most once a second.
    pub fn progress(&mut self, done: u64) {
        self.done = done;
        if self.last_write.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        self.write(done, RunState::Running, "");
    }

    pub fn done(&mut self) {
        self.write(self.total, RunState::Done, "");
    }

    /// Marks the run failed at the progress last reported.
    pub fn failed(&mut self, error: &str) {
        self.write(self.done, RunState::Failed, error);
    }

    fn write(&mut self, done: u64, state: RunState, error: &str) {
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let counted = done.saturating_sub(self.already);
        let rate_per_s = if elapsed_s > 0.0 {
            counted as f64 / elapsed_s
        } else {
            0.0
        };
        let status = SweepStatus {
            phase: self.phase.clone(),
            state,
            unit: self.unit.clone(),
            done,
            total: self.total,
            rate_per_s,
            eta_s: (rate_per_s > 0.0).then(|| self.total.saturating_sub(done) as f64 / rate_per_s),
            host: host_name(),
            pid: std::process::id(),
            updated_unix_s: now_unix_s(),
            error: error.to_string(),
        };
        if let Ok(json) = serde_json::to_string_pretty(&status) {
            let _ = write_atomic(&self.path, (json + "\n").as_bytes());
        }
        self.last_write = Some(Instant::now());
    }
}

/// A directory's run as `tandem status` reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum DirStatus {
    /// No `status.json` (no run has started there).
    NotStarted,
    /// The status file, and whether a run it says is running has stopped without saying so
    /// (its pid is gone on this host).
    Known { status: SweepStatus, gone: bool },
    /// `status.json` could not be read.
    Unreadable(String),
}

/// The status of the run in `dir`.
pub fn read_status(dir: &Path) -> DirStatus {
    let path = dir.join(STATUS_JSON);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return DirStatus::NotStarted,
        Err(e) => return DirStatus::Unreadable(format!("{}: {e}", path.display())),
    };
    match serde_json::from_str::<SweepStatus>(&text) {
        Ok(status) => {
            let gone = status.state == RunState::Running
                && status.host == host_name()
                && !Path::new("/proc").join(status.pid.to_string()).exists();
            DirStatus::Known { status, gone }
        }
        Err(e) => DirStatus::Unreadable(format!("{}: {e}", path.display())),
    }
}
