//! One design point end to end (docs/design.md §1): the workload's layer graph at each tensor
//! width, every unique layer scheduled on the chip's cores, and the best parallel plan over
//! the micro-batch sizes and recompute modes asked for, with its energy. `search` sweeps many
//! points through it and `calibrate` prices published runs with it.
//!
//! Files:
//! - `layers.rs`: a workload on one chip → per-t layer costs (`layer_costs`, schedules
//!   memoised in a `ScheduleCache`) and each layer's energy (`LayerCosts`), with the energy per
//!   sample of a plan (layers per micro-batch; optimizer steps and gradient synchronisation per
//!   iteration).
//! - `evaluate.rs`: `evaluate`: the best plan over micro-batch × recompute × t × p × d
//!   (candidates pruned by the best so far), `PlanOptions`, `Evaluation`, `EvaluateError`.
//! - `bound.rs`: upper bounds without the ILP: `throughput_bound` (the plan search on schedule
//!   lower bounds, links free) and `LayerWork` (a micro-batch's summed lower bounds).

mod bound;
mod evaluate;
mod layers;

pub use bound::{
    throughput_bound, throughput_bound_after, HbmOutcome, LayerBounds, LayerWork, PlanBound,
    BOUND_SLACK,
};
pub use evaluate::{
    evaluate, evaluate_faster_than, evaluate_on, tensor_widths, EvaluateError, Evaluation,
    PlanOptions,
};
pub use layers::{layer_costs, LayerCosts, LayerEnergy, TiedEnergy, UniqueLayerSchedule};
