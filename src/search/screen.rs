//! The sweep's screen (pass 1): which design points are provably dominated, found without the
//! ILP and, for most points, without a plan search.
//!
//! Three bounds of increasing cost, a branch and bound between them:
//!
//! 1. **Work bound** (every point, no per-point plan search): a pass (one micro-batch
//!    through every layer: forward, backward, recomputation) keeps `t` devices busy for at
//!    least `t · Σ bounds` (summed schedule lower bounds), and an iteration keeps the
//!    `devices` powered for at least the fewest powered passes of any plan of width `t` that
//!    fits in memory (`B / b` working ones plus the pipeline bubble:
//!    [`powered_passes`](super::memory)), so samples/s ≤ `B · devices / min_t (t · Σ bounds ·
//!    passes_t)` over the widths some plan fits with, also capped by the peak-FLOP bound. It
//!    ignores communication and the stages' imbalance; what fits in memory is worked out
//!    once per sweep ([`super::memory`]). It is first taken with each pass's GEMMs at peak
//!    FLOP/s in place of `Σ bounds` (no layer priced); a width's layers are priced only
//!    where that leaves a point at or above the seed's staircase (below).
//! 2. **Plan bound**: the plan search on per-layer lower bounds with free communication
//!    ([`throughput_bound`]); it also finds points where no plan fits in memory.
//! 3. **Achievable**: the plan search on list schedules, a real schedule, so the exact point
//!    is at least as fast.
//!
//! Points are visited in order of falling work bound. Per workload, a staircase holds the
//! best achievable throughput at each area so far. A point whose bound is below the staircase
//! at its area is pruned (strictly dominated: some point of no larger area is faster). Any
//! other point gets its plan bound, searched only for plans that beat the staircase; if it
//! still might matter, its achievable throughput (again only above the staircase) raises the
//! staircase. Points are taken in batches of fixed size, evaluated in parallel, and the
//! staircase is updated between batches in visiting order, so the result does not depend on
//! the thread count.
//!
//! With several workloads the hardware (configuration × HBM) must also be beaten on the mean
//! over workloads, so the screen also fills in, for every hardware that has an achievable
//! throughput for some workload, one for each other workload (at its highest-bound point).
//!
//! # Blocks
//!
//! The branch and bound runs per *screen block*: configuration `c` is in block
//! `c mod blocks` ([`screen_blocks`]: a power of two, one block per 256 configurations up to
//! 64, so small spaces are one block). Block 0, a uniform sample of the space, is screened
//! first from an empty staircase, then the *pilot* screens the neighbours of the
//! configurations on its staircases, round after round ([`Sweep::seed`]); every other block
//! starts from those staircases (the seed) and raises its own copy, keeping the pilot's
//! achievable throughputs of its own points. The blocks' achievable throughputs are then
//! joined into one staircase per workload, against which every point is pruned. Any
//! achievable throughput is a real plan's, so the joined staircase is as sound as one built
//! in a single pass; and since the partition and the seed depend on the inputs alone, a
//! sweep split into shards (each screening its own blocks, `--phase screen`) prunes exactly
//! as one run does.

use super::row::Reached;
use super::sweep::{progress_bar, Sweep, SweepError};
use crate::arch::{area_breakdown, ArchConfig};
use crate::cost::CostModel;
use crate::model::{
    evaluate_faster_than, throughput_bound_after, HbmOutcome, LayerBounds, LayerWork, PlanBound,
    PlanOptions,
};
use crate::placement::RecomputeMode;
use crate::schedule::{ScheduleCache, SolverOptions};
use crate::workload::Workload;
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Instant;

/// Points priced between two staircase updates. Fixed (not the thread count) so that every
/// machine prunes the same points.
const BATCH: usize = 16;

/// One point's screen: its area, upper bound and achievable throughput (samples/s).
#[derive(Debug, Clone, Copy)]
pub(super) struct Screened {
    pub area_mm2: f64,
    /// `None`: no plan fits in memory.
    pub bound: Option<f64>,
    /// `None`: not searched, or no plan beat the staircase when it was.
    pub achievable: Option<f64>,
}

/// Time and work per stage of the screen.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct ScreenStats {
    pub work_bound_time_s: f64,
    pub plan_bound_time_s: f64,
    /// Points whose plan bound was searched.
    pub plan_bounded: u64,
    /// Points with an achievable throughput above the staircase when searched.
    pub achievable_found: u64,
    /// Configurations the pilot screened ([`Sweep::seed`]), and its time (included in the
    /// work-bound and plan-bound times).
    pub pilot_configs: u64,
    pub pilot_time_s: f64,
}

impl ScreenStats {
    /// Adds another block's times and counts.
    pub(super) fn add(&mut self, other: &ScreenStats) {
        self.work_bound_time_s += other.work_bound_time_s;
        self.plan_bound_time_s += other.plan_bound_time_s;
        self.plan_bounded += other.plan_bounded;
        self.achievable_found += other.achievable_found;
        self.pilot_configs += other.pilot_configs;
        self.pilot_time_s += other.pilot_time_s;
    }
}

/// Pass 1 over the whole space, indexed for "the best achievable at no larger area".
#[derive(Debug, Default)]
pub(super) struct Screen {
    /// By point id, the points this run evaluates (all of them unless it is one shard's
    /// exact pass); empty when pruning is off.
    pub points: HashMap<u64, Screened>,
    /// Per workload and power level ([`Sweep::lane`]): the best achievable samples/s at each
    /// area (witness: the point) of the points at that level or below.
    per_lane: Vec<Staircase>,
    /// The best mean over workloads of the hardware's (configuration × HBM) best achievable
    /// samples/s at each area (witness: the configuration). Several workloads only.
    per_hardware: Staircase,
    pub stats: ScreenStats,
}

