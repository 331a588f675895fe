//! The layering of ARCHITECTURE.md's code map, enforced. Every path into the crate from
//! `src/**/*.rs` — `use crate::…` lines, grouped (`use crate::{a, b::{c, d}}`) or not, paths
//! such as `crate::workload::X` in code, and `super::` chains that climb to the crate root —
//! names a top-level module; comments and string literals are left out. Each such edge must be
//! one the code map's "may not depend on" column allows, and that column must say what
//! [`FORBIDDEN`] and [`ONLY_ITEMS`] say. A failure names the file, the line and the edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The "may not depend on" column of ARCHITECTURE.md's code map: per top-level module of
/// `src/` (`cli` is the binary, `src/main.rs` and `src/cli/`), the modules it may not use.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "error",
        &[
            "vocab",
            "output",
            "workload",
            "arch",
            "cost",
            "schedule",
            "placement",
            "model",
            "search",
            "calibrate",
            "report",
        ],
    ),
    (
        "vocab",
        &[
            "error",
            "output",
            "workload",
            "arch",
            "cost",
            "schedule",
            "placement",
            "model",
            "search",
            "calibrate",
            "report",
        ],
    ),
    (
        "workload",
        &[
            "arch",
            "cost",
            "schedule",
            "placement",
            "model",
            "search",
            "calibrate",
        ],
    ),
    (
        "arch",
        &[
            "workload",
            "cost",
            "schedule",
            "placement",
            "model",
            "search",
            "calibrate",
        ],
    ),
    (
        "output",
        &[
            "error",
            "vocab",
            "workload",
            "arch",
            "cost",
            "schedule",
            "placement",
            "model",
            "search",
            "calibrate",
            "report",
        ],
    ),
    (
        "cost",
        &["schedule", "placement", "model", "search", "calibrate"],
    ),
    ("schedule", &["placement", "model", "search", "calibrate"]),
    (
        "placement",
        &["cost", "schedule", "model", "search", "calibrate"],
    ),
    ("model", &["search", "calibrate"]),
    ("search", &["calibrate"]),
    ("calibrate", &["search"]),
    (
        "report",
        &[
            "workload",
            "arch",
            "cost",
            "schedule",
            "placement",
            "model",
            "search",
            "calibrate",
        ],
    ),
    ("cli", &[]),
];

/// Partial rules: the module may use only these files' public items of the other module
/// (`schedule` reads `workload`'s graph types and the vocabulary it re-exports, never the
/// workload files, templates or the DAG format).
const ONLY_ITEMS: &[(&str, &str, &[&str])] = &[(
    "schedule",
    "workload",
    &["src/workload/graph.rs", "src/vocab.rs"],
)];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One path into the crate from a file: the top-level module it names, the item after it (if
/// any) and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Edge {
    to: String,
    item: Option<String>,
    line: usize,
}

/// The text with comments and the contents of string and character literals replaced by
/// spaces (newlines kept, so line numbers hold).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (next == Some('"') || next == Some('#'))
            && !c[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string r"…" or r#"…"#: closed by a quote and as many hashes.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            out.extend(std::iter::repeat_n(' ', j - i + 1));
            i = j + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                    out.extend(std::iter::repeat_n(' ', hashes + 1));
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\''); a lifetime ('a) has no closing quote.
            out.push(' ');
            i += 1;
            if c.get(i) == Some(&'\\') {
                out.push(' ');
                i += 1;
            }
            while i < c.len() && c[i] != '\'' {
                blank(&mut out, c[i]);
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Identifiers and the punctuation paths are made of, each with its line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        if c[i] == '\n' {
            line += 1;
            i += 1;
        } else if c[i].is_alphabetic() || c[i] == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((c[start..i].iter().collect(), line));
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push(("::".into(), line));
            i += 2;
        } else if c[i].is_whitespace() {
            i += 1;
        } else {
            out.push((c[i].to_string(), line));
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|ch: char| ch.is_alphabetic() || ch == '_')
}

/// The paths of a use tree (or of a plain path) starting at token `i`: groups expanded, each
/// path as its segments with their lines; and the token after it.
fn use_tree(t: &[(String, usize)], mut i: usize) -> (Vec<Vec<(String, usize)>>, usize) {
    match t.get(i).map(|(s, _)| s.as_str()) {
        Some("{") => {
            let mut paths = Vec::new();
            i += 1;
            while i < t.len() && t[i].0 != "}" {
                let (more, j) = use_tree(t, i);
                paths.extend(more);
                i = j;
                // Past the comma (or anything else a path does not take) to the next item.
                if t.get(i).is_some_and(|(s, _)| s != "}") {
                    i += 1;
                }
            }
            (paths, i + 1)
        }
        Some(s) if is_ident(s) || s == "*" => {
            let segment = t[i].clone();
            i += 1;
            if t.get(i).is_some_and(|(s, _)| s == "::") {
                let (tails, j) = use_tree(t, i + 1);
                let paths = tails
                    .into_iter()
                    .map(|tail| std::iter::once(segment.clone()).chain(tail).collect())
                    .collect();
                return (paths, j);
            }
            if t.get(i).is_some_and(|(s, _)| s == "as") {
                i += 2;
            }
            (vec![vec![segment]], i)
        }
        _ => (vec![Vec::new()], i),
    }
}

