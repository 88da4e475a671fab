//! The layers of docs/ARCHITECTURE.md hold, and the tree shows them: every
//! source file of `src/` is in the document's table, in the layer its
//! folder is (`base/` 0, `store/` 1, `core/` 2, `work/` 3, `runtime/` 4,
//! the facade's files at the top 5); no `crate::` path goes from a file to
//! one in a higher layer; a backend's folders (`store/sqlite/`,
//! `core/sqlite/`, …) are named only by that backend's own folders and the
//! facade; and the files' imports make no cycle. The surfaces are crates of their own, so the compiler
//! holds them to the public API; the library's own dependencies hold none
//! of theirs.
//!
//! The imports are read from the source: every `crate::…` path, use-trees
//! (`use crate::{a::b, c::{d, e}}`) expanded, outside comments, string
//! literals and the unit tests at the end of a file (`#[cfg(test)]`), which
//! may drive a module through the layers above it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The layer a folder of `src/` is, by its first component.
fn layer_of(module: &str) -> (u32, &'static str) {
    match module.split("::").next().unwrap() {
        "base" => (0, "base"),
        "store" => (1, "store"),
        "core" => (2, "core"),
        "work" => (3, "work"),
        "runtime" => (4, "runtime"),
        _ => (5, "facade"),
    }
}

/// The backends: each a folder of that name in the layers that differ by
/// backend (`store/sqlite/` and `core/sqlite/`, …), which only they and the
/// facade name — a vertical slice.
const BACKENDS: &[&str] = &["sqlite", "postgres"];

fn backend_of(module: &str) -> Option<&'static str> {
    let mut segs = module.split("::");
    segs.next();
    let folder = segs.next()?;
    BACKENDS.iter().find(|b| **b == folder).copied()
}

/// The conformance suite (tests only, `#[cfg(test)]`): it drives every
/// backend, through the layers above the store as unit tests may.
fn is_suite(module: &str) -> bool {
    module == "store::conformance" || module.starts_with("store::conformance::")
}

/// Module path → (layer number, layer name), from the table in the
/// document: `| 2 core | `core/db` | its job |`.
fn table() -> BTreeMap<String, (u32, String)> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[2].starts_with('`') {
            continue;
        }
        let (number, name) = cells[1]
            .split_once(' ')
            .expect("`N name` in the layer column");
        let module = cells[2].trim_matches('`').replace('/', "::");
        let number: u32 = number.parse().expect("a layer number");
        assert!(
            out.insert(module.clone(), (number, name.to_string()))
                .is_none(),
            "{module} is listed twice"
        );
    }
    assert!(out.len() > 10, "the table was read");
    out
}

/// The module a source file is: `src/core/db.rs` → `core::db`,
/// `src/runtime/mod.rs` → `runtime`, `src/lib.rs` → `lib`.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(root().join("src")).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts.join("::")
}

/// The source without comments, string literals' contents, or the unit
/// tests at the end.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        let (mut in_str, mut escaped) = (false, false);
        let mut prev = ' ';
        for c in line.chars() {
            if in_str {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            if c == '/' && prev == '/' {
                out.pop();
                break;
            }
            if c == '"' {
                in_str = true;
            }
            out.push(c);
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// The paths a use-tree after `crate::` names, expanded: `a::b` →
/// [`a::b`]; `{a::b, c::{d, e}}` → [`a::b`, `c::d`, `c::e`].
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) -> usize {
    let mut path = prefix.to_string();
    let mut i = 0;
    let bytes: Vec<char> = tree.chars().collect();
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphanumeric() || c == '_' {
            path.push(c);
            i += 1;
        } else if c == ':' && bytes.get(i + 1) == Some(&':') {
            path.push_str("::");
            i += 2;
        } else if c == '{' {
            i += 1;
            loop {
                while i < bytes.len() && (bytes[i].is_whitespace() || bytes[i] == ',') {
                    i += 1;
                }
                if i >= bytes.len() || bytes[i] == '}' {
                    return i + 1;
                }
                let rest: String = bytes[i..].iter().collect();
                i += expand(&rest, &path, out);
            }
        } else {
            break;
        }
        if i < bytes.len() && (bytes[i] == ',' || bytes[i] == '}') {
            break;
        }
    }
    let trimmed = path.trim_end_matches("::").to_string();
    if !trimmed.is_empty() && trimmed != prefix.trim_end_matches("::") {
        out.push(trimmed);
    }
    // Step over an `as` rename or what follows the path, to the item's end.
    while i < bytes.len() && bytes[i] != ',' && bytes[i] != '}' {
        if bytes[i] == ';' || bytes[i] == '\n' || bytes[i] == '(' || bytes[i] == '<' {
            return i;
        }
        i += 1;
    }
    i
}

/// Every path a file's code names through `crate::`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().last().unwrap_or(' ');
        if before.is_ascii_alphanumeric() || before == '_' || before == '$' {
            continue;
        }
        expand(&code[at + "crate::".len()..], "", &mut out);
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module of `src/`.
fn modules() -> BTreeSet<String> {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    files.iter().map(|p| module_of(p)).collect()
}

