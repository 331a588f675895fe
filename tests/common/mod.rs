//! Helpers the integration-test crates share (`mod common;` in each). Every crate compiles
//! its own copy and uses only some of them, hence the allowance.
#![allow(dead_code)]

use std::process::{Command, Output};

/// A fresh directory for one test, named after the test crate and `test`, removed when the
/// returned guard drops.
pub fn scratch(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tandem-{}-{test}-", env!("CARGO_CRATE_NAME")))
        .tempdir()
        .expect("scratch dir")
}

/// Runs the `tandem` binary of this build with `args`.
pub fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}