/// Every path into the crate root in `text`, a file `depth` modules below it (`src/x.rs` and
/// `src/x/mod.rs` 1, `src/x/y.rs` 2), as (module, item, line).
fn crate_paths(text: &str, depth: usize) -> Vec<Edge> {
    let t = tokens(&code_only(text));
    let mut edges = Vec::new();
    // Open braces, each marked whether it opened an inline `mod name { … }`.
    let mut braces: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let s = t[i].0.as_str();
        let after_path = i > 0 && t[i - 1].0 == "::";
        let at_root = if s == "crate" && !after_path && t.get(i + 1).is_some_and(|n| n.0 == "::") {
            Some(i + 2)
        } else if s == "super" && !after_path {
            let mut j = i;
            let mut climbs = 0;
            while t.get(j).is_some_and(|n| n.0 == "super")
                && t.get(j + 1).is_some_and(|n| n.0 == "::")
            {
                climbs += 1;
                j += 2;
            }
            let here = depth + braces.iter().filter(|&&m| m).count();
            (climbs > 0 && climbs >= here).then_some(j)
        } else {
            None
        };
        match (at_root, s) {
            (Some(start), _) => {
                let (paths, next) = use_tree(&t, start);
                for path in paths {
                    if let Some((to, line)) = path.first() {
                        edges.push(Edge {
                            to: to.clone(),
                            item: path.get(1).map(|(s, _)| s.clone()),
                            line: *line,
                        });
                    }
                }
                i = next.max(i + 1);
                continue;
            }
            (None, "{") => {
                let inline_mod = i >= 2 && t[i - 2].0 == "mod" && is_ident(&t[i - 1].0);
                braces.push(inline_mod);
            }
            (None, "}") => {
                braces.pop();
            }
            _ => {}
        }
        i += 1;
    }
    edges
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// A file's top-level module and its depth below the crate root; `None` for `src/lib.rs`.
fn module_of(relative: &Path) -> Option<(String, usize)> {
    let parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let depth = if parts.last().is_some_and(|f| f == "mod.rs") {
        parts.len() - 1
    } else {
        parts.len()
    };
    match parts.as_slice() {
        [file] if file == "lib.rs" => None,
        [file] if file == "main.rs" => Some(("cli".into(), 1)),
        [first, ..] => Some((first.trim_end_matches(".rs").to_string(), depth)),
        [] => None,
    }
}

/// The public items a file defines at its top level.
fn public_items(file: &str) -> BTreeSet<String> {
    let text = fs::read_to_string(root().join(file)).expect(file);
    text.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("pub ")?.split_whitespace();
            let kind = words.next()?;
            let name = words.next()?;
            ["struct", "enum", "fn", "type", "trait", "const", "static"]
                .contains(&kind)
                .then(|| {
                    name.split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                        .next()
                        .unwrap_or_default()
                        .to_string()
                })
        })
        .collect()
}

/// Why `edge` from `from` breaks the table, if it does.
fn violation(from: &str, edge: &Edge) -> Option<String> {
    if edge.to == from {
        return None;
    }
    let forbidden = FORBIDDEN
        .iter()
        .find(|(m, _)| *m == from)
        .map(|(_, f)| *f)
        .unwrap_or_default();
    if forbidden.contains(&edge.to.as_str()) {
        return Some(format!("{from} → {} (may not depend on it)", edge.to));
    }
    for (m, other, files) in ONLY_ITEMS {
        if *m == from && *other == edge.to {
            let allowed: BTreeSet<String> = files.iter().flat_map(|f| public_items(f)).collect();
            let ok = edge.item.as_ref().is_some_and(|i| allowed.contains(i));
            if !ok {
                return Some(format!(
                    "{from} → {}::{} (only the items of {} are allowed)",
                    edge.to,
                    edge.item.as_deref().unwrap_or("*"),
                    files.join(", ")
                ));
            }
        }
    }
    None
}

