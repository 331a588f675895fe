//! `tandem study`: a study file drives `compare` for every cluster size × objective ×
//! workload; the summary's gains are the compare rows' ratios, a finished study resumes to
//! the same bytes, and a bad study file exits 1 naming the field.

mod common;
use common::{scratch, tandem};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tandem::arch::SearchSpace;
use tandem::search::{gain, objective_value, CompareRow, Objective, COMPARE_CSV};
fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Two small GPTs, a narrowed PHAZE space, one of its chips as a baseline, a plans file for
/// 8 devices; returns the study file's text (cluster sizes 4 and 8, the plans file for 8
/// only; two baselines; two objectives).
fn study_text(dir: &Path) -> String {
    let mut workloads = Vec::new();
    for (name, layers) in [("tiny", 4), ("tinier", 2)] {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"{name}\"\nfamily = \"gpt\"\nlayers = {layers}\nhidden = 256\nheads = 4\n\
                 vocab = 1024\nseq_len = 128\nglobal_batch = 32\n"
            ),
        )
        .expect("workload");
        workloads.push(path);
    }
    let text = std::fs::read_to_string("arch_specs/phaze.toml").expect("phaze.toml");
    let text = text
        .replace("{ min = 1, max = 4096 }", "{ min = 2, max = 16 }")
        .replace(
            "\"tensor.rows\" = { min = 2, max = 256 }",
            "\"tensor.rows\" = { min = 64, max = 128 }",
        )
        .replace(
            "\"tensor.cols\" = { min = 2, max = 256 }",
            "\"tensor.cols\" = { min = 64, max = 64 }",
        )
        .replace(
            "\"glb.bytes\" = { min = 2_097_152, max = 134_217_728 }",
            "\"glb.bytes\" = { min = 33_554_432, max = 33_554_432 }",
        );
    let space = dir.join("space.toml");
    std::fs::write(&space, text).expect("space");
    let loaded = SearchSpace::load(&space).expect("valid space");
    let mut chip = loaded.get(loaded.len() / 2).expect("a configuration");
    chip.name = "inside".into();
    let chip_path = dir.join("inside.toml");
    std::fs::write(&chip_path, toml::to_string(&chip).expect("TOML")).expect("chip");
    let plans = dir.join("plans.toml");
    std::fs::write(
        &plans,
        "devices = 8\n[plans]\ntiny = { tp = 1, pp = 2, dp = 4 }\ntinier = { tp = 2, pp = 1, dp = 4 }\n",
    )
    .expect("plans");
    let hbm_gib = chip.hbm.capacity_bytes as f64 / (1u64 << 30) as f64;
    format!(
        "space = {space:?}\nworkloads = [{:?}, {:?}]\ndevices = [8, 4]\n\
         baselines = [{chip_path:?}, \"arch_specs/a100.toml\"]\n\
         objectives = [\"throughput\", \"energy\"]\nmicro_batches = [1, 2]\n\
         recompute = [\"none\", \"full\"]\nhbm_gib = [{hbm_gib}]\n[plans]\n8 = {plans:?}\n",
        workloads[0], workloads[1]
    )
}

/// Every file under `dir` but lock files and sweeps' `status.json` (which records times), with
/// its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .is_some_and(|n| n != ".tandem.lock" && n != "status.json")
            {
                all.insert(
                    path.strip_prefix(dir).expect("under dir").to_path_buf(),
                    std::fs::read(&path).expect("read"),
                );
            }
        }
    }
    all
}

