//! Thread-safe memo of schedules: a unique layer's graph is scheduled once per core
//! configuration and hardware, however many layers, micro-batches or plans reuse it.

use super::{CoreCounts, Schedule, ScheduleError, ScheduleProblem, SolverOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    signature: String,
    cores: CoreCounts,
    hardware: String,
}

/// Memoised [`super::schedule`] under fixed [`SolverOptions`]. Concurrent requests for one key
/// compute it once; the others wait for that result.
#[derive(Debug)]
pub struct ScheduleCache {
    options: SolverOptions,
    entries: Mutex<HashMap<CacheKey, Arc<OnceLock<Arc<Schedule>>>>>,
}

impl ScheduleCache {
    pub fn new(options: SolverOptions) -> Result<Self, ScheduleError> {
        options.validate()?;
        Ok(ScheduleCache {
            options,
            entries: Mutex::new(HashMap::new()),
        })
    }

    pub fn options(&self) -> &SolverOptions {
        &self.options
    }

    /// The schedule of `problem`, computed on the first request for this key.
    ///
    /// `signature` must identify the operator graph and its costs up to everything but the
    /// core counts (e.g. layer signature, direction, micro-batch); `hardware_key` whatever
    /// else of the chip changes operator latencies or energies. Problems sharing a key are
    /// assumed identical.
    pub fn get_or_compute(
        &self,
        signature: &str,
        hardware_key: &str,
        problem: &ScheduleProblem,
    ) -> Result<Arc<Schedule>, ScheduleError> {
        problem.validate()?;
        let key = CacheKey {
            signature: signature.to_string(),
            cores: problem.cores,
            hardware: hardware_key.to_string(),
        };
        let cell = {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(entries.entry(key).or_default())
        };
        Ok(Arc::clone(cell.get_or_init(|| {
            Arc::new(super::solve_valid(problem, &self.options))
        })))
    }

    /// Number of keys requested so far.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