/// A point's plan bound and achievable throughput (samples/s), as [`Sweep::refine_point`]
/// gives them.
type Refined = (Option<f64>, Option<f64>);

/// What the plan-bound and list-schedule searches of a point found ([`HbmOutcome`]), for its
/// points at other HBM sizes; `None` where a search did not run or failed.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    bound: Option<HbmOutcome>,
    achievable: Option<HbmOutcome>,
}

/// The bound on seconds per batch of the list-schedule search above `staircase` samples/s.
fn achievable_bound_s(workload: &Workload, staircase: f64) -> f64 {
    // A finite bound also skips the hunt for near misses when no plan fits.
    if staircase > 0.0 {
        workload.global_batch as f64 / staircase
    } else {
        f64::MAX
    }
}

/// Per hardware (configuration, HBM index): its area and each workload's best achievable
/// samples/s (`None` until one is found).
type HardwareBest = (f64, Vec<Option<f64>>);

/// The best value at each area, kept as a staircase: areas rising, values strictly rising
/// (keys are the areas' bits, ordered as the positive areas), each with the id that reached
/// it first.
#[derive(Debug, Default, Clone)]
pub(super) struct Staircase(BTreeMap<u64, (f64, u64)>);

impl Staircase {
    /// (area, value, witness) of the best value at an area ≤ `area_mm2`.
    pub(super) fn best_up_to(&self, area_mm2: f64) -> Option<(f64, f64, u64)> {
        self.0
            .range(..=area_mm2.to_bits())
            .next_back()
            .map(|(&k, &(v, id))| (f64::from_bits(k), v, id))
    }

    /// The best value at an area ≤ `area_mm2`, 0 when none.
    fn up_to(&self, area_mm2: f64) -> f64 {
        self.best_up_to(area_mm2).map_or(0.0, |e| e.1)
    }

    /// Records `value` reached by `id` at `area_mm2`; kept only when strictly better than
    /// what no larger area already reaches.
    pub(super) fn insert(&mut self, area_mm2: f64, value: f64, id: u64) {
        if self
            .best_up_to(area_mm2)
            .is_some_and(|(_, best, _)| best >= value)
        {
            return;
        }
        let key = area_mm2.to_bits();
        let beaten: Vec<u64> = self
            .0
            .range(key..)
            .take_while(|(_, &(v, _))| v <= value)
            .map(|(&k, _)| k)
            .collect();
        for k in beaten {
            self.0.remove(&k);
        }
        self.0.insert(key, (value, id));
    }

    /// The staircase of (area, value, id) entries; among equal values the smallest area,
    /// then the smallest id, is the witness.
    fn of(mut entries: Vec<(f64, f64, u64)>) -> Staircase {
        entries.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
        let mut stairs = Staircase::default();
        for (area, value, id) in entries {
            stairs.insert(area, value, id);
        }
        stairs
    }
}

