//! The Slurm deployment run for real on a one-machine cluster: `deploy/slurm/test-local.sh`
//! brings up slurmctld, slurmd and munge on the loopback interface, runs a sweep as screen and
//! exact job arrays and a merge job, compares the merged files with a local run byte for byte,
//! then requeues a shard cut in half and checks the same bytes again. It needs root (it starts
//! the daemons and installs Debian's slurm-wlm and munge when missing), so it is ignored by
//! default; CI runs it (`.ci/run`), and so does
//! `cargo test --release --test slurm -- --ignored`.

use std::process::Command;

#[test]
#[ignore = "needs root: starts a local Slurm cluster (run by .ci/run)"]
fn sweep_on_a_local_slurm_cluster_equals_the_local_run() {
    let out = Command::new("bash")
        .arg("deploy/slurm/test-local.sh")
        .env("TANDEM", env!("CARGO_BIN_EXE_tandem"))
        .output()
        .expect("run deploy/slurm/test-local.sh");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("the Slurm sweep equals the local run, also after a requeued shard"),
        "{text}"
    );
}
