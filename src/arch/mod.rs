//! Accelerators: the template, chip files, search spaces, area and energy.

mod config;

pub use config::*;
