//! tandem: co-design of accelerator hardware and the distributed training plan.
//!
//! The crate follows the data flow of `ARCHITECTURE.md`: [`workload`] builds operator and
//! layer graphs, [`arch`] describes chips and search spaces, [`cost`] prices single
//! operators on a chip, [`schedule`] orders one layer's operators on a chip's cores,
//! [`placement`] finds the data × tensor × pipeline plan, [`model`] evaluates one design
//! point end to end, [`search`] sweeps many of them and [`report`] formats results. [`vocab`] holds the primitives `workload` and
//! `arch` both name; `tests/layering.rs` enforces the code map's dependency rules.

pub mod arch;
pub mod calibrate;
pub mod cost;
pub mod error;
pub mod model;
pub mod output;
pub mod placement;
pub mod report;
pub mod schedule;
pub mod search;
pub mod vocab;
pub mod workload;
