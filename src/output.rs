//! Writing results so that nothing is lost or half-written: summary files are written whole to
//! a temporary file beside their path and renamed into place (a crash or a full disk leaves
//! the old file or none, never a torn one), and an output directory is locked while a run
//! writes into it, so two runs never interleave their rows.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically: a sibling temporary file, synced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether two paths name the same file or directory (`./x` and `x`, a link and its target),
/// or are spelled alike.
pub fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Name of the lock file a run holds in its output directory.
pub const LOCK_FILE: &str = ".tandem.lock";

/// Why an output directory cannot be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{dir}: another tandem run (pid {pid}) is writing into this directory; wait for it to \
         finish or choose another output directory",
        dir = .dir.display()
    )]
    Held { dir: PathBuf, pid: String },
    #[error("{path}: cannot lock: {source}", path = .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An advisory lock on an output directory, held until dropped. The lock file records the
/// owner's pid; the operating system releases the lock when its process dies, so a stale lock
/// file left by a killed run is simply taken over.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (created if missing), or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // A lock this process released can outlive its release for a moment: a child being
        // spawned by another thread holds a copy of the descriptor until it execs. So a lock
        // that names this process is retried for up to a second before it counts as held.
        let mut retries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut pid = String::new();
                    file.rewind().map_err(io)?;
                    file.read_to_string(&mut pid).map_err(io)?;
                    let pid = pid.trim();
                    if pid == std::process::id().to_string() && retries < 100 {
                        retries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        continue;
                    }
                    return Err(LockError::Held {
                        dir: dir.to_path_buf(),
                        pid: if pid.is_empty() { "unknown" } else { pid }.to_string(),
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(DirLock { _file: file })
    }
}
