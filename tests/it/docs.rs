//! The documentation says what is true of the tree: every test
//! docs/guide/guarantees.md cites as a promise's proof exists, in the file
//! it names; README.md's example is the crate docs' (the one rustdoc
//! compiles and runs); and no document or source carries the project's
//! history — an issue's number, a status of work under way — which is the
//! changelog's and the tracker's, and is wrong the day it is done.
//!
//! A test cited as written once for every backend is its generic
//! `fn name<B: TestBackend>()` with the `on_backends!(name)` line that makes
//! it tests (or a `mod name` of its own per-backend cases, as the property
//! tests have); any other is a `#[test] fn name` — in a file of `src/`,
//! within its `#[cfg(test)]` tests.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---------------------------------------------------------------------------
// The guarantees page's citations.

/// One citation of the guarantees page: a file, and a test in it (none
/// when the file as a whole is cited).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Citation {
    /// The page's line, for the message.
    line: usize,
    file: String,
    test: Option<String>,
}

/// A piece of a citation cell: a backticked name or the text between.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Code(String),
    Text(String),
}

/// A cell's pieces, its parenthesised comments left out: "`a.rs`: `x`
/// (a comment), `y`" → Code(a.rs), Text(:), Code(x), Text(,), Code(y).
fn pieces(cell: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let (mut text, mut depth) = (String::new(), 0usize);
    let mut chars = cell.chars();
    while let Some(c) = chars.next() {
        match c {
            '`' => {
                let code: String = chars.by_ref().take_while(|&c| c != '`').collect();
                if depth == 0 {
                    out.push(Piece::Text(std::mem::take(&mut text).trim().to_string()));
                    out.push(Piece::Code(code));
                }
            }
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("an unmatched `)` in {cell:?}"))?;
            }
            c if depth == 0 => text.push(c),
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("an unclosed `(` in {cell:?}"));
    }
    out.push(Piece::Text(text.trim().to_string()));
    out.retain(|p| *p != Piece::Text(String::new()));
    Ok(out)
}

fn is_file(code: &str) -> bool {
    code.ends_with(".rs")
        && !code.starts_with('/')
        && !code.split('/').any(|s| s.is_empty() || s == "..")
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
}