/// Per workload and micro-batch, the unique layers at every tensor width the sweep searches
/// (widths whose layer graph cannot be built are left out; evaluation reports them).
pub(super) fn layer_work(sweep: &Sweep) -> Vec<Vec<Vec<LayerWork>>> {
    sweep
        .workloads
        .iter()
        .map(|workload| {
            let most = PlanOptions::searching(sweep.devices).max_tp;
            let widths = workload.valid_tp(sweep.fixed.tp.map_or(most, |held| held.max(most)));
            let widths: Vec<u32> = widths
                .into_iter()
                .filter(|&t| t <= sweep.devices && sweep.fixed.tp.is_none_or(|held| held == t))
                .collect();
            sweep
                .micro_batches
                .iter()
                .map(|&b| {
                    widths
                        .iter()
                        .filter_map(|&t| LayerWork::new(workload, t, b).ok())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// What one space's sweeps and comparisons work out that depends on neither the cluster size,
/// the HBM size, the power cap nor the objective, kept so that the sweeps of one space in a
/// process share it ([`Sweep::share_memo`]: a comparison's co-design, iso-power and fixed-plan
/// sweeps, a study's cluster sizes and objectives).
#[derive(Debug, Default)]
pub struct SpaceMemo {
    /// Per workload and configuration (by name, which is unique within a space), the
    /// [`LayerBounds`] of each (micro-batch, tensor width) priced so far.
    bounds: Mutex<HashMap<MemoKey, Vec<PricedWidth>>>,
    /// Per (workload name, rule, tensor width): the configuration a hardware-first rule of
    /// `compare` chose (`search::compare`).
    choices: Mutex<BTreeMap<(String, &'static str, u32), usize>>,
}

impl SpaceMemo {
    /// The configuration `rule` chose for `workload` at width `tp`, chosen by `choose` the
    /// first time.
    pub(super) fn choice<E>(
        &self,
        workload: &str,
        rule: &'static str,
        tp: u32,
        choose: impl FnOnce() -> Result<usize, E>,
    ) -> Result<usize, E> {
        let key = (workload.to_string(), rule, tp);
        if let Some(known) = self.choices.lock().ok().and_then(|m| m.get(&key).copied()) {
            return Ok(known);
        }
        let chosen = choose()?;
        if let Ok(mut memo) = self.choices.lock() {
            memo.insert(key, chosen);
        }
        Ok(chosen)
    }
}

/// (workload name, configuration name).
type MemoKey = (String, String);

/// (micro-batch, tensor width) and its bounds.
type PricedWidth = (u32, u32, LayerBounds);

impl Sweep {
    /// Per micro-batch of the sweep, the [`LayerBounds`] of workload `w` at each of its
    /// tensor widths on `arch`, from the memo where priced before.
    pub(super) fn layer_bounds(
        &self,
        w: usize,
        arch: &ArchConfig,
        cost: &CostModel,
    ) -> Result<Vec<Vec<LayerBounds>>, SweepError> {
        (0..self.layer_work[w].len())
            .map(|m| {
                let every = vec![true; self.layer_work[w][m].len()];
                let bounds = self.layer_bounds_at(w, m, arch, cost, &every)?;
                Ok(bounds.into_iter().flatten().collect())
            })
            .collect()
    }

    /// The [`LayerBounds`] of workload `w` at micro-batch index `m` and each of its tensor
    /// widths on `arch` where `needed` (by index in [`Sweep::layer_work`]; `None` at the
    /// others), from the memo where priced before.
    pub(super) fn layer_bounds_at(
        &self,
        w: usize,
        m: usize,
        arch: &ArchConfig,
        cost: &CostModel,
        needed: &[bool],
    ) -> Result<Vec<Option<LayerBounds>>, SweepError> {
        let workload = &self.workloads[w];
        let key = (workload.name.clone(), arch.name.clone());
        let poisoned = || SweepError::Input("a screen thread panicked".into());
        let known = self
            .space_memo
            .bounds
            .lock()
            .map_err(|_| poisoned())?
            .get(&key)
            .cloned()
            .unwrap_or_default();
        let mut priced = Vec::new();
        let mut out = Vec::with_capacity(self.layer_work[w][m].len());
        for (work, &needed) in self.layer_work[w][m].iter().zip(needed) {
            if !needed {
                out.push(None);
                continue;
            }
            let (b, t) = (work.micro_batch, work.tp);
            let bounds = match known.iter().find(|k| (k.0, k.1) == (b, t)) {
                Some(k) => k.2,
                None => {
                    let bounds = work.bounds(workload, cost)?;
                    priced.push((b, t, bounds));
                    bounds
                }
            };
            out.push(Some(bounds));
        }
        if !priced.is_empty() {
            let mut memo = self.space_memo.bounds.lock().map_err(|_| poisoned())?;
            let entry = memo.entry(key).or_default();
            for p in priced {
                if !entry.iter().any(|k| (k.0, k.1) == (p.0, p.1)) {
                    entry.push(p);
                }
            }
        }
        Ok(out)
    }
}

/// Screen blocks of a space of `configs` configurations: one per 256 configurations, at
/// least 1 and at most 64, rounded down to a power of two (so shard counts that are powers of
/// two split them evenly).
pub fn screen_blocks(configs: usize) -> usize {
    let blocks = (configs / 256).clamp(1, 64);
    1 << blocks.ilog2()
}

/// What every block but 0 starts from ([`Sweep::seed`]).
#[derive(Debug, Default)]
pub(super) struct Seed {
    /// Block 0's screen.
    pub block: BlockScreen,
    /// The pilot's points with an achievable throughput, by id (none in block 0).
    pub pilot: Vec<(u64, Screened)>,
    /// The pilot's times and counts.
    pub stats: ScreenStats,
}

/// The screen of one block: every point of its configurations, by id.
#[derive(Debug, Default)]
pub(super) struct BlockScreen {
    pub points: Vec<(u64, Screened)>,
    pub stats: ScreenStats,
}

pub(super) fn recompute_index(mode: RecomputeMode) -> usize {
    match mode {
        RecomputeMode::None => 0,
        RecomputeMode::Selective => 1,
        RecomputeMode::Full => 2,
    }
}

impl Sweep {
    /// Stage 1 for every point of configuration `config`, in point order. The work bound is
    /// first taken with each pass's GEMMs at peak FLOP/s in place of the layers' schedule
    /// bounds; a (workload, micro-batch, tensor width)'s layers are priced only where that
    /// bound, with the width's fewest powered passes, leaves a point at or above the
    /// staircases `seed` at the configuration's area. At the other widths the points keep it
    /// (it is below the staircase), so a point is pruned exactly when pricing every width
    /// would prune it, and a point that is not gets the same bound.
    fn work_bounds(&self, config: usize, seed: &[Staircase]) -> Result<Vec<Screened>, SweepError> {
        let arch = self.config(config)?;
        let area_mm2 = area_breakdown(&arch).total_mm2;
        let peak_flops = arch.peak_tensor_flops();
        let first = config * self.points_per_config() as usize;
        // A pass's busy device-seconds at least, at any width: its GEMMs, `m / B` of an
        // iteration's hardware FLOPs, at peak FLOP/s.
        let coarse_busy_s = |w: usize, [_, m, r]: [usize; 3]| {
            let full = self.recompute[r] == RecomputeMode::Full;
            self.hardware_flops[w][usize::from(full)] * f64::from(self.micro_batches[m])
                / (self.workloads[w].global_batch as f64 * peak_flops)
        };
        let mut out = Vec::with_capacity(self.points_per_config() as usize);
        for w in 0..self.workloads.len() {
            for h in 0..self.hbm_bytes.len() {
                for m in 0..self.micro_batches.len() {
                    for r in 0..self.recompute.len() {
                        let busy_s = coarse_busy_s(w, [h, m, r]);
                        out.push(self.work_bound(w, [h, m, r], area_mm2, peak_flops, |_| busy_s)?);
                    }
                }
            }
        }
        let mut cost = None;
        for w in 0..self.workloads.len() {
            for m in 0..self.micro_batches.len() {
                // The points of (w, m): their index in `out`, HBM and recompute indices, and
                // the staircase at their area.
                let points: Vec<(usize, [usize; 3], f64)> = (0..self.hbm_bytes.len())
                    .flat_map(|h| (0..self.recompute.len()).map(move |r| [h, m, r]))
                    .map(|[h, m, r]| {
                        let k = self.point_id(0, w, h, m, r) as usize;
                        (k, [h, m, r], seed[self.lane(first + k)].up_to(area_mm2))
                    })
                    .collect();
                if points
                    .iter()
                    .all(|&(k, _, stair)| out[k].bound.is_none_or(|b| b < stair))
                {
                    continue;
                }
                let mut needed = Vec::with_capacity(self.layer_work[w][m].len());
                for work in &self.layer_work[w][m] {
                    let mut any = false;
                    for &(_, hmr, stair) in &points {
                        let Some(width) = self.memory_fit(w, hmr)?.width(work.tp) else {
                            continue;
                        };
                        let device_s = coarse_busy_s(w, hmr) * width.powered_passes;
                        any |= self.bound_from_device_s(w, hmr[2], peak_flops, device_s) >= stair;
                    }
                    needed.push(any);
                }
                let cost = cost.get_or_insert_with(|| CostModel::new(&arch));
                let bounds = self.layer_bounds_at(w, m, &arch, cost, &needed)?;
                for (k, hmr, _) in points {
                    let coarse = coarse_busy_s(w, hmr);
                    let index = recompute_index(self.recompute[hmr[2]]);
                    out[k] = self.work_bound(w, hmr, area_mm2, peak_flops, |width| {
                        bounds[width].map_or(coarse, |b| b.busy_s[index])
                    })?;
                }
            }
        }
        Ok(out)
    }

    /// The work bound of workload `w`'s point at (HBM, micro-batch, recompute) indices
    /// `[h, m, r]` on a configuration of `area_mm2` and `peak_flops`, from each pass's busy
    /// device-seconds at least per width (`busy_s(index in [`Sweep::layer_work`])`).
    fn work_bound(
        &self,
        w: usize,
        [h, m, r]: [usize; 3],
        area_mm2: f64,
        peak_flops: f64,
        busy_s: impl Fn(usize) -> f64,
    ) -> Result<Screened, SweepError> {
        let fit = self.memory_fit(w, [h, m, r])?;
        // Device-seconds per batch at least: over the widths some plan fits with, one pass's
        // busy device-seconds times the passes the cluster stays powered. Where none fits,
        // the point has no plan.
        let least_device_s = self.layer_work[w][m]
            .iter()
            .enumerate()
            .filter_map(|(k, work)| Some(busy_s(k) * fit.width(work.tp)?.powered_passes))
            .fold(f64::INFINITY, f64::min);
        Ok(Screened {
            area_mm2,
            bound: fit
                .any()
                .then(|| self.bound_from_device_s(w, r, peak_flops, least_device_s)),
            achievable: None,
        })
    }

    /// Samples/s of workload `w` at recompute index `r` at most, when a batch keeps the
    /// devices powered for `device_s` device-seconds at least, capped by the peak-FLOP bound
    /// (alone where `device_s` says nothing).
    fn bound_from_device_s(&self, w: usize, r: usize, peak_flops: f64, device_s: f64) -> f64 {
        let peak = self.peak_flop_bound(w, self.recompute[r], peak_flops);
        if device_s > 0.0 && device_s.is_finite() {
            let batch = self.workloads[w].global_batch as f64;
            (batch * f64::from(self.devices) / device_s).min(peak)
        } else {
            peak
        }
    }

    /// Stages 2 and 3 for point `id`, searching only for plans above `staircase` samples/s
    /// (0: every plan). Returns its bound and achievable throughput.
    ///
    /// `known` holds, per point of `id`'s (configuration, workload, micro-batch, recompute),
    /// what the searches of its latest point at another HBM size found ([`Known`]); where that
    /// settles this point's searches (at no more HBM, see [`HbmOutcome::settles`]) they are not
    /// run: the results are the same. This point's outcomes join them.
    fn refine_point(
        &self,
        id: usize,
        work_bound: f64,
        staircase: f64,
        known: &Mutex<HashMap<usize, Known>>,
    ) -> Result<Refined, SweepError> {
        let (config, w, h) = self.point_hardware(id);
        let sibling = id - h * self.points_per_hardware();
        let before = known
            .lock()
            .map_err(|_| SweepError::Input("a screen thread panicked".into()))?
            .get(&sibling)
            .copied()
            .unwrap_or_default();
        let mut now = Known::default();
        let result = self.refine_known(id, config, w, work_bound, staircase, &before, &mut now);
        // An outcome at a larger HBM size still settles searches at smaller ones.
        let merged = Known {
            bound: now.bound.or(before.bound),
            achievable: now.achievable.or(before.achievable),
        };
        known
            .lock()
            .map_err(|_| SweepError::Input("a screen thread panicked".into()))?
            .insert(sibling, merged);
        result
    }

    /// [`Sweep::refine_point`] for point `id` of `config` and workload `w`, from the outcomes
    /// `before` at another HBM size, writing this point's into `now`.
    #[allow(clippy::too_many_arguments)]
    fn refine_known(
        &self,
        id: usize,
        config: usize,
        w: usize,
        work_bound: f64,
        staircase: f64,
        before: &Known,
        now: &mut Known,
    ) -> Result<Refined, SweepError> {
        let workload = &self.workloads[w];
        let cost = CostModel::new(&self.config(config)?);
        let options = self.point_options(id);
        let hbm_bytes = options.hbm_bytes.unwrap_or(cost.arch().hbm.capacity_bytes);
        let found =
            throughput_bound_after(workload, &cost, &options, staircase, before.bound.as_ref());
        let bound = match found {
            Ok((PlanBound::NoPlanFits, outcome)) => {
                now.bound = outcome;
                return Ok((None, None));
            }
            Ok((PlanBound::Below(b), outcome)) => {
                now.bound = outcome;
                return Ok((Some(b.min(work_bound)), None));
            }
            Ok((PlanBound::AtMost(b), outcome)) => {
                now.bound = outcome;
                b.min(work_bound)
            }
            // Whatever stops the bound stops the evaluation too; it reports the reason.
            Err(_) => work_bound,
        };
        if bound < staircase {
            return Ok((Some(bound), None));
        }
        let bound_s = achievable_bound_s(workload, staircase);
        if let Some(settled) = before
            .achievable
            .as_ref()
            .and_then(|k| k.settles(hbm_bytes, bound_s))
        {
            let peak = before.achievable.and_then(|k| k.best).map_or(0, |b| b.2);
            now.achievable = Some(HbmOutcome {
                hbm_bytes,
                bound_s,
                best: settled.map(|(t, s)| (t, s, peak)),
            });
            return Ok((Some(bound), settled.map(|(_, s)| s)));
        }
        let best = self.achievable_plan(workload, &cost, &options, staircase)?;
        now.achievable = best.map(|best| HbmOutcome {
            hbm_bytes,
            bound_s,
            best,
        });
        Ok((Some(bound), best.flatten().map(|b| b.1)))
    }

    /// Samples/s of the best list-schedule plan above `staircase` samples/s (0: any plan).
    pub(super) fn achievable(
        &self,
        workload: &Workload,
        cost: &CostModel,
        options: &PlanOptions,
        staircase: f64,
    ) -> Result<Option<f64>, SweepError> {
        Ok(self
            .achievable_plan(workload, cost, options, staircase)?
            .flatten()
            .map(|b| b.1))
    }

    /// The best list-schedule plan above `staircase` samples/s (0: any plan): `Some` of its
    /// (seconds per batch, samples/s, largest per-device memory), or of `None` when no plan
    /// is above; `None` when the search failed.
    #[allow(clippy::type_complexity)]
    fn achievable_plan(
        &self,
        workload: &Workload,
        cost: &CostModel,
        options: &PlanOptions,
        staircase: f64,
    ) -> Result<Option<Option<(f64, f64, u64)>>, SweepError> {
        let heuristic = ScheduleCache::new(SolverOptions {
            use_ilp: false,
            ..self.solver
        })?;
        let bound_s = achievable_bound_s(workload, staircase);
        Ok(
            evaluate_faster_than(workload, cost, options, &heuristic, bound_s)
                .ok()
                .map(|e| {
                    e.map(|e| {
                        (
                            e.plan.time_per_batch_s,
                            e.plan.throughput_samples_per_s,
                            e.plan.peak_memory_bytes,
                        )
                    })
                }),
        )
    }

    /// Whether this sweep screens at all (pruning on, and an objective the bound speaks to).
    pub(super) fn screens(&self) -> bool {
        self.prune && self.objective != super::Objective::Energy
    }

    /// The screen of the whole space (pass 1): every block, joined; an empty one when pruning
    /// is off.
    pub(super) fn screen(&self, progress: bool) -> Result<Screen, SweepError> {
        if !self.screens() {
            return Ok(Screen::default());
        }
        let blocks: Vec<usize> = (0..screen_blocks(self.space.len())).collect();
        let screened = self.screen_of_blocks(&blocks, None, progress, |_| {})?;
        Ok(Screen::join(self, screened, |_| true))
    }

    /// The screens of `blocks` (the seed first, unless `seed` gives it: it seeds the other
    /// blocks' staircases), one after another, each block's points in parallel;
    /// `done(configs)` after each block. Returns the screens of `blocks` only.
    pub(super) fn screen_of_blocks(
        &self,
        blocks: &[usize],
        seed: Option<Seed>,
        progress: bool,
        mut done: impl FnMut(u64),
    ) -> Result<Vec<BlockScreen>, SweepError> {
        let count = screen_blocks(self.space.len());
        let configs_of = |b: usize| self.configs_in_block(b) as u64;
        let total: u64 = blocks.iter().map(|&b| configs_of(b)).sum();
        let bar = progress_bar(progress, total, "screening", "configurations");
        // A seed worked out here counts in this run's times.
        let (seed, mut pilot_stats) = match seed {
            Some(seed) => (seed, None),
            None => {
                let seed = self.seed()?;
                let stats = seed.stats;
                (seed, Some(stats))
            }
        };
        let stairs = self.seed_staircases(&seed);
        let pilot: HashMap<u64, f64> = seed
            .pilot
            .iter()
            .filter_map(|&(id, p)| Some((id, p.achievable?)))
            .collect();
        let mut screened = Vec::with_capacity(blocks.len());
        let mut finished = 0;
        let mut seed_block = Some(seed.block);
        for &b in blocks {
            let mut block = match b {
                0 => seed_block
                    .take()
                    .ok_or_else(|| SweepError::Input("block 0 is listed twice".into()))?,
                _ => self.screen_block(b, count, &stairs, &pilot)?,
            };
            if let Some(stats) = pilot_stats.take() {
                block.stats.add(&stats);
            }
            screened.push(block);
            finished += configs_of(b);
            bar.set_position(finished);
            done(finished);
        }
        bar.finish_and_clear();
        Ok(screened)
    }

    /// Configurations in block `block`: those `c` with `c mod blocks = block`.
    pub(super) fn configs_in_block(&self, block: usize) -> usize {
        let count = screen_blocks(self.space.len());
        (block..self.space.len()).step_by(count).count()
    }

    /// The seed of every block but 0: block 0's screen from empty staircases, then the pilot
    /// ([`Sweep::pilot`]) from its staircases.
    pub(super) fn seed(&self) -> Result<Seed, SweepError> {
        let empty: Vec<Staircase> = vec![Staircase::default(); self.lanes()];
        let block =
            self.screen_block(0, screen_blocks(self.space.len()), &empty, &HashMap::new())?;
        let started = Instant::now();
        let (pilot, mut stats) = self.pilot(&block)?;
        stats.pilot_time_s = started.elapsed().as_secs_f64();
        Ok(Seed {
            block,
            pilot,
            stats,
        })
    }

    /// The pilot: from block 0's staircases, the neighbours ([`SearchSpace::neighbours`]) of
    /// every configuration witnessing a staircase step are screened, their achievable
    /// throughputs raise the staircases, and so on until the witnesses' neighbours are all
    /// screened. Outside block 0 the space's best points sit next to other good ones far more
    /// often than a uniform sample holds them, so every other block starts from staircases
    /// close to the final ones. Returns the points with an achievable throughput, by id.
    ///
    /// [`SearchSpace::neighbours`]: crate::arch::SearchSpace::neighbours
    fn pilot(
        &self,
        block0: &BlockScreen,
    ) -> Result<(Vec<(u64, Screened)>, ScreenStats), SweepError> {
        let count = screen_blocks(self.space.len());
        let mut stairs = self.staircases(block0);
        let mut explored: BTreeSet<usize> = BTreeSet::new();
        // Witnesses whose neighbours are screened (or in block 0) already.
        let mut expanded: BTreeSet<usize> = BTreeSet::new();
        let mut pilot = Vec::new();
        let mut stats = ScreenStats::default();
        loop {
            let witnesses: BTreeSet<usize> = stairs
                .iter()
                .flat_map(|s| {
                    s.0.values()
                        .map(|&(_, id)| self.point_hardware(id as usize).0)
                })
                .filter(|c| !expanded.contains(c))
                .collect();
            expanded.extend(&witnesses);
            let witnesses: Vec<usize> = witnesses.into_iter().collect();
            let neighbours: Vec<Vec<usize>> = witnesses
                .par_iter()
                .map(|&c| self.space.neighbours(c))
                .collect();
            let frontier: BTreeSet<usize> = neighbours
                .into_iter()
                .flatten()
                .filter(|&c| !c.is_multiple_of(count) && !explored.contains(&c))
                .collect();
            if frontier.is_empty() {
                break;
            }
            explored.extend(&frontier);
            let configs: Vec<usize> = frontier.into_iter().collect();
            let screened = self.screen_configs(&configs, &stairs)?;
            stats.add(&screened.stats);
            stats.pilot_configs += configs.len() as u64;
            for (id, p) in screened.points {
                if let Some(a) = p.achievable {
                    for lane in self.lanes_from(id as usize) {
                        stairs[lane].insert(p.area_mm2, a, id);
                    }
                    pilot.push((id, p));
                }
            }
        }
        pilot.sort_by_key(|&(id, _)| id);
        Ok((pilot, stats))
    }

    /// Per workload, the staircase of a block's achievable throughputs.
    fn staircases(&self, block: &BlockScreen) -> Vec<Staircase> {
        let mut per_lane = vec![Vec::new(); self.lanes()];
        for &(id, p) in &block.points {
            if let Some(a) = p.achievable {
                for lane in self.lanes_from(id as usize) {
                    per_lane[lane].push((p.area_mm2, a, id));
                }
            }
        }
        per_lane.into_iter().map(Staircase::of).collect()
    }

    /// The staircases every block but 0 starts from: block 0's and the pilot's achievable
    /// throughputs.
    fn seed_staircases(&self, seed: &Seed) -> Vec<Staircase> {
        let mut stairs = self.staircases(&seed.block);
        for &(id, p) in &seed.pilot {
            if let Some(a) = p.achievable {
                for lane in self.lanes_from(id as usize) {
                    stairs[lane].insert(p.area_mm2, a, id);
                }
            }
        }
        stairs
    }

    /// The screen of block `block` of `count` from the staircases `seed`, with the pilot's
    /// achievable throughputs (`pilot`, by id) kept for its points: the joined staircases
    /// then hold every value the blocks were pruned against.
    fn screen_block(
        &self,
        block: usize,
        count: usize,
        seed: &[Staircase],
        pilot: &HashMap<u64, f64>,
    ) -> Result<BlockScreen, SweepError> {
        let configs: Vec<usize> = (block..self.space.len()).step_by(count).collect();
        let mut screened = self.screen_configs(&configs, seed)?;
        for (id, p) in &mut screened.points {
            if let Some(&a) = pilot.get(id) {
                p.achievable = Some(p.achievable.map_or(a, |found| found.max(a)));
            }
        }
        Ok(screened)
    }

    /// The screen of configurations `configs`: their work bounds, then the branch and bound
    /// from the staircases `seed`.
    fn screen_configs(
        &self,
        configs: &[usize],
        seed: &[Staircase],
    ) -> Result<BlockScreen, SweepError> {
        let mut stats = ScreenStats::default();
        let started = Instant::now();
        // Worked out once, before the configurations share it.
        self.memory_fits(0)?;
        let per_config: Vec<Vec<Screened>> = configs
            .par_iter()
            .map(|&c| self.work_bounds(c, seed))
            .collect::<Result<_, SweepError>>()?;
        let per = self.points_per_config() as usize;
        let ids: Vec<usize> = configs
            .iter()
            .flat_map(|&c| c * per..(c + 1) * per)
            .collect();
        let mut points: Vec<Screened> = per_config.into_iter().flatten().collect();
        stats.work_bound_time_s = started.elapsed().as_secs_f64();

        let started = Instant::now();
        // Highest bound first; among equal bounds (the HBM sizes of one point) the largest HBM,
        // which fits most plans; then by id.
        let mut order: Vec<usize> = (0..points.len()).collect();
        let bound_of = |p: &Screened| p.bound.unwrap_or(0.0);
        order.sort_by(|&a, &b| {
            bound_of(&points[b])
                .total_cmp(&bound_of(&points[a]))
                .then_with(|| {
                    let hbm = |i: usize| self.hbm_bytes[self.point_hardware(ids[i]).2];
                    hbm(b).cmp(&hbm(a))
                })
                .then(ids[a].cmp(&ids[b]))
        });
        let mut stairs: Vec<Staircase> = seed.to_vec();
        let known: Mutex<HashMap<usize, Known>> = Mutex::new(HashMap::new());
        let mut next = 0;
        loop {
            let mut batch = Vec::with_capacity(BATCH);
            while batch.len() < BATCH && next < order.len() {
                let i = order[next];
                next += 1;
                let p = points[i];
                let staircase = stairs[self.lane(ids[i])].up_to(p.area_mm2);
                // No bound: the memory checks found that no plan fits.
                if p.bound.is_some() && staircase <= bound_of(&p) {
                    batch.push((i, bound_of(&p), staircase));
                }
            }
            if batch.is_empty() {
                break;
            }
            // The points of one (configuration, workload, micro-batch, recompute) at several
            // HBM sizes run one after another, largest HBM first (the visiting order), so
            // each can settle the next; the results do not depend on it.
            let mut chains: Vec<Vec<usize>> = Vec::new();
            let mut chain_of: HashMap<usize, usize> = HashMap::new();
            for (j, &(i, _, _)) in batch.iter().enumerate() {
                let (_, _, h) = self.point_hardware(ids[i]);
                let sibling = ids[i] - h * self.points_per_hardware();
                let c = *chain_of.entry(sibling).or_insert_with(|| {
                    chains.push(Vec::new());
                    chains.len() - 1
                });
                chains[c].push(j);
            }
            let mut refined: Vec<Refined> = vec![(None, None); batch.len()];
            let per_chain: Vec<Vec<(usize, Refined)>> = chains
                .par_iter()
                .map(|chain| {
                    chain
                        .iter()
                        .map(|&j| {
                            let (i, work, staircase) = batch[j];
                            Ok((j, self.refine_point(ids[i], work, staircase, &known)?))
                        })
                        .collect::<Result<_, SweepError>>()
                })
                .collect::<Result<_, SweepError>>()?;
            for (j, r) in per_chain.into_iter().flatten() {
                refined[j] = r;
            }
            for (&(i, _, _), (bound, achievable)) in batch.iter().zip(refined) {
                stats.plan_bounded += 1;
                let p = &mut points[i];
                p.bound = bound;
                p.achievable = achievable;
                if let Some(a) = achievable {
                    for lane in self.lanes_from(ids[i]) {
                        stairs[lane].insert(p.area_mm2, a, ids[i] as u64);
                    }
                }
                stats.achievable_found += u64::from(achievable.is_some());
            }
        }
        if self.workloads.len() > 1 {
            self.fill_hardware(configs, &mut points)?;
        }
        stats.plan_bound_time_s = started.elapsed().as_secs_f64();
        Ok(BlockScreen {
            points: ids.into_iter().map(|id| id as u64).zip(points).collect(),
            stats,
        })
    }

    /// Several workloads: for every hardware of `configs` (whose points `points` holds, in
    /// point order) with an achievable throughput for some workload, searches one for each
    /// workload that has none (at its highest-bound point), so the hardware can witness the
    /// mean-over-workloads rule.
    fn fill_hardware(&self, configs: &[usize], points: &mut [Screened]) -> Result<(), SweepError> {
        let per_hardware = self.points_per_hardware();
        let per_config = self.points_per_config() as usize;
        let mut missing = Vec::new();
        for (k, &config) in configs.iter().enumerate() {
            for h in 0..self.hbm_bytes.len() {
                // Position in `points` of the first point of (config, w, h).
                let first = |w| k * per_config + self.point_id(0, w, h, 0, 0) as usize;
                let range = |w| first(w)..first(w) + per_hardware;
                let has = |w| points[range(w)].iter().any(|p| p.achievable.is_some());
                if !(0..self.workloads.len()).any(has) {
                    continue;
                }
                for w in (0..self.workloads.len()).filter(|&w| !has(w)) {
                    let best = range(w)
                        .filter(|&i| points[i].bound.is_some())
                        .max_by(|&a, &b| {
                            let bound = |i: usize| points[i].bound.unwrap_or(0.0);
                            bound(a).total_cmp(&bound(b)).then(b.cmp(&a))
                        });
                    missing.extend(best.map(|i| (i, config * per_config + i - k * per_config)));
                }
            }
        }
        let found: Vec<Option<f64>> = missing
            .par_iter()
            .map(|&(_, id)| {
                let (config, w, _) = self.point_hardware(id);
                let cost = CostModel::new(&self.config(config)?);
                self.achievable(&self.workloads[w], &cost, &self.point_options(id), 0.0)
            })
            .collect::<Result<_, SweepError>>()?;
        for ((i, _), achievable) in missing.into_iter().zip(found) {
            points[i].achievable = achievable;
        }
        Ok(())
    }
}

impl Screen {
    /// The screen of the whole space from the screens of all its blocks (each point once):
    /// the staircases from every achievable throughput, the points themselves only where
    /// `keep(id)` (a shard's exact pass keeps its own).
    pub(super) fn join(
        sweep: &Sweep,
        blocks: Vec<BlockScreen>,
        keep: impl Fn(u64) -> bool,
    ) -> Screen {
        let mut stats = ScreenStats::default();
        let mut all: Vec<(u64, Screened)> = Vec::new();
        for block in blocks {
            stats.add(&block.stats);
            all.extend(block.points);
        }
        all.sort_by_key(|&(id, _)| id);
        let mut screen = Screen::new(sweep, &all);
        screen.points = all.into_iter().filter(|&(id, _)| keep(id)).collect();
        screen.stats = stats;
        screen
    }

    fn new(sweep: &Sweep, points: &[(u64, Screened)]) -> Screen {
        let mut per_lane = vec![Vec::new(); sweep.lanes()];
        let mut hardware: BTreeMap<(usize, usize), HardwareBest> = BTreeMap::new();
        for &(id, p) in points {
            let (config, w, h) = sweep.point_hardware(id as usize);
            let Some(thr) = p.achievable else {
                continue;
            };
            for lane in sweep.lanes_from(id as usize) {
                per_lane[lane].push((p.area_mm2, thr, id));
            }
            let slots = &mut hardware
                .entry((config, h))
                .or_insert_with(|| (p.area_mm2, vec![None; sweep.workloads.len()]))
                .1;
            slots[w] = Some(slots[w].map_or(thr, |s: f64| s.max(thr)));
        }
        let per_hardware = hardware
            .into_iter()
            .filter_map(|((config, _), (area, best))| {
                let best: Vec<f64> = best.into_iter().collect::<Option<_>>()?;
                Some((
                    area,
                    best.iter().sum::<f64>() / best.len() as f64,
                    config as u64,
                ))
            })
            .collect();
        Screen {
            points: HashMap::new(),
            per_lane: per_lane.into_iter().map(Staircase::of).collect(),
            per_hardware: Staircase::of(per_hardware),
            stats: ScreenStats::default(),
        }
    }

    /// The point of the staircase `lane` (point `id`'s: [`Sweep::lane`]) that beats its bound
    /// at no larger area, or `None` if the point might matter.
    pub(super) fn point_beaten(&self, lane: usize, id: u64) -> Option<Reached> {
        let p = self.points.get(&id)?;
        let bound = p.bound.unwrap_or(0.0);
        let (area_mm2, samples_per_s, by) = self.per_lane[lane].best_up_to(p.area_mm2)?;
        (samples_per_s > bound).then_some(Reached {
            by,
            samples_per_s,
            area_mm2,
        })
    }

    /// Whether hardware (`config`, HBM index `h`) cannot be the best for the set: with one
    /// workload `Some(None)`; with several, `Some` of its mean bound over workloads and the
    /// configuration that beats it. `None` if it might be the best.
    pub(super) fn hardware_beaten(
        &self,
        sweep: &Sweep,
        config: usize,
        h: usize,
    ) -> Option<Option<(f64, Reached)>> {
        if self.points.is_empty() {
            return None;
        }
        if sweep.workloads.len() == 1 {
            return Some(None);
        }
        let per_hbm = sweep.points_per_hardware();
        let mut bounds = Vec::with_capacity(sweep.workloads.len());
        let mut area_mm2 = 0.0;
        for w in 0..sweep.workloads.len() {
            let first = sweep.point_id(config, w, h, 0, 0) as usize;
            let points: Vec<&Screened> = (first..first + per_hbm)
                .filter_map(|id| self.points.get(&(id as u64)))
                .collect();
            area_mm2 = points.first().map_or(area_mm2, |p| p.area_mm2);
            bounds.push(points.iter().filter_map(|p| p.bound).fold(0.0, f64::max));
        }
        let mean_bound = bounds.iter().sum::<f64>() / bounds.len() as f64;
        let (area_mm2, mean, by) = self.per_hardware.best_up_to(area_mm2)?;
        (mean > mean_bound).then_some(Some((
            mean_bound,
            Reached {
                by,
                samples_per_s: mean,
                area_mm2,
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::Staircase;

    #[test]
    fn staircase_keeps_the_best_at_no_larger_area() {
        let mut s = Staircase::default();
        assert_eq!(s.up_to(10.0), 0.0);
        s.insert(10.0, 5.0, 1);
        s.insert(20.0, 4.0, 2); // dominated by (10, 5): not kept
        assert_eq!(s.best_up_to(25.0), Some((10.0, 5.0, 1)));
        s.insert(30.0, 8.0, 3);
        s.insert(5.0, 6.0, 4); // dominates (10, 5)
        assert_eq!(s.0.len(), 2);
        assert_eq!(s.best_up_to(4.9), None);
        assert_eq!(s.best_up_to(5.0), Some((5.0, 6.0, 4)));
        assert_eq!(s.best_up_to(29.0), Some((5.0, 6.0, 4)));
        assert_eq!(s.up_to(30.0), 8.0);
        s.insert(30.0, 8.0, 5); // a tie keeps the first witness
        s.insert(30.0, 9.0, 6);
        assert_eq!(s.best_up_to(1e9), Some((30.0, 9.0, 6)));
        assert_eq!(s.0.len(), 2);
        // Built from entries in any order: the smallest area, then id, witnesses a value.
        let built = Staircase::of(vec![
            (7.0, 2.0, 9),
            (3.0, 2.0, 8),
            (3.0, 2.0, 1),
            (9.0, 5.0, 0),
        ]);
        assert_eq!(built.best_up_to(8.0), Some((3.0, 2.0, 1)));
        assert_eq!(built.best_up_to(9.0), Some((9.0, 5.0, 0)));
    }
}
