//! `costs.json`: a [`PlacementProblem`] in JSON, for users who profile their own layers.
//! Every rejection names the file, the field and the reason.

use super::{model, PipelineSchedule, PlacementProblem};
use crate::error::{parse_json, read_input, InputError};
use std::path::Path;

/// Reads and validates a `costs.json` file.
pub fn load_costs_file(file: &Path) -> Result<PlacementProblem, InputError> {
    parse_costs(file, &read_input(file)?)
}

/// Parses and validates `costs.json` text; `file` is only used in messages.
pub fn parse_costs(file: &Path, text: &str) -> Result<PlacementProblem, InputError> {
    let problem: PlacementProblem = parse_json(file, text)?;
    let bad = |field: String, reason: String| InputError::invalid(file, field, reason);
    for (name, value) in [
        ("devices", u64::from(problem.devices)),
        ("micro_batch", u64::from(problem.micro_batch)),
        ("global_batch", problem.global_batch),
        ("hbm_bytes", problem.hbm_bytes),
    ] {
        if value == 0 {
            return Err(bad(name.into(), "must be positive".into()));
        }
    }
    if !(0.0..=1.0).contains(&problem.overlap_efficiency) {
        return Err(bad(
            "overlap_efficiency".into(),
            format!(
                "must be a fraction in [0, 1], got {}",
                problem.overlap_efficiency
            ),
        ));
    }
    let held = &problem.constraints;
    for (name, value) in [("tp", held.tp), ("pp", held.pp), ("dp", held.dp)] {
        if value == Some(0) {
            return Err(bad(
                format!("constraints.{name}"),
                "must be at least 1 (or null to search it)".into(),
            ));
        }
    }
    if let Some(only) = &problem.only_data_parallel {
        if only.is_empty() || only.contains(&0) {
            return Err(bad(
                "only_data_parallel".into(),
                format!(
                    "must list data-parallel widths of at least 1 (or be null for all), got \
                     {only:?}"
                ),
            ));
        }
    }
    match held.virtual_stages {
        Some(v) if problem.schedule != PipelineSchedule::Interleaved => {
            return Err(bad(
                "constraints.virtual_stages".into(),
                format!(
                    "{v} model chunks per stage need \"schedule\": \"interleaved\", not \"{}\"",
                    problem.schedule.name()
                ),
            ))
        }
        Some(v) if v < 2 => {
            return Err(bad(
                "constraints.virtual_stages".into(),
                format!("must be at least 2 model chunks per stage, got {v}"),
            ))
        }
        _ => {}
    }
    if problem.graphs.is_empty() {
        return Err(bad(
            "graphs".into(),
            "at least one layer graph is needed".into(),
        ));
    }
    let n = problem.graphs[0].layers.len();
    for (gi, graph) in problem.graphs.iter().enumerate() {
        let at = format!("graphs[{gi}]");
        if graph.tp == 0 {
            return Err(bad(format!("{at}.tp"), "must be positive".into()));
        }
        if problem.graphs[..gi].iter().any(|g| g.tp == graph.tp) {
            return Err(bad(
                format!("{at}.tp"),
                format!("a graph for t={} is already given", graph.tp),
            ));
        }
        if graph.layers.is_empty() || graph.layers.len() != n {
            return Err(bad(
                format!("{at}.layers"),
                format!(
                    "has {} layers; every graph needs the same non-zero number as graphs[0] ({n})",
                    graph.layers.len()
                ),
            ));
        }
        for (li, layer) in graph.layers.iter().enumerate() {
            let tied_times = layer.tied.map(|tied| {
                [
                    ("tied.optimizer_step_s", tied.optimizer_step_s),
                    ("tied.grad_accumulation_s", tied.grad_accumulation_s),
                    ("tied.grad_buffer_s", tied.grad_buffer_s),
                    ("tied.grad_sum_s", tied.grad_sum_s),
                ]
            });
            let times = [
                ("fwd_s", layer.fwd_s),
                ("bwd_s", layer.bwd_s),
                ("selective_recompute_s", layer.selective_recompute_s),
                ("recompute_skipped_s", layer.recompute_skipped_s),
                ("optimizer_step_s", layer.optimizer_step_s),
                ("grad_accumulation_s", layer.grad_accumulation_s),
                ("grad_buffer_s", layer.grad_buffer_s),
            ];
            for (name, value) in times.into_iter().chain(tied_times.into_iter().flatten()) {
                if !value.is_finite() || value < 0.0 {
                    return Err(bad(
                        format!("{at}.layers[{li}].{name}"),
                        format!("latency must be finite and non-negative, got {value}"),
                    ));
                }
            }
            if layer.recompute_skipped_s > layer.fwd_s {
                return Err(bad(
                    format!("{at}.layers[{li}].recompute_skipped_s"),
                    format!(
                        "{} s exceeds the layer's fwd_s ({} s): full recompute cannot skip more \
                         of the forward than there is",
                        layer.recompute_skipped_s, layer.fwd_s
                    ),
                ));
            }
            if let Some(tied) = layer.tied.filter(|tied| tied.owner >= li) {
                return Err(bad(
                    format!("{at}.layers[{li}].tied.owner"),
                    format!(
                        "{} is not an earlier layer: tied parameters are held by a layer before \
                         the one using them",
                        tied.owner
                    ),
                ));
            }
        }
        for (ei, &(from, to, _)) in graph.edges.iter().enumerate() {
            if let Some(unknown) = [from, to].into_iter().find(|&v| v >= n) {
                return Err(bad(
                    format!("{at}.edges[{ei}]"),
                    format!("edge to unknown layer {unknown} (the graph has {n} layers)"),
                ));
            }
        }
        if let Some([first, end]) = graph.repeated_layers {
            if first >= end || end > n {
                return Err(bad(
                    format!("{at}.repeated_layers"),
                    format!("[{first}, {end}) is not a non-empty range of the {n} layers"),
                ));
            }
        }
        if let Some(cycle) = find_cycle(n, &graph.edges) {
            let names: Vec<&str> = cycle
                .iter()
                .map(|&v| graph.layers[v].name.as_str())
                .collect();
            return Err(bad(
                format!("{at}.edges"),
                format!("edges form a cycle: {}", names.join(" → ")),
            ));
        }
        if let Some(ei) = graph.edges.iter().position(|&(from, to, _)| from >= to) {
            let (from, to, _) = graph.edges[ei];
            return Err(bad(
                format!("{at}.edges[{ei}]"),
                format!("edge {from} → {to} goes backwards; list layers in topological order"),
            ));
        }
    }
    model::validate(&problem).map_err(|reason| bad("tiers".into(), reason))?;
    Ok(problem)
}

/// A cycle as a closed list of layers (first repeated at the end), if the edges have one.
fn find_cycle(n: usize, edges: &[(usize, usize, u64)]) -> Option<Vec<usize>> {
    let mut succs = vec![Vec::new(); n];
    for &(from, to, _) in edges {
        succs[from].push(to);
    }
    // 0 unvisited, 1 on the current path, 2 finished.
    let mut state = vec![0u8; n];
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut path = vec![(root, 0usize)];
        state[root] = 1;
        while let Some(&mut (v, ref mut next)) = path.last_mut() {
            if let Some(&w) = succs[v].get(*next) {
                *next += 1;
                match state[w] {
                    0 => {
                        state[w] = 1;
                        path.push((w, 0));
                    }
                    1 => {
                        let start = path.iter().position(|&(u, _)| u == w).expect("on path");
                        let mut cycle: Vec<usize> = path[start..].iter().map(|&(u, _)| u).collect();
                        cycle.push(w);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                state[v] = 2;
                path.pop();
            }
        }
    }
    None
}