fn is_test_name(code: &str) -> bool {
    code.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && code
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The citations of one "proven by" cell, read strictly: groups
/// "`file.rs`" or "`file.rs`: `test`, `test`", each name or file with an
/// optional "(comment)", the groups parted by `;`, `,` or "and". Anything
/// else is an error, so a citation the reader does not understand is not
/// passed over.
fn cell_citations(line: usize, cell: &str) -> Result<Vec<Citation>, String> {
    let mut out = Vec::new();
    let mut file: Option<String> = None;
    // Whether the last separator was `file:`'s colon or a comma after one
    // of its names: a name may come next.
    let mut in_names = false;
    let mut names_of_file = 0;
    for piece in pieces(cell).map_err(|e| format!("line {line}: {e}"))? {
        match piece {
            Piece::Code(code) if is_file(&code) => {
                if let Some(f) = file.as_ref().filter(|_| in_names && names_of_file == 0) {
                    return Err(format!("line {line}: a `:` after `{f}` but no test"));
                }
                file = Some(code);
                in_names = false;
                names_of_file = 0;
            }
            Piece::Code(code) if is_test_name(&code) => {
                let Some(f) = file.as_ref().filter(|_| in_names) else {
                    return Err(format!(
                        "line {line}: `{code}` is not after a `file.rs:` in {cell:?}"
                    ));
                };
                out.push(Citation {
                    line,
                    file: f.clone(),
                    test: Some(code),
                });
                names_of_file += 1;
            }
            Piece::Code(code) => {
                return Err(format!(
                    "line {line}: `{code}` is neither a file nor a test's name"
                ));
            }
            Piece::Text(text) => {
                let Some(f) = file.as_ref() else {
                    return Err(format!("line {line}: {text:?} before any file in {cell:?}"));
                };
                match text.as_str() {
                    ":" if !in_names && names_of_file == 0 => in_names = true,
                    "," if in_names && names_of_file > 0 => {}
                    ";" | "," | "and" => {
                        if !in_names {
                            out.push(Citation {
                                line,
                                file: f.clone(),
                                test: None,
                            });
                        } else if names_of_file == 0 {
                            return Err(format!("line {line}: a `:` after `{f}` but no test"));
                        }
                        in_names = false;
                        names_of_file = 0;
                        file = None;
                    }
                    other => {
                        return Err(format!(
                            "line {line}: {other:?} after `{f}`: a citation is \
                             \"`file.rs`: `test`, `test`; `file.rs`\""
                        ));
                    }
                }
            }
        }
    }
    match file {
        Some(f) if !in_names => out.push(Citation {
            line,
            file: f,
            test: None,
        }),
        Some(f) if names_of_file == 0 => {
            return Err(format!("line {line}: a `:` after `{f}` but no test"));
        }
        _ => {}
    }
    if out.is_empty() {
        return Err(format!("line {line}: no citation in {cell:?}"));
    }
    Ok(out)
}

/// Every citation of a page's "proven by" columns, or the cells the reader
/// could not read.
fn citations(page: &str) -> Result<Vec<Citation>, Vec<String>> {
    let (mut out, mut errors) = (Vec::new(), Vec::new());
    // The "proven by" column of the table being read, if it has one.
    let mut column: Option<usize> = None;
    let mut in_header = false;
    for (i, line) in page.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if !trimmed.starts_with('|') {
            column = None;
            in_header = false;
            continue;
        }
        let cells: Vec<&str> = trimmed
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if column.is_none() && !in_header {
            // A table's first row is its header.
            column = cells.iter().position(|c| *c == "proven by");
            in_header = true;
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|c| c == '-' || c == ':'))
        {
            continue;
        }
        let Some(col) = column else { continue };
        match cells.get(col) {
            None => errors.push(format!("line {line_no}: no \"proven by\" cell")),
            Some(cell) => match cell_citations(line_no, cell) {
                Ok(c) => out.extend(c),
                Err(e) => errors.push(e),
            },
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Whether `line` (trimmed) is an attribute that makes a function a test.
fn is_test_attribute(line: &str) -> bool {
    line == "#[test]" || (line.starts_with("#[") && line.ends_with("::test]"))
}

/// The names an `on_backends!(a, b, …)` in `code` makes tests of
/// (`children_on_backends!` makes child sides, not tests).
fn on_backends(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, m) in code.match_indices("on_backends!") {
        let before = code[..at].chars().next_back().unwrap_or(' ');
        if before.is_alphanumeric() || before == '_' {
            continue;
        }
        let rest = code[at + m.len()..].trim_start();
        let Some(args) = rest.strip_prefix('(') else {
            continue;
        };
        let args = &args[..args.find(')').unwrap_or(args.len())];
        out.extend(
            args.split(',')
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty()),
        );
    }
    out
}

/// A `src` file's `#[cfg(test)] mod …`, to the file's end.
fn tests_module(text: &str) -> Option<&str> {
    text.match_indices("#[cfg(test)]")
        .map(|(at, _)| &text[at..])
        .find(|rest| {
            rest.lines()
                .skip(1)
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with("#["))
                .is_some_and(|l| {
                    l.starts_with("mod ") || (l.starts_with("pub") && l.contains(" mod "))
                })
        })
}

/// Whether a file's text holds the test `name`; `src` files' tests are in
/// their `#[cfg(test)]` part.
fn has_test(text: &str, name: &str, in_src: bool) -> bool {
    let code = if in_src {
        match tests_module(text) {
            Some(tests) => tests,
            None => return false,
        }
    } else {
        text
    };
    let lines: Vec<&str> = code.lines().collect();
    let declared = format!("fn {name}");
    for (i, line) in lines.iter().enumerate() {
        let Some(at) = line.find(&declared) else {
            continue;
        };
        let before = line[..at].chars().next_back().unwrap_or(' ');
        if before.is_alphanumeric() || before == '_' {
            continue;
        }
        let is_test = match line[at + declared.len()..].chars().next() {
            // Generic over the backend: tests once `on_backends!` (or a
            // module of its per-backend cases) makes them.
            Some('<') => {
                on_backends(code).iter().any(|n| n == name)
                    || code.contains(&format!("mod {name} {{"))
            }
            Some('(') => lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
                .any(is_test_attribute),
            _ => false,
        };
        if is_test {
            return true;
        }
    }
    false
}

