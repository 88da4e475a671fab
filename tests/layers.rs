//! The layers of docs/ARCHITECTURE.md hold: every module of `src/` is in its
//! table, no `crate::` path goes from a module to one in a higher layer, and
//! the modules' imports make no cycle. The surfaces are crates of their
//! own, so the compiler holds them to the public API; the library's own
//! dependencies hold none of theirs.
//!
//! The imports are read from the source: every `crate::x` path and every
//! `use crate::{x, y::z}` group outside comments and outside the unit tests
//! at the end of a file (`#[cfg(test)]`), which may drive a module through
//! the layers above it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module → (layer number, layer name), from the table in the document.
fn layers() -> BTreeMap<String, (u32, String)> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | 2 core | `db` | its job |
        if cells.len() < 4 || !cells[2].starts_with('`') {
            continue;
        }
        let (number, name) = cells[1]
            .split_once(' ')
            .expect("`N name` in the layer column");
        let module = cells[2].trim_matches('`').to_string();
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

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The module a source file belongs to: `src/db.rs` → `db`, every file under
/// `src/store/` → `store`.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(root().join("src")).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
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

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The modules a file's code names through `crate::`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c, d::{e, f}}`: the top-level names.
            let (mut depth, mut item_start) = (0, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident(&group[i..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest).to_string());
        }
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

/// module → the modules it imports (the bin and re-exports left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in files {
        let module = module_of(&path);
        if module == "bin" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let deps = graph.entry(module.clone()).or_default();
        for dep in imports(&code(&text)) {
            if dep != module {
                deps.insert(dep);
            }
        }
    }
    graph
}

#[test]
fn every_import_flows_down_the_layers_of_the_architecture_document() {
    let layers = layers();
    let graph = graph();
    let mut wrong = Vec::new();
    for (module, deps) in &graph {
        let Some((layer, name)) = layers.get(module) else {
            wrong.push(format!("{module}: not in docs/ARCHITECTURE.md's table"));
            continue;
        };
        for dep in deps {
            match layers.get(dep) {
                // `crate::Error` and friends go through lib's re-exports:
                // below the facade, name the defining module.
                None if dep.starts_with(char::is_uppercase) => wrong.push(format!(
                    "{module} uses crate::{dep}: name its module (crate::<module>::{dep})"
                )),
                None => wrong.push(format!("{module} uses {dep}, which the table lacks")),
                Some((l, n)) if l > layer => wrong.push(format!(
                    "{module} ({layer} {name}) uses {dep} ({l} {n}): an import up the layers"
                )),
                Some(_) => {}
            }
        }
    }
    for module in layers.keys() {
        if !graph.contains_key(module) {
            wrong.push(format!("{module} is in the table but not in src/"));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
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
fn the_reader_finds_imports_in_paths_and_groups_but_not_in_comments_or_strings() {
    let src = "use crate::a::B;\nuse crate::{c, d::e, f::{g, h}};\nlet x = crate::i::j();\n\
               // crate::k\nlet s = \"crate::l\";\n#[cfg(test)]\nmod tests { use crate::m; }\n";
    let got: Vec<String> = imports(&code(src)).into_iter().collect();
    assert_eq!(got, ["a", "c", "d", "f", "i"]);
}