#[test]
fn every_module_keeps_the_code_map_layering() {
    let src = root().join("src");
    let mut broken = Vec::new();
    let mut modules = BTreeSet::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).expect("under src").to_path_buf();
        let Some((module, depth)) = module_of(&relative) else {
            continue;
        };
        modules.insert(module.clone());
        let text = fs::read_to_string(&file).expect("read source");
        for edge in crate_paths(&text, depth) {
            if let Some(why) = violation(&module, &edge) {
                broken.push(format!("src/{}:{}: {why}", relative.display(), edge.line));
            }
        }
    }
    let table: BTreeSet<String> = FORBIDDEN.iter().map(|(m, _)| m.to_string()).collect();
    assert_eq!(
        modules, table,
        "every top-level module of src/ needs a row in FORBIDDEN and ARCHITECTURE.md's code map"
    );
    assert!(
        broken.is_empty(),
        "forbidden dependencies (ARCHITECTURE.md, code map):\n{}",
        broken.join("\n")
    );
}

/// Command-line parsing is the binary's: no library file names `clap` (a library enum the CLI
/// offers as values is mirrored by a `ValueEnum` in `src/cli/`).
#[test]
fn the_library_does_not_use_clap() {
    let src = root().join("src");
    let mut uses = Vec::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).expect("under src").to_path_buf();
        if module_of(&relative).is_some_and(|(module, _)| module == "cli") {
            continue;
        }
        let text = fs::read_to_string(&file).expect("read source");
        for (token, line) in tokens(&code_only(&text)) {
            if token == "clap" {
                uses.push(format!("src/{}:{line}", relative.display()));
            }
        }
    }
    assert!(
        uses.is_empty(),
        "clap outside src/cli/ and src/main.rs:\n{}",
        uses.join("\n")
    );
}

/// The table here is the code map's: each row's "may not depend on" cell names (in backticks)
/// exactly the modules [`FORBIDDEN`] and [`ONLY_ITEMS`] give it.
#[test]
fn the_table_is_the_code_maps() {
    let map = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let names: BTreeSet<&str> = FORBIDDEN.iter().map(|(m, _)| *m).collect();
    let mut rows = BTreeMap::new();
    for line in map.lines() {
        let Some(rest) = line.strip_prefix("| `src/") else {
            continue;
        };
        let path = rest.split('`').next().unwrap_or_default();
        let module = path
            .trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_string();
        let cell = line
            .trim_end_matches('|')
            .rsplit('|')
            .next()
            .unwrap_or_default();
        let named: BTreeSet<String> = cell
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| names.contains(w))
            .map(str::to_string)
            .collect();
        rows.insert(module, named);
    }
    for (module, forbidden) in FORBIDDEN {
        let mut expected: BTreeSet<String> = forbidden.iter().map(|m| m.to_string()).collect();
        for (m, other, _) in ONLY_ITEMS {
            if m == module {
                expected.insert(other.to_string());
            }
        }
        assert_eq!(
            rows.get(*module),
            Some(&expected),
            "ARCHITECTURE.md's code map row for src/{module}"
        );
    }
}

/// The scanner finds every form of path (plain, grouped over lines, nested, in code, through
/// `super::` to the root) and nothing in comments, strings or inner `super::` paths.
#[test]
fn the_scanner_finds_every_form_of_path() {
    let text = r##"use crate::error::InputError;
use crate::{
    arch::Tier,
    workload::{self, OpGraph as G},
};
// use crate::cost::CostModel;
/* use crate::search; */
const S: &str = "crate::placement::Plan";
const R: &str = r#"crate::calibrate"#;
fn f<'a>(x: &'a str) -> char {
    let _ = crate::schedule::solve(x);
    let _ = super::report::table();
    let _ = super::sibling::g();
    '"'
}
mod inner {
    use super::super::vocab::Pass;
    use super::outer;
}
"##;
    let found: Vec<(String, Option<String>, usize)> = crate_paths(text, 1)
        .into_iter()
        .map(|e| (e.to, e.item, e.line))
        .collect();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        found,
        vec![
            ("error".into(), some("InputError"), 1),
            ("arch".into(), some("Tier"), 3),
            ("workload".into(), some("self"), 4),
            ("workload".into(), some("OpGraph"), 4),
            ("schedule".into(), some("solve"), 11),
            ("report".into(), some("table"), 12),
            ("sibling".into(), some("g"), 13),
            ("vocab".into(), some("Pass"), 17),
        ]
    );
    // One level deeper (src/x/y.rs), a single `super::` stays inside the module.
    assert!(crate_paths("use super::config::ArchConfig;", 2).is_empty());
    assert_eq!(
        violation(
            "arch",
            &Edge {
                to: "workload".into(),
                item: some("VectorOp"),
                line: 4
            }
        ),
        Some("arch → workload (may not depend on it)".into())
    );
    let schedule_uses = |item: &str| Edge {
        to: "workload".into(),
        item: some(item),
        line: 1,
    };
    assert_eq!(violation("schedule", &schedule_uses("OpGraph")), None);
    assert_eq!(violation("schedule", &schedule_uses("VectorOp")), None);
    assert!(violation("schedule", &schedule_uses("Workload")).is_some());
}