/// Whether a file holds any test.
fn has_tests(text: &str) -> bool {
    text.lines().any(|l| is_test_attribute(l.trim())) || !on_backends(text).is_empty()
}

/// What is wrong with each citation: a file that is not there, a test not
/// in its file, a cited file with no test at all.
fn wrong_citations(root: &Path, citations: &[Citation]) -> Vec<String> {
    let mut wrong = Vec::new();
    for c in citations {
        let Ok(text) = std::fs::read_to_string(root.join(&c.file)) else {
            wrong.push(format!("line {}: `{}` does not exist", c.line, c.file));
            continue;
        };
        match &c.test {
            Some(t) if !has_test(&text, t, c.file.starts_with("src/")) => {
                wrong.push(format!("line {}: `{}` has no test `{t}`", c.line, c.file))
            }
            None if !has_tests(&text) => {
                wrong.push(format!("line {}: `{}` holds no test", c.line, c.file))
            }
            _ => {}
        }
    }
    wrong
}

#[test]
fn every_test_the_guarantees_page_cites_is_in_the_file_it_names() {
    let page = read("docs/guide/guarantees.md");
    let citations = citations(&page).unwrap_or_else(|e| panic!("\n{}", e.join("\n")));
    let named = citations.iter().filter(|c| c.test.is_some()).count();
    assert!(
        citations.len() > 50 && named > 40,
        "the tables were read: {} citations, {named} of tests",
        citations.len()
    );
    let wrong = wrong_citations(&root(), &citations);
    assert!(
        wrong.is_empty(),
        "docs/guide/guarantees.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_citation_reader_finds_a_missing_test_a_missing_file_and_a_cell_it_cannot_read() {
    let page = "\
| promise | proven by |
| --- | --- |
| one | `tests/it/docs.rs`: `the_citation_reader_finds_a_missing_test_a_missing_file_and_a_cell_it_cannot_read` (this one), `no_such_test`; `tests/it/no_such_file.rs` |
| two | `tests/it/docs.rs`: `root`, `every_test_the_guarantees_page_cites_is_in_the_file_it_names`; `tests/it/main.rs` and `tests/it/log.rs`: `concurrent_appenders_get_gap_free_seqs_in_commit_order` |
| three | `src/work/evaluate.rs`: `firing_ids_depend_on_the_rule_and_the_event_only_and_sort_by_time`, `firing_ids_depend_on_the_rule_and_the_event_only_and_sort_by_tim` |

| fault | behaviour |
| --- | --- |
| a full disk | `Error::DiskFull`, not a citation |
";
    let got = citations(page).unwrap();
    let cited = |line, file: &str, test: Option<&str>| Citation {
        line,
        file: file.into(),
        test: test.map(Into::into),
    };
    assert_eq!(
        got,
        [
            cited(
                3,
                "tests/it/docs.rs",
                Some(
                    "the_citation_reader_finds_a_missing_test_a_missing_file_and_a_cell_it_cannot_read"
                )
            ),
            cited(3, "tests/it/docs.rs", Some("no_such_test")),
            cited(3, "tests/it/no_such_file.rs", None),
            cited(4, "tests/it/docs.rs", Some("root")),
            cited(
                4,
                "tests/it/docs.rs",
                Some("every_test_the_guarantees_page_cites_is_in_the_file_it_names")
            ),
            cited(4, "tests/it/main.rs", None),
            cited(
                4,
                "tests/it/log.rs",
                Some("concurrent_appenders_get_gap_free_seqs_in_commit_order")
            ),
            cited(
                5,
                "src/work/evaluate.rs",
                Some("firing_ids_depend_on_the_rule_and_the_event_only_and_sort_by_time")
            ),
            cited(
                5,
                "src/work/evaluate.rs",
                Some("firing_ids_depend_on_the_rule_and_the_event_only_and_sort_by_tim")
            ),
        ]
    );
    // A helper is no test, a name one letter short is none, and `main.rs`
    // declares modules but holds no test itself.
    assert_eq!(
        wrong_citations(&root(), &got),
        [
            "line 3: `tests/it/docs.rs` has no test `no_such_test`",
            "line 3: `tests/it/no_such_file.rs` does not exist",
            "line 4: `tests/it/docs.rs` has no test `root`",
            "line 4: `tests/it/main.rs` holds no test",
            "line 5: `src/work/evaluate.rs` has no test \
             `firing_ids_depend_on_the_rule_and_the_event_only_and_sort_by_tim`",
        ]
    );

    // A test written once for every backend is one with its macro line.
    let generic = "fn a<B: TestBackend>() {}\nfn b<B: TestBackend>() {}\n\
                   on_backends!(\n    a,\n);\nchildren_on_backends!(b);\n";
    assert!(has_test(generic, "a", false));
    assert!(!has_test(generic, "b", false), "a child side is no test");
    // In `src/`, only the `#[cfg(test)]` part holds tests.
    let src = "#[test]\nfn early() {}\n#[cfg(test)]\nmod tests {\n    #[test]\n    #[ignore]\n    fn late() {}\n}\n";
    assert!(has_test(src, "late", true));
    assert!(!has_test(src, "early", true));

    // What the reader does not understand fails, rather than being skipped.
    for cell in [
        "`tests/it/log.rs`: the appends are dense",
        "`tests/it/log.rs` `a_test`",
        "`tests/it/log.rs`: `A_Test`",
        "`a_test`",
        "`tests/it/log.rs`: `a_test` (unclosed",
        "see the log's tests",
    ] {
        let page = format!("| promise | proven by |\n| --- | --- |\n| x | {cell} |\n");
        assert!(citations(&page).is_err(), "{cell:?} was read");
    }
}

// ---------------------------------------------------------------------------
// README's example.

/// Whether a fence's info string opens a block rustdoc compiles as Rust:
/// none, `rust`, or rustdoc's attributes (`no_run`, `ignore`, …).
fn is_rustdoc_rust(info: &str) -> bool {
    info.split(',').map(str::trim).all(|a| {
        a.is_empty()
            || [
                "rust",
                "no_run",
                "ignore",
                "should_panic",
                "compile_fail",
                "test_harness",
                "standalone_crate",
            ]
            .contains(&a)
            || a.starts_with("edition")
            || a.starts_with("ignore-")
    })
}

/// The lines of the first fenced block of `text` whose info string
/// `wanted` accepts.
fn first_block(text: &str, wanted: impl Fn(&str) -> bool) -> Option<Vec<String>> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let block: Vec<String> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .map(|l| l.get(indent..).unwrap_or(l.trim_start()).to_string())
            .collect();
        if wanted(info.trim()) {
            return Some(block);
        }
    }
    None
}

