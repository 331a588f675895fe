//! Units of one resource in use over time, for schedulers that place operators one by one.

/// Units of one resource in use over time: a step function.
#[derive(Debug, Clone)]
pub(crate) struct Profile {
    /// `(from_s, units)`: `units` are busy from `from_s` to the next step; the last step is 0.
    steps: Vec<(f64, u32)>,
}

impl Profile {
    pub fn new() -> Self {
        Profile {
            steps: vec![(0.0, 0)],
        }
    }

    /// Earliest start ≥ `from_s` such that at most `limit` units are busy throughout
    /// `[start, start + duration_s)`.
    pub fn earliest(&self, from_s: f64, duration_s: f64, limit: u32) -> f64 {
        let mut start_s = from_s;
        if duration_s <= 0.0 {
            return start_s;
        }
        'candidate: loop {
            let mut k = self.steps.partition_point(|s| s.0 <= start_s) - 1;
            while k < self.steps.len() && self.steps[k].0 < start_s + duration_s {
                if self.steps[k].1 > limit {
                    // The last step is idle, so a busy step always has a successor.
                    start_s = self.steps[k + 1].0;
                    continue 'candidate;
                }
                k += 1;
            }
            return start_s;
        }
    }

    /// Index of the step starting exactly at `t_s`, inserting it if needed.
    fn split_at(&mut self, t_s: f64) -> usize {
        let k = self.steps.partition_point(|s| s.0 <= t_s);
        if self.steps[k - 1].0 == t_s {
            k - 1
        } else {
            let units = self.steps[k - 1].1;
            self.steps.insert(k, (t_s, units));
            k
        }
    }

    pub fn add(&mut self, start_s: f64, end_s: f64, units: u32) {
        if end_s <= start_s {
            return;
        }
        let first = self.split_at(start_s);
        let last = self.split_at(end_s);
        for step in &mut self.steps[first..last] {
            step.1 += units;
        }
    }

    /// Unit-seconds in use within `[from_s, to_s)`.
    pub fn busy_s(&self, from_s: f64, to_s: f64) -> f64 {
        let mut busy_s = 0.0;
        let first = self
            .steps
            .partition_point(|s| s.0 <= from_s)
            .saturating_sub(1);
        for (k, &(step_s, units)) in self.steps.iter().enumerate().skip(first) {
            if step_s >= to_s {
                break;
            }
            let next_s = self.steps.get(k + 1).map_or(f64::INFINITY, |s| s.0);
            let overlap_s = next_s.min(to_s) - step_s.max(from_s);
            if overlap_s > 0.0 {
                busy_s += f64::from(units) * overlap_s;
            }
        }
        busy_s
    }
}
