//! Search spaces (`arch_specs/phaze.toml`; format in `docs/arch.md`).
//!
//! A space file is data: a `[base]` of everything not searched, value lists per searched
//! field, ties (one field equals a searched one), derived local buffers and GLB bandwidth,
//! and an area window. The eight integer fields of the template (core counts and shapes,
//! buffer sizes) are each defined exactly once, by a dimension, a tie or a derived rule.
//!
//! Points are the Cartesian product of the dimensions in the canonical field order of
//! [`FIELDS`] (the last dimension varies fastest), filtered by the area window. Iteration is
//! lazy; [`SearchSpace::len`], [`SearchSpace::get`] and [`SearchSpace::neighbours`] share one
//! parallel pass that keeps the raw product index of each accepted point (8 bytes a
//! configuration, far below what a sweep keeps per point), so `get` is a lookup.

use std::path::Path;
use std::sync::OnceLock;

use rayon::prelude::*;
use serde::Deserialize;

use super::area::AreaFields;
use super::chip::{positive, validate_environment, Environment};
use super::config::{
    ArchConfig, Efficiency, EnergyCosts, GlobalBuffer, Hbm, KernelExecution, TensorCores, Tier,
    VectorCores, VectorCycles,
};
use crate::error::{parse_toml, read_input, InputError};
use crate::report::exact_bytes;

/// Raw indices per block of the parallel pass that finds the accepted points.
const BLOCK: usize = 1024;

/// The template fields a space can search, tie or derive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    TensorCount,
    TensorRows,
    TensorCols,
    TensorLocalBuffer,
    VectorCount,
    VectorLanes,
    VectorLocalBuffer,
    GlbBytes,
}

/// Canonical order: it fixes the enumeration order of every space.
const FIELDS: [Field; 8] = [
    Field::TensorCount,
    Field::TensorRows,
    Field::TensorCols,
    Field::TensorLocalBuffer,
    Field::VectorCount,
    Field::VectorLanes,
    Field::VectorLocalBuffer,
    Field::GlbBytes,
];

/// Top-level sections of the field paths (`tensor.count` lives in `tensor`).
const SECTIONS: [&str; 3] = ["tensor", "vector", "glb"];

impl Field {
    fn path(self) -> &'static str {
        match self {
            Field::TensorCount => "tensor.count",
            Field::TensorRows => "tensor.rows",
            Field::TensorCols => "tensor.cols",
            Field::TensorLocalBuffer => "tensor.local_buffer_bytes",
            Field::VectorCount => "vector.count",
            Field::VectorLanes => "vector.lanes",
            Field::VectorLocalBuffer => "vector.local_buffer_bytes",
            Field::GlbBytes => "glb.bytes",
        }
    }

    fn parse(path: &str) -> Option<Field> {
        FIELDS.into_iter().find(|f| f.path() == path)
    }

    /// Largest value the field's type in [`ArchConfig`] holds.
    fn max_value(self) -> u64 {
        match self {
            Field::TensorLocalBuffer | Field::VectorLocalBuffer | Field::GlbBytes => u64::MAX,
            _ => u64::from(u32::MAX),
        }
    }
}

fn known_fields() -> String {
    FIELDS.map(Field::path).join(", ")
}

/// Values of the eight fields, indexed by `Field as usize`.
type Point = [u64; 8];

fn area_fields(p: &Point) -> AreaFields {
    AreaFields {
        tensor_count: p[Field::TensorCount as usize],
        tensor_rows: p[Field::TensorRows as usize],
        tensor_cols: p[Field::TensorCols as usize],
        tensor_local_bytes: p[Field::TensorLocalBuffer as usize],
        vector_count: p[Field::VectorCount as usize],
        vector_lanes: p[Field::VectorLanes as usize],
        vector_local_bytes: p[Field::VectorLocalBuffer as usize],
        glb_bytes: p[Field::GlbBytes as usize],
    }
}