/// The first `rust` block of a Markdown file.
fn markdown_example(markdown: &str) -> Option<Vec<String>> {
    first_block(markdown, |info| info.split(',').next() == Some("rust"))
}

/// The first Rust block of a file's crate docs (its `//!` lines), as
/// rustdoc shows it: without the hidden lines (`# …`, or `#` alone) and
/// with `##` unescaped to `#`.
fn crate_docs_example(source: &str) -> Option<Vec<String>> {
    let docs: String = source
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let block = first_block(&docs, is_rustdoc_rust)?;
    Some(
        block
            .into_iter()
            .filter_map(|l| {
                let t = l.trim_start();
                if t == "#" || t.starts_with("# ") {
                    None
                } else if t.starts_with("##") {
                    Some(l.replacen("##", "#", 1))
                } else {
                    Some(l)
                }
            })
            .collect(),
    )
}

/// A line diff of two blocks (`-` only in `a`, `+` only in `b`), empty
/// when they are equal.
fn diff(a: &[String], b: &[String]) -> Vec<String> {
    // The longest common subsequence, by dynamic programming.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(format!("-{:>3} {}", i + 1, a[i]));
            i += 1;
        } else {
            out.push(format!("+{:>3} {}", j + 1, b[j]));
            j += 1;
        }
    }
    out
}