/// The module a path lands in: its longest prefix that is a module.
fn target(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// module → the modules it imports (`lib`'s re-exports left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in files {
        let module = module_of(&path);
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let deps = graph.entry(module.clone()).or_default();
        for p in crate_paths(&code(&text)) {
            let dep = target(&p, &modules).unwrap_or_else(|| format!("?{p}"));
            if dep != module {
                deps.insert(dep);
            }
        }
    }
    graph
}

/// Whether `dep` is a folder (`mod.rs`) that `module` sits in: a file may
/// use what its own folder declares.
fn is_ancestor(dep: &str, module: &str) -> bool {
    module.starts_with(&format!("{dep}::"))
}

#[test]
fn every_file_is_in_the_layer_its_folder_is_and_in_the_document() {
    let table = table();
    let modules = modules();
    let mut wrong = Vec::new();
    for m in &modules {
        if m == "lib" {
            continue;
        }
        match table.get(m) {
            None => wrong.push(format!("{m}: not in docs/ARCHITECTURE.md's table")),
            Some((n, name)) if (*n, name.as_str()) != layer_of(m) => {
                let (l, ln) = layer_of(m);
                wrong.push(format!(
                    "{m}: the table says {n} {name}, its folder {l} {ln}"
                ));
            }
            Some(_) => {}
        }
    }
    for m in table.keys() {
        if !modules.contains(m) {
            wrong.push(format!("{m} is in the table but not in src/"));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

#[test]
fn every_import_flows_down_the_layers_and_backends_keep_to_their_folders() {
    let graph = graph();
    let mut wrong = Vec::new();
    for (module, deps) in &graph {
        if is_suite(module) {
            continue;
        }
        let (layer, name) = layer_of(module);
        for dep in deps {
            if let Some(p) = dep.strip_prefix('?') {
                // `crate::Error` and friends go through lib's re-exports:
                // below the facade, name the defining module.
                if layer < 5 {
                    wrong.push(format!("{module} uses crate::{p}: name its module"));
                }
                continue;
            }
            if is_ancestor(dep, module) {
                continue;
            }
            let (l, n) = layer_of(dep);
            if l > layer {
                wrong.push(format!(
                    "{module} ({layer} {name}) uses {dep} ({l} {n}): an import up the layers"
                ));
            }
            // Only a backend's own folders, and the facade, name a backend.
            if let Some(b) = backend_of(dep)
                && layer < 5
                && backend_of(module) != Some(b)
            {
                wrong.push(format!(
                    "{module} uses {dep}: only {b}'s own folders name it"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

#[test]
fn every_backend_implements_every_table_group_in_a_file_of_its_name() {
    // Backends are slices: `store/<backend>/` has a file for each table
    // group of the seam (`store/<group>.rs`), so a third backend is a new
    // folder with the same list, and nothing else in `store/` changes.
    let names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                (p.extension().is_some_and(|x| x == "rs") && p.file_stem().unwrap() != "mod")
                    .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
            })
            .collect()
    };
    let store = root().join("src/store");
    let groups = names(&store);
    assert!(
        groups.contains("events") && groups.contains("runs"),
        "{groups:?}"
    );
    for backend in BACKENDS {
        let files = names(&store.join(backend));
        let missing: Vec<_> = groups.difference(&files).collect();
        assert!(missing.is_empty(), "store/{backend}/ lacks {missing:?}");
    }
}

#[test]
fn no_two_modules_need_each_other() {
    let graph = graph();
    // Depth-first search for a back edge, reporting the cycle it closes.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if !done.insert(m.to_string()) {
            return None;
        }
        path.push(m.to_string());
        for dep in graph.get(m).into_iter().flatten() {
            // A folder's `mod.rs` declares its files; a file naming its
            // folder's items is no cycle.
            if is_ancestor(dep, m) {
                continue;
            }
            if let Some(c) = visit(dep, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        if let Some(cycle) = visit(m, &graph, &mut Vec::new(), &mut done) {
            panic!("a cycle: {}", cycle.join(" → "));
        }
    }
}

#[test]
fn the_library_depends_on_none_of_the_surfaces_dependencies() {
    // An application that embeds the engine compiles no CLI parser, no
    // HTTP or WebSocket code: those are the surfaces' crates' (under
    // crates/), which depend on the library, never the other way.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let deps = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    for surface in [
        "clap",
        "comfy-table",
        "ctrlc",
        "env_logger",
        "humantime",
        "indicatif",
        "httparse",
        "tungstenite",
        "subtle",
        "form_urlencoded",
        "percent-encoding",
        "reflexr-admin",
        "reflexr-mcp",
    ] {
        assert!(
            !deps.lines().any(|l| l.starts_with(&format!("{surface} "))),
            "the library depends on {surface}"
        );
    }
    assert!(deps.contains("rusqlite"), "the table was read: {deps}");
}

#[test]
fn the_reader_expands_paths_and_use_trees_but_not_comments_or_strings() {
    let src = "use crate::a::B;\nuse crate::{c, d::e, f::{g, h::I}};\nlet x = crate::i::j();\n\
               // crate::k\nlet s = \"crate::l\";\n#[serde(with = \"x\")] y: $crate::m,\n\
               #[cfg(test)]\nmod tests { use crate::n; }\n";
    let mut got = crate_paths(&code(src));
    got.sort();
    assert_eq!(got, ["a::B", "c", "d::e", "f::g", "f::h::I", "i::j"]);
}
