//! Models to train: workload files, the generated operator and layer graphs, and memory facts.

mod graph;

pub use graph::*;