#[test]
fn the_readmes_example_is_the_crate_docs_example() {
    let readme = markdown_example(&read("README.md")).expect("a ```rust block in README.md");
    let lib = crate_docs_example(&read("src/lib.rs")).expect("a Rust block in src/lib.rs's docs");
    let diff = diff(&readme, &lib);
    assert!(
        diff.is_empty(),
        "README.md's first ```rust block (-) is not src/lib.rs's crate docs' first \
         example (+), which rustdoc runs:\n{}",
        diff.join("\n")
    );
}

#[test]
fn the_example_reader_drops_hidden_lines_and_skips_other_blocks() {
    let readme =
        "# A crate\n\n```sh\ncargo add x\n```\n\n```rust\nuse x::Y;\nlet y = Y::new();\n```\n";
    let lib = "//! A crate.\n//!\n//! ```text\n//! not this\n//! ```\n//!\n//! ```no_run\n\
               //! # fn main() -> Result<(), x::Error> {\n//! use x::Y;\n//! #\n//! let y = Y::new();\n\
               //! # Ok(()) }\n//! ```\n\n#![warn(missing_docs)]\n//! ```\n//! later\n//! ```\n";
    let readme = markdown_example(readme).unwrap();
    assert_eq!(readme, ["use x::Y;", "let y = Y::new();"]);
    assert_eq!(crate_docs_example(lib).unwrap(), readme);
    assert!(diff(&readme, &readme).is_empty());

    let other = "//! ```\n//! use x::Y;\n//! let y = Y::default();\n//! ```\n";
    assert_eq!(
        diff(&readme, &crate_docs_example(other).unwrap()),
        ["-  2 let y = Y::new();", "+  2 let y = Y::default();"]
    );
    assert_eq!(crate_docs_example("//! No example.\n"), None);
}

// ---------------------------------------------------------------------------
// No history.

/// "issue", built from pieces so that this file does not name one.
fn issue_word() -> String {
    ["iss", "ue"].concat()
}

/// The history `text` holds, as "line: what": an issue's number
/// (`<issue>\s*#?\d`, in any case) and "in progress" said as a status — in
/// parentheses or brackets, a table's cell, after a colon or a dash, or
/// after "work", "still", "currently", "now" or "status" (a write under
/// way, said so in prose, is no status).
fn history(text: &str) -> Vec<String> {
    // ASCII only, so that offsets in `lower` are offsets in `text`.
    let lower = text.to_ascii_lowercase();
    let line_of = |at: usize| lower[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    let issue = issue_word();
    for (at, _) in lower.match_indices(&issue) {
        if lower[..at]
            .chars()
            .next_back()
            .is_some_and(char::is_alphabetic)
        {
            continue;
        }
        let rest = lower[at + issue.len()..].trim_start();
        let rest = rest.strip_prefix('#').unwrap_or(rest);
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            let end = text[at..].find('\n').map_or(text.len(), |n| at + n);
            out.push(format!("{}: {}", line_of(at), text[at..end].trim()));
        }
    }
    let progress = ["in", " progress"].concat();
    let words: Vec<(usize, &str)> = {
        // The words of the text with their offsets, so "in\nprogress" is
        // found too.
        let mut w = Vec::new();
        let mut start = None;
        for (i, c) in lower.char_indices() {
            match (c.is_alphanumeric(), start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    w.push((s, &lower[s..i]));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            w.push((s, &lower[s..]));
        }
        w
    };
    for (k, pair) in words.windows(2).enumerate() {
        let ((at, first), (next_at, second)) = (pair[0], pair[1]);
        if first != "in"
            || second != "progress"
            || !lower[at + 2..next_at].chars().all(char::is_whitespace)
        {
            continue;
        }
        let end = next_at + second.len();
        let decor = |c: char| c.is_whitespace() || "*_`\"'".contains(c);
        let before = lower[..at].trim_end_matches(decor).chars().next_back();
        let after = lower[end..].trim_start_matches(decor).chars().next();
        let word_before = k.checked_sub(1).map(|p| words[p].1);
        let status = matches!(
            before,
            None | Some('(' | '[' | ':' | '|' | '-' | '—' | '–' | '#' | '/')
        ) || matches!(after, Some(')' | ']' | '|'))
            || matches!(
                word_before,
                Some("work" | "still" | "currently" | "status" | "now")
            );
        if status {
            out.push(format!("{}: {}", line_of(at), progress));
        }
    }
    out
}

/// The files the check reads: those git knows (tracked, or new and not
/// ignored) under `src/`, `crates/`, `docs/`, `examples/` and `tests/`, and
/// the root's Markdown files and `Cargo.toml` — text only, lock files and
/// the changelog left out.
fn checked_files() -> Vec<String> {
    let root = root();
    let listed = std::process::Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success());
    let all: Vec<String> = match listed {
        Some(o) => String::from_utf8_lossy(&o.stdout)
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect(),
        // Not a git checkout: the tree, without what git would ignore.
        None => {
            fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
                for entry in std::fs::read_dir(dir).unwrap() {
                    let path = entry.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy();
                    if path.is_dir() {
                        if !["target", "node_modules", ".git"].contains(&name.as_ref()) {
                            walk(root, &path, out);
                        }
                    } else {
                        let rel = path.strip_prefix(root).unwrap();
                        out.push(rel.to_string_lossy().replace('\\', "/"));
                    }
                }
            }
            let mut out = Vec::new();
            walk(&root, &root, &mut out);
            out
        }
    };
    all.into_iter()
        .filter(|p| {
            let top = ["src/", "crates/", "docs/", "examples/", "tests/"];
            let at_root = !p.contains('/') && (p.ends_with(".md") || p == "Cargo.toml");
            (top.iter().any(|t| p.starts_with(t)) || at_root)
                && p != "CHANGELOG.md"
                && !p.ends_with(".lock")
                && !p.ends_with("package-lock.json")
                && !p.split('/').any(|s| s == "node_modules" || s == "target")
        })
        .collect()
}