fn compare_rows(path: &Path) -> Vec<CompareRow> {
    csv::Reader::from_path(path)
        .expect("compare.csv")
        .deserialize()
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn a_study_summarises_its_compare_folders_and_resumes_to_the_same_bytes() {
    let tmp = scratch("run");
    let dir = tmp.path();
    let config = dir.join("study.toml");
    std::fs::write(&config, study_text(dir)).expect("study file");
    let out = dir.join("out");
    let o = tandem(&["study", "--config", s(&config), "--out", s(&out)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // One line per cell: 2 cluster sizes × 2 objectives × 2 workloads.
    assert_eq!(stderr.matches(": done in ").count(), 8, "{stderr}");
    for objective in ["throughput", "energy"] {
        for ext in ["md", "csv", "svg"] {
            assert!(out.join(format!("{objective}.{ext}")).exists());
        }
        for d in ["d4", "d8"] {
            assert!(out.join(d).join(objective).join(COMPARE_CSV).exists());
        }
    }
    let energy_dir = out.join("d8").join("energy").join("sweeps");
    assert!(energy_dir.join("tiny.energy").join("run.toml").exists());
    assert!(energy_dir
        .join("tiny.energy.fixed-plan")
        .join("run.toml")
        .exists());

    // Without a plans file for 4 devices, d4 has no fixed-plan rows.
    let d4 = compare_rows(&out.join("d4").join("throughput").join(COMPARE_CSV));
    assert!(!d4.is_empty());
    assert!(d4
        .iter()
        .all(|r| !r.row.ends_with(" fixed plan") && r.row != "fixed-plan co-design"));

    // The summary's gains are the compare rows' ratios.
    for (objective, name) in [
        (Objective::Throughput, "throughput"),
        (Objective::Energy, "energy"),
    ] {
        let mut reader = csv::Reader::from_path(out.join(format!("{name}.csv"))).expect("csv");
        let header = reader.headers().expect("header").clone();
        let records: Vec<csv::StringRecord> =
            reader.records().collect::<Result<_, _>>().expect("records");
        // Workloads in the file's order, each on every cluster size ascending.
        let keys: Vec<(String, String)> = records
            .iter()
            .map(|r| (r[0].to_string(), r[1].to_string()))
            .collect();
        assert_eq!(
            keys,
            [
                ("tiny", "4"),
                ("tiny", "8"),
                ("tinier", "4"),
                ("tinier", "8")
            ]
            .map(|(w, d)| (w.to_string(), d.to_string()))
        );
        let column = |field: &str| {
            header
                .iter()
                .position(|h| h == field)
                .unwrap_or_else(|| panic!("no column {field} in {header:?}"))
        };
        let mut checked = 0;
        for record in &records {
            let rows = compare_rows(
                &out.join(format!("d{}", &record[1]))
                    .join(name)
                    .join(COMPARE_CSV),
            );
            let value = |row: &str| {
                rows.iter()
                    .find(|r| r.workload == record[0] && r.row == row)
                    .and_then(|r| objective_value(objective, r))
            };
            let co = value("co-design").expect("co-design has a plan");
            assert_eq!(record[column("objective_value")].parse::<f64>(), Ok(co));
            for b in ["inside", "a100"] {
                let searched = value(&format!("{b} searched plan"));
                let expected = [
                    (format!("gain_over_{b}_searched_plan"), Some(co), searched),
                    (
                        format!("gain_over_{b}_fixed_plan"),
                        Some(co),
                        value(&format!("{b} fixed plan")),
                    ),
                    (
                        format!("gain_at_{b}_area"),
                        value(&format!("co-design ≤ {b} area")),
                        searched,
                    ),
                    (
                        format!("gain_at_{b}_power"),
                        value(&format!("co-design ≤ {b} power")),
                        searched,
                    ),
                ];
                for (field, v, reference) in expected {
                    let cell = &record[column(&field)];
                    match v.zip(reference) {
                        Some((v, reference)) => {
                            assert_eq!(
                                cell.parse::<f64>(),
                                Ok(gain(objective, v, reference)),
                                "{field}"
                            );
                            let by_hand = match objective {
                                Objective::Energy => reference / v,
                                _ => v / reference,
                            };
                            assert_eq!(cell.parse::<f64>(), Ok(by_hand), "{field}");
                            checked += 1;
                        }
                        None => assert_eq!(cell, "", "{field}"),
                    }
                }
            }
            for (field, row) in [
                ("gain_over_decoupled", "decoupled"),
                ("gain_over_hardware_first", "hardware-first"),
            ] {
                let other = value(row).expect("a chip chosen first has a plan here");
                let by_hand = match objective {
                    Objective::Energy => other / co,
                    _ => co / other,
                };
                assert_eq!(record[column(field)].parse::<f64>(), Ok(by_hand), "{field}");
                checked += 1;
            }
        }
        assert!(checked >= 12, "{checked} gains checked");
    }

    // A finished study resumes to the same bytes, summaries included.
    let before = files(&out);
    let o = tandem(&[
        "study",
        "--config",
        s(&config),
        "--out",
        s(&out),
        "--resume",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(!stderr.contains("done in"), "{stderr}");
    assert_eq!(files(&out), before);

    // A compare folder lost before it was written (an interrupt) is run again from its
    // sweeps, to the same bytes.
    for f in ["compare.csv", "compare.md", "compare.svg"] {
        std::fs::remove_file(out.join("d8").join("energy").join(f)).expect("remove");
    }
    std::fs::remove_file(out.join("energy.csv")).expect("remove");
    let o = tandem(&[
        "study",
        "--config",
        s(&config),
        "--out",
        s(&out),
        "--resume",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert_eq!(stderr.matches(": done in ").count(), 2, "{stderr}");
    let after = files(&out);
    let differ: Vec<&PathBuf> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(differ.is_empty(), "differ: {differ:?}");

    // A finished cell of another study file (a baseline dropped) is not taken for this one's.
    let changed = dir.join("changed.toml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&config)
            .expect("study file")
            .replace(", \"arch_specs/a100.toml\"", ""),
    )
    .expect("changed study file");
    let o = tandem(&[
        "study",
        "--config",
        s(&changed),
        "--out",
        s(&out),
        "--resume",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("compare.csv") && stderr.contains("not those this study file asks for"),
        "{stderr}"
    );
    assert_eq!(files(&out), before);

    // Without --resume, a study refuses a directory that holds anything.
    let o = tandem(&["study", "--config", s(&config), "--out", s(&out)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(s(&out)) && stderr.contains("--resume"),
        "{stderr}"
    );
}

#[test]
fn a_bad_study_file_exits_1_naming_the_field() {
    let tmp = scratch("bad");
    let dir = tmp.path();
    let good = study_text(dir);
    let config = dir.join("study.toml");
    let out = dir.join("out");
    let cases: Vec<(String, &str)> = vec![
        (format!("{good}colour = \"red\"\n"), "colour"),
        (
            good.replace(
                "objectives = [\"throughput\", \"energy\"]",
                "objectives = [\"throughput\", \"speed\"]",
            ),
            "objectives[1]",
        ),
        (
            good.replace("devices = [8, 4]", "devices = [8, 0]"),
            "devices[1]",
        ),
        (
            good.replace("devices = [8, 4]", "devices = []"),
            "`devices`",
        ),
        (
            good.replace("devices = [8, 4]", "devices = [8, 8]"),
            "devices[1]",
        ),
        (
            good.replace(
                "\"arch_specs/a100.toml\"",
                "\"arch_specs/no-such-chip.toml\"",
            ),
            "baselines[1]",
        ),
        (
            good.replace("recompute = [\"none\", \"full\"]", "recompute = [\"some\"]"),
            "recompute[0]",
        ),
        (
            good.replace("micro_batches = [1, 2]", "micro_batches = []"),
            "micro_batches",
        ),
        (good.replace("hbm_gib = [", "hbm_gib = [-1, "), "hbm_gib[0]"),
        (good.replace("\n8 = ", "\n16 = "), "plans.16"),
        (
            good.replace(
                "workloads = [",
                "workloads = [\"workloads/no-such-model.toml\", ",
            ),
            "workloads[0]",
        ),
    ];
    for (text, field) in cases {
        std::fs::write(&config, &text).expect("study file");
        let o = tandem(&["study", "--config", s(&config), "--out", s(&out)]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{field}: {stderr}");
        assert!(
            stderr.contains(field) && stderr.contains(s(&config)),
            "{field}: {stderr}"
        );
        assert!(
            !out.exists(),
            "{field}: a bad study wrote {}",
            out.display()
        );
    }
}