fn point_of(arch: &ArchConfig) -> Point {
    let a = AreaFields::of(arch);
    [
        a.tensor_count,
        a.tensor_rows,
        a.tensor_cols,
        a.tensor_local_bytes,
        a.vector_count,
        a.vector_lanes,
        a.vector_local_bytes,
        a.glb_bytes,
    ]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpaceFile {
    name: String,
    base: Base,
    dimensions: toml::Table,
    #[serde(default)]
    ties: toml::Table,
    #[serde(default)]
    derived: DerivedFile,
    area: AreaFile,
}

/// Everything a space holds fixed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Base {
    clock_hz: f64,
    hbm: Hbm,
    interconnect: Vec<Tier>,
    efficiency: Efficiency,
    vector_cycles: VectorCycles,
    energy: EnergyCosts,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DerivedFile {
    tensor_local_buffer: Option<PerMacFile>,
    vector_local_buffer: Option<PerLaneFile>,
    glb_bandwidth: Option<GlbBandwidthFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PerMacFile {
    bytes_per_mac: f64,
    #[serde(default)]
    min_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PerLaneFile {
    bytes_per_lane: f64,
    #[serde(default)]
    min_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlbBandwidthFile {
    bytes_per_cycle_per_edge: Option<f64>,
    bytes_per_s: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AreaFile {
    budget_mm2: Option<f64>,
    budget_reference: Option<toml::Table>,
    #[serde(default)]
    min_fraction: f64,
    #[serde(default)]
    waive_min_when: Vec<toml::Table>,
}

/// How one field gets its value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// Searched: index into `SearchSpace::dimensions`.
    Dimension(usize),
    /// Equal to a searched field.
    Tie(Field),
    /// A local buffer of max(ceil(bytes_per_unit · units), min_bytes), where units are the
    /// core's MACs (tensor) or lanes (vector).
    Derived { bytes_per_unit: f64, min_bytes: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum GlbBandwidth {
    /// bytes per cycle per array edge element × Σ over tensor cores (rows + cols) × clock.
    PerEdge {
        bytes_per_cycle: f64,
    },
    Fixed {
        bytes_per_s: f64,
    },
}

#[derive(Debug, Clone)]
struct Dimension {
    field: Field,
    values: Vec<u64>,
}

/// A search space of accelerator configurations (docs/arch.md; docs/design.md §3, §7).
#[derive(Debug, Clone)]
pub struct SearchSpace {
    name: String,
    base: Base,
    /// In canonical field order.
    dimensions: Vec<Dimension>,
    rules: [Rule; 8],
    glb_bandwidth: GlbBandwidth,
    budget_mm2: f64,
    min_fraction: f64,
    /// A point matching every (field, value) of any one condition is exempt from the lower
    /// area bound.
    waivers: Vec<Vec<(Field, u64)>>,
    raw_len: usize,
    /// Configurations whose peak power exceeds the cap are left out.
    power_cap: Option<PowerCap>,
    /// The raw product index of every accepted point, rising: `len`, `get` and the
    /// neighbours' indices read it (8 bytes a configuration).
    accepted_raw: OnceLock<Vec<usize>>,
}

/// A ceiling on a configuration's peak power, with the model that prices it (the cost layer's:
/// this layer cannot price kernels).
#[derive(Clone, Copy)]
struct PowerCap {
    max_peak_power_w: f64,
    peak_power_w: fn(&ArchConfig) -> f64,
}

impl PowerCap {
    fn admits(&self, arch: &ArchConfig) -> bool {
        (self.peak_power_w)(arch) <= self.max_peak_power_w
    }
}

impl std::fmt::Debug for PowerCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerCap")
            .field("max_peak_power_w", &self.max_peak_power_w)
            .finish_non_exhaustive()
    }
}

impl SearchSpace {
    /// Reads and validates a space file. Errors name the file, the field and the reason.
    pub fn load(path: &Path) -> Result<SearchSpace, InputError> {
        let text = read_input(path)?;
        let raw: SpaceFile = parse_toml(path, &text)?;
        SearchSpace::from_file(path, raw)
    }

    fn from_file(file: &Path, raw: SpaceFile) -> Result<SearchSpace, InputError> {
        if raw.name.trim().is_empty() {
            return Err(InputError::invalid(file, "name", "must not be empty"));
        }
        validate_environment(
            file,
            "base.",
            &Environment {
                clock_hz: raw.base.clock_hz,
                hbm: &raw.base.hbm,
                interconnect: &raw.base.interconnect,
                efficiency: &raw.base.efficiency,
                vector_cycles: &raw.base.vector_cycles,
                energy: &raw.base.energy,
            },
        )?;

        let mut rules: [Option<(Rule, String)>; 8] = Default::default();
        let mut define = |field: Field, rule: Rule, at: String| match &rules[field as usize] {
            Some((_, first)) => Err(InputError::invalid(
                file,
                at,
                format!("`{}` is already defined at `{first}`", field.path()),
            )),
            None => {
                rules[field as usize] = Some((rule, at));
                Ok(())
            }
        };

        let mut dimensions = Vec::new();
        for (field, at, value) in flatten(file, "dimensions", &raw.dimensions)? {
            let values = parse_values(file, &at, field, value)?;
            dimensions.push(Dimension { field, values });
        }
        if dimensions.is_empty() {
            return Err(InputError::invalid(
                file,
                "dimensions",
                "no dimensions: a space searches at least one field",
            ));
        }
        dimensions.sort_by_key(|d| d.field);
        for (i, dim) in dimensions.iter().enumerate() {
            define(
                dim.field,
                Rule::Dimension(i),
                format!("dimensions.{}", dim.field.path()),
            )?;
        }

        for (field, at, value) in flatten(file, "ties", &raw.ties)? {
            let target_path = value.as_str().ok_or_else(|| {
                InputError::invalid(
                    file,
                    &at,
                    format!(
                        "expected the name of a searched field as a string, got a {}",
                        value.type_str()
                    ),
                )
            })?;
            let target = Field::parse(target_path).ok_or_else(|| {
                InputError::invalid(
                    file,
                    &at,
                    format!(
                        "unknown tie target `{target_path}`; known fields: {}",
                        known_fields()
                    ),
                )
            })?;
            let Some(dim) = dimensions.iter().find(|d| d.field == target) else {
                return Err(InputError::invalid(
                    file,
                    &at,
                    format!("tie target `{target_path}` is not a dimension of this space"),
                ));
            };
            if let Some(&v) = dim.values.iter().find(|&&v| v > field.max_value()) {
                return Err(InputError::invalid(
                    file,
                    &at,
                    format!(
                        "value {v} of `{target_path}` does not fit `{}` (at most {})",
                        field.path(),
                        field.max_value()
                    ),
                ));
            }
            define(field, Rule::Tie(target), at)?;
        }

        let derived = raw.derived;
        if let Some(d) = derived.tensor_local_buffer {
            let at = "derived.tensor_local_buffer";
            positive(file, &format!("{at}.bytes_per_mac"), d.bytes_per_mac)?;
            let rule = Rule::Derived {
                bytes_per_unit: d.bytes_per_mac,
                min_bytes: d.min_bytes,
            };
            define(Field::TensorLocalBuffer, rule, at.to_string())?;
        }
        if let Some(d) = derived.vector_local_buffer {
            let at = "derived.vector_local_buffer";
            positive(file, &format!("{at}.bytes_per_lane"), d.bytes_per_lane)?;
            let rule = Rule::Derived {
                bytes_per_unit: d.bytes_per_lane,
                min_bytes: d.min_bytes,
            };
            define(Field::VectorLocalBuffer, rule, at.to_string())?;
        }
        let glb_bandwidth = parse_glb_bandwidth(file, derived.glb_bandwidth)?;

        let mut complete = [Rule::Dimension(0); 8];
        for field in FIELDS {
            match &rules[field as usize] {
                Some((rule, _)) => complete[field as usize] = *rule,
                None => {
                    return Err(InputError::invalid(
                        file,
                        field.path(),
                        "not defined: give it a dimension, a tie or (local buffers) a derived rule",
                    ))
                }
            }
        }

        let raw_len = dimensions
            .iter()
            .try_fold(1usize, |n, d| n.checked_mul(d.values.len()))
            .ok_or_else(|| {
                InputError::invalid(
                    file,
                    "dimensions",
                    "the number of combinations overflows the index type",
                )
            })?;

        let mut space = SearchSpace {
            name: raw.name,
            base: raw.base,
            dimensions,
            rules: complete,
            glb_bandwidth,
            budget_mm2: 0.0,
            min_fraction: 0.0,
            waivers: Vec::new(),
            raw_len,
            power_cap: None,
            accepted_raw: OnceLock::new(),
        };
        space.set_area_window(file, raw.area)?;
        Ok(space)
    }

    fn set_area_window(&mut self, file: &Path, area: AreaFile) -> Result<(), InputError> {
        self.budget_mm2 = match (area.budget_mm2, area.budget_reference) {
            (Some(mm2), None) => {
                positive(file, "area.budget_mm2", mm2)?;
                mm2
            }
            (None, Some(reference)) => self.reference_area_mm2(file, &reference)?,
            _ => {
                return Err(InputError::invalid(
                    file,
                    "area",
                    "give exactly one of `budget_mm2` and `budget_reference`",
                ))
            }
        };
        if !(0.0..=1.0).contains(&area.min_fraction) {
            return Err(InputError::invalid(
                file,
                "area.min_fraction",
                format!("must be in [0, 1], got {}", area.min_fraction),
            ));
        }
        self.min_fraction = area.min_fraction;
        for (i, condition) in area.waive_min_when.iter().enumerate() {
            let at = format!("area.waive_min_when[{i}]");
            let entries = flatten(file, &at, condition)?;
            if entries.is_empty() {
                return Err(InputError::invalid(
                    file,
                    at,
                    "empty condition: it would waive the lower bound for every point",
                ));
            }
            let mut matches = Vec::with_capacity(entries.len());
            for (field, at, value) in entries {
                matches.push((field, positive_integer(file, &at, field, value)?));
            }
            self.waivers.push(matches);
        }
        Ok(())
    }

    /// Area of the point given by one value per dimension (ties and derived rules applied).
    fn reference_area_mm2(&self, file: &Path, reference: &toml::Table) -> Result<f64, InputError> {
        let mut point = [0u64; 8];
        for (field, at, value) in flatten(file, "area.budget_reference", reference)? {
            if !matches!(self.rules[field as usize], Rule::Dimension(_)) {
                return Err(InputError::invalid(
                    file,
                    at,
                    "not a dimension: tied and derived fields follow from the dimensions",
                ));
            }
            point[field as usize] = positive_integer(file, &at, field, value)?;
        }
        for dim in &self.dimensions {
            if point[dim.field as usize] == 0 {
                return Err(InputError::invalid(
                    file,
                    "area.budget_reference",
                    format!("missing a value for dimension `{}`", dim.field.path()),
                ));
            }
        }
        self.complete(&mut point);
        Ok(area_fields(&point).breakdown().total_mm2)
    }

    /// The space without the configurations whose `peak_power_w` exceeds `max_peak_power_w`
    /// (watts): the configurations that remain keep their order and are numbered afresh.
    pub fn with_power_cap(
        self,
        max_peak_power_w: f64,
        peak_power_w: fn(&ArchConfig) -> f64,
    ) -> SearchSpace {
        SearchSpace {
            power_cap: Some(PowerCap {
                max_peak_power_w,
                peak_power_w,
            }),
            accepted_raw: OnceLock::new(),
            ..self
        }
    }

    /// The space's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// HBM capacity of the space's base chip, bytes.
    pub fn base_hbm_bytes(&self) -> u64 {
        self.base.hbm.capacity_bytes
    }

    /// Upper end of the area window, in mm².
    pub fn area_budget_mm2(&self) -> f64 {
        self.budget_mm2
    }

    /// Number of configurations that satisfy the area window (and the power cap, if any). The
    /// first call makes one pass over the raw product (in parallel); later calls are free.
    pub fn len(&self) -> usize {
        self.accepted_raw().len()
    }

    /// Whether no configuration satisfies the area window (and the power cap, if any).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All configurations in the space's deterministic order, generated lazily.
    pub fn iter(&self) -> impl Iterator<Item = ArchConfig> + '_ {
        (0..self.raw_len).filter_map(move |raw| self.accepted_point(raw).map(|p| self.build(&p)))
    }

    /// The `index`-th configuration of [`SearchSpace::iter`], without generating the others.
    pub fn get(&self, index: usize) -> Option<ArchConfig> {
        let raw = self.raw_of(index)?;
        self.accepted_point(raw).map(|p| self.build(&p))
    }

    /// The configurations one step away from the `index`-th along one searched dimension (the
    /// next smaller or larger value of one field, the others held), by index, rising; those
    /// outside the area window or the power cap are left out.
    pub fn neighbours(&self, index: usize) -> Vec<usize> {
        let Some(raw) = self.raw_of(index) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut stride = 1;
        for dim in self.dimensions.iter().rev() {
            let len = dim.values.len();
            let position = (raw / stride) % len;
            if position > 0 {
                out.extend(self.index_of_raw(raw - stride));
            }
            if position + 1 < len {
                out.extend(self.index_of_raw(raw + stride));
            }
            stride *= len;
        }
        out.sort_unstable();
        out
    }

    /// The raw product index of the `index`-th configuration.
    fn raw_of(&self, index: usize) -> Option<usize> {
        self.accepted_raw().get(index).copied()
    }

    /// The index of the configuration at raw product index `raw`, if it is accepted.
    fn index_of_raw(&self, raw: usize) -> Option<usize> {
        self.accepted_raw().binary_search(&raw).ok()
    }

    /// Whether `arch` has the compute and memory structure of a point of the space: every
    /// searched field takes one of its values, ties and derived local buffers hold, the area
    /// lies in the window (and, under a power cap, the point's peak power within it), and clock
    /// and HBM bandwidth equal the base. Name, HBM capacity, GLB bandwidth (derived from the
    /// structure), interconnect, efficiency, vector cycles and energy are not compared.
    pub fn contains(&self, arch: &ArchConfig) -> bool {
        let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
        if !same(arch.clock_hz, self.base.clock_hz)
            || !same(
                arch.hbm.bandwidth_bytes_per_s,
                self.base.hbm.bandwidth_bytes_per_s,
            )
        {
            return false;
        }
        let point = point_of(arch);
        let in_dimensions = self
            .dimensions
            .iter()
            .all(|d| d.values.contains(&point[d.field as usize]));
        let mut completed = point;
        self.complete(&mut completed);
        in_dimensions
            && completed == point
            && self.accepts(&point)
            && self
                .power_cap
                .is_none_or(|cap| cap.admits(&self.build(&point)))
    }

    fn accepted_raw(&self) -> &[usize] {
        self.accepted_raw.get_or_init(|| {
            (0..self.raw_len.div_ceil(BLOCK))
                .into_par_iter()
                .flat_map_iter(|b| {
                    let end = ((b + 1) * BLOCK).min(self.raw_len);
                    (b * BLOCK..end).filter(|&raw| self.accepted_point(raw).is_some())
                })
                .collect()
        })
    }

    /// The point at raw product index `raw` when it satisfies the area window and the power
    /// cap.
    fn accepted_point(&self, raw: usize) -> Option<Point> {
        let mut point = [0u64; 8];
        let mut rest = raw;
        for dim in self.dimensions.iter().rev() {
            point[dim.field as usize] = dim.values[rest % dim.values.len()];
            rest /= dim.values.len();
        }
        self.complete(&mut point);
        let powered = |p: &Point| self.power_cap.is_none_or(|cap| cap.admits(&self.build(p)));
        (self.accepts(&point) && powered(&point)).then_some(point)
    }

    /// Fills tied and derived fields from the searched ones.
    fn complete(&self, point: &mut Point) {
        for field in FIELDS {
            if let Rule::Tie(target) = self.rules[field as usize] {
                point[field as usize] = point[target as usize];
            }
        }
        for field in FIELDS {
            if let Rule::Derived {
                bytes_per_unit,
                min_bytes,
            } = self.rules[field as usize]
            {
                let units = match field {
                    Field::TensorLocalBuffer => {
                        point[Field::TensorRows as usize] * point[Field::TensorCols as usize]
                    }
                    _ => point[Field::VectorLanes as usize],
                };
                // Float-to-int `as` saturates, so absurd rules cannot wrap around.
                let bytes = (bytes_per_unit * units as f64).ceil() as u64;
                point[field as usize] = bytes.max(min_bytes);
            }
        }
    }

    fn accepts(&self, point: &Point) -> bool {
        let area_mm2 = area_fields(point).breakdown().total_mm2;
        area_mm2 <= self.budget_mm2
            && (area_mm2 >= self.min_fraction * self.budget_mm2
                || self
                    .waivers
                    .iter()
                    .any(|c| c.iter().all(|&(f, v)| point[f as usize] == v)))
    }

    fn build(&self, p: &Point) -> ArchConfig {
        let get = |f: Field| p[f as usize];
        // Load checked that every value of a 32-bit field fits.
        let get32 = |f: Field| get(f) as u32;
        let tensor = TensorCores {
            count: get32(Field::TensorCount),
            rows: get32(Field::TensorRows),
            cols: get32(Field::TensorCols),
            local_buffer_bytes: get(Field::TensorLocalBuffer),
            stream_k: false,
        };
        let vector = VectorCores {
            count: get32(Field::VectorCount),
            lanes: get32(Field::VectorLanes),
            local_buffer_bytes: get(Field::VectorLocalBuffer),
        };
        let bandwidth_bytes_per_s = match self.glb_bandwidth {
            GlbBandwidth::PerEdge { bytes_per_cycle } => {
                let edge = tensor.count as f64 * (tensor.rows as f64 + tensor.cols as f64);
                bytes_per_cycle * edge * self.base.clock_hz
            }
            GlbBandwidth::Fixed { bytes_per_s } => bytes_per_s,
        };
        let mut name = format!(
            "tc{}x{}x{}-vc{}x{}-glb{}",
            tensor.count,
            tensor.rows,
            tensor.cols,
            vector.count,
            vector.lanes,
            exact_bytes(get(Field::GlbBytes))
        );
        // Searched or tied local buffers must appear in the name to keep names unique.
        for (field, tag) in [
            (Field::TensorLocalBuffer, "tl"),
            (Field::VectorLocalBuffer, "vl"),
        ] {
            if !matches!(self.rules[field as usize], Rule::Derived { .. }) {
                name.push_str(&format!("-{tag}{}", exact_bytes(get(field))));
            }
        }
        ArchConfig {
            name,
            clock_hz: self.base.clock_hz,
            tensor,
            vector,
            glb: GlobalBuffer {
                bytes: get(Field::GlbBytes),
                bandwidth_bytes_per_s,
            },
            hbm: self.base.hbm,
            interconnect: self.base.interconnect.clone(),
            efficiency: self.base.efficiency.clone(),
            vector_cycles: self.base.vector_cycles,
            energy: self.base.energy,
            die_area_mm2: None,
            kernel_execution: KernelExecution::Concurrent,
        }
    }
}

fn parse_glb_bandwidth(
    file: &Path,
    rule: Option<GlbBandwidthFile>,
) -> Result<GlbBandwidth, InputError> {
    let at = "derived.glb_bandwidth";
    match rule {
        Some(GlbBandwidthFile {
            bytes_per_cycle_per_edge: Some(bytes_per_cycle),
            bytes_per_s: None,
        }) => {
            positive(
                file,
                &format!("{at}.bytes_per_cycle_per_edge"),
                bytes_per_cycle,
            )?;
            Ok(GlbBandwidth::PerEdge { bytes_per_cycle })
        }
        Some(GlbBandwidthFile {
            bytes_per_cycle_per_edge: None,
            bytes_per_s: Some(bytes_per_s),
        }) => {
            positive(file, &format!("{at}.bytes_per_s"), bytes_per_s)?;
            Ok(GlbBandwidth::Fixed { bytes_per_s })
        }
        _ => Err(InputError::invalid(
            file,
            at,
            "give exactly one of `bytes_per_cycle_per_edge` and `bytes_per_s`",
        )),
    }
}

/// Walks `table` (under `section`), accepting both quoted field paths (`"tensor.count" = …`)
/// and nested tables (`[dimensions.tensor] count = …`). Returns (field, full path, value).
fn flatten<'a>(
    file: &Path,
    section: &str,
    table: &'a toml::Table,
) -> Result<Vec<(Field, String, &'a toml::Value)>, InputError> {
    let mut out = Vec::new();
    flatten_into(file, section, "", table, &mut out)?;
    Ok(out)
}

fn flatten_into<'a>(
    file: &Path,
    section: &str,
    prefix: &str,
    table: &'a toml::Table,
    out: &mut Vec<(Field, String, &'a toml::Value)>,
) -> Result<(), InputError> {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let at = format!("{section}.{path}");
        if let Some(field) = Field::parse(&path) {
            if out.iter().any(|(f, _, _)| *f == field) {
                return Err(InputError::invalid(file, at, "given twice"));
            }
            out.push((field, at, value));
        } else if let (Some(inner), true) = (value.as_table(), SECTIONS.contains(&path.as_str())) {
            flatten_into(file, section, &path, inner, out)?;
        } else {
            return Err(InputError::invalid(
                file,
                at,
                format!("unknown field; known fields: {}", known_fields()),
            ));
        }
    }
    Ok(())
}

/// A dimension's values: a list of positive integers or a power-of-two range `{ min, max }`.
fn parse_values(
    file: &Path,
    at: &str,
    field: Field,
    value: &toml::Value,
) -> Result<Vec<u64>, InputError> {
    let values = match value {
        toml::Value::Array(items) => {
            if items.is_empty() {
                return Err(InputError::invalid(
                    file,
                    at,
                    "empty list of values: a dimension needs at least one value",
                ));
            }
            let mut values = Vec::with_capacity(items.len());
            for item in items {
                let v = positive_integer(file, at, field, item)?;
                if values.contains(&v) {
                    return Err(InputError::invalid(
                        file,
                        at,
                        format!("value {v} listed twice"),
                    ));
                }
                values.push(v);
            }
            values
        }
        toml::Value::Table(range) => {
            if let Some(key) = range.keys().find(|k| *k != "min" && *k != "max") {
                return Err(InputError::invalid(
                    file,
                    format!("{at}.{key}"),
                    "unknown key; a power-of-two range has `min` and `max`",
                ));
            }
            let bound = |key: &str| -> Result<u64, InputError> {
                let at = format!("{at}.{key}");
                let v = range.get(key).ok_or_else(|| {
                    InputError::invalid(file, &at, "missing bound of the power-of-two range")
                })?;
                let v = positive_integer(file, &at, field, v)?;
                if v.is_power_of_two() {
                    Ok(v)
                } else {
                    Err(InputError::invalid(
                        file,
                        at,
                        format!("{v} is not a power of two"),
                    ))
                }
            };
            let (min, max) = (bound("min")?, bound("max")?);
            if min > max {
                return Err(InputError::invalid(
                    file,
                    at,
                    format!("empty range: min {min} exceeds max {max}"),
                ));
            }
            std::iter::successors(Some(min), |&v| v.checked_mul(2).filter(|&n| n <= max)).collect()
        }
        other => {
            return Err(InputError::invalid(
                file,
                at,
                format!(
                    "expected a list of values or a power-of-two range {{ min, max }}, got a {}",
                    other.type_str()
                ),
            ))
        }
    };
    Ok(values)
}

/// A positive integer that fits `field`.
fn positive_integer(
    file: &Path,
    at: &str,
    field: Field,
    value: &toml::Value,
) -> Result<u64, InputError> {
    match value.as_integer() {
        Some(v) if v > 0 && v.unsigned_abs() <= field.max_value() => Ok(v.unsigned_abs()),
        Some(v) => Err(InputError::invalid(
            file,
            at,
            format!(
                "must be a positive integer of at most {}, got {v}",
                field.max_value()
            ),
        )),
        None => Err(InputError::invalid(
            file,
            at,
            format!("must be a positive integer, got a {}", value.type_str()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::chip::validate_chip;

    const PHAZE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/arch_specs/phaze.toml");

    #[test]
    fn every_phaze_point_is_a_valid_chip() {
        let space = SearchSpace::load(Path::new(PHAZE)).unwrap();
        for arch in space.iter() {
            validate_chip(Path::new(PHAZE), &arch).unwrap();
        }
    }

    /// Neighbours against brute force over the whole space: configurations whose searched
    /// fields differ in exactly one, by one step of that field's values.
    #[test]
    fn neighbours_differ_by_one_step_of_one_field() {
        let space = SearchSpace::load(Path::new(PHAZE)).unwrap();
        let steps = |p: &Point| -> Vec<usize> {
            space
                .dimensions
                .iter()
                .map(|d| {
                    d.values
                        .iter()
                        .position(|&v| v == p[d.field as usize])
                        .unwrap()
                })
                .collect()
        };
        let all: Vec<Vec<usize>> = space.iter().map(|a| steps(&point_of(&a))).collect();
        // `get` is the lazy iteration's `index`-th configuration.
        for (index, arch) in space.iter().enumerate().step_by(97) {
            assert_eq!(space.get(index).unwrap().name, arch.name);
        }
        assert!(space.get(all.len()).is_none());
        for index in [0, 1, 977, 14_000, all.len() - 1] {
            let expected: Vec<usize> = (0..all.len())
                .filter(|&j| {
                    let moved: Vec<usize> = all[index]
                        .iter()
                        .zip(&all[j])
                        .map(|(a, b)| a.abs_diff(*b))
                        .collect();
                    moved.iter().sum::<usize>() == 1
                })
                .collect();
            assert!(!expected.is_empty());
            assert_eq!(space.neighbours(index), expected, "configuration {index}");
        }
        assert!(space.neighbours(all.len()).is_empty());
    }
}