#[test]
fn no_document_or_source_names_an_issue_or_a_status_of_work_under_way() {
    let root = root();
    let files = checked_files();
    assert!(
        files.iter().any(|f| f == "README.md") && files.iter().any(|f| f == "src/lib.rs"),
        "the files were listed: {files:?}"
    );
    let mut found = Vec::new();
    for file in &files {
        let Ok(bytes) = std::fs::read(root.join(file)) else {
            continue; // listed by git, deleted in the work tree
        };
        // Binary files (images, fixtures) are not prose.
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        if text.contains('\0') {
            continue;
        }
        found.extend(history(&text).into_iter().map(|h| format!("{file}:{h}")));
    }
    assert!(
        found.is_empty(),
        "history belongs in CHANGELOG.md:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_history_check_finds_issue_numbers_and_statuses_but_not_prose() {
    let issue = issue_word();
    let progress = ["in", " progress"].concat();
    let cap = |s: &str| {
        let mut c = s.chars();
        c.next()
            .unwrap()
            .to_uppercase()
            .chain(c)
            .collect::<String>()
    };
    let flagged = [
        format!("groups at a time ({issue} 19); the compiler"),
        format!("see {} #7.", cap(&issue)),
        format!("as {}#12 says", issue.to_uppercase()),
        format!("fixed by\n{issue}\n3"),
        format!("## Followers ({progress})"),
        format!("| the split | {progress} |"),
        format!("Status: **{progress}**"),
        format!("the guides are work {progress}"),
        format!("- {progress}: the console"),
    ];
    for text in &flagged {
        assert_eq!(history(text).len(), 1, "{text:?} was not found");
    }
    let clean = [
        format!("an {issue} the tracker knows, a known {issue}"),
        format!("{issue}s 2 and 3 are told apart; tissue 4"),
        format!("/// A write {progress}, handed to the closure"),
        format!("while a write is {progress} the reader"),
        "in the log, progress bars".to_string(),
    ];
    for text in &clean {
        assert!(history(text).is_empty(), "{text:?}: {:?}", history(text));
    }
    assert_eq!(
        history(&format!("one\ntwo ({issue} 4)\n")),
        [format!("2: {issue} 4)")]
    );
}
