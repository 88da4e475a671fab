//! The command list of docs/guide/operating.md is the binary's: every
//! subcommand `reflexr --help` lists — and every subcommand of those
//! (`runs steps`), written with its parent — has its line there and every
//! line's command exists; each command's options (`reflexr <DB> <command> --help`)
//! are in its line — by their long or short name — and every option a line
//! names exists; an option a line writes outside brackets is one the
//! command requires, and the other way round. The options every command
//! takes — clap's `--help`, the global `--json`, and the audit record's
//! `--operator` and `--reason` of every command that changes something —
//! are documented once, in the prose beside the list, which must name
//! them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

/// The options the page documents in prose rather than on each line.
const SHARED: &[&str] = &["--json", "--operator", "--reason"];

/// The commands only a feature builds, with whether this build has it.
const GATED: &[(&str, bool)] = &[
    ("serve", cfg!(feature = "admin")),
    ("mcp", cfg!(feature = "mcp")),
];

fn page() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/guide/operating.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_reflexr"))
        .args(args)
        .output()
        .expect("run reflexr");
    assert!(
        out.status.success(),
        "reflexr {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// An option: its short name (`-w`), if it has one, and its long name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Opt {
    short: Option<String>,
    long: String,
}

/// What a help text says: the lines of one of its sections ("Commands:",
/// "Options:"), its entries' first words, and its usage line.
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // An entry is indented 2 (6 for a long-only option); what wraps is
        // indented further.
        .filter(|l| l.len() - l.trim_start().len() <= 6)
        .collect()
}

/// The subcommands of `reflexr --help`, clap's `help` left out.
fn commands(help: &str) -> BTreeSet<String> {
    section(help, "Commands:")
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// Every command of the binary: those of `reflexr --help`, and each one's
/// own subcommands with their parent's name (`runs steps`).
fn all_commands() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for c in commands(&help(&["--help"])) {
        for sub in commands(&help_of(&c)) {
            all.insert(format!("{c} {sub}"));
        }
        all.insert(c);
    }
    all
}

/// The help of a command (`runs steps`: a subcommand and its parent).
fn help_of(command: &str) -> String {
    let mut args = vec!["app.db"];
    args.extend(command.split(' '));
    args.push("--help");
    help(&args)
}

/// The options of a command's help: `-w, --workspace <WORKSPACE>` →
/// (`-w`, `--workspace`).
fn options(help: &str) -> Vec<Opt> {
    section(help, "Options:")
        .iter()
        .map(|l| {
            let names: Vec<&str> = l
                .split_whitespace()
                .map(|w| w.trim_end_matches(','))
                .take_while(|w| w.starts_with('-'))
                .collect();
            let long = names
                .iter()
                .find(|n| n.starts_with("--"))
                .unwrap_or_else(|| panic!("an option without a long name: {l:?}"));
            Opt {
                short: names
                    .iter()
                    .find(|n| !n.starts_with("--"))
                    .map(|s| s.to_string()),
                long: long.to_string(),
            }
        })
        .collect()
}

/// The long options a command's usage line requires: `Usage: reflexr <DB>
/// events [OPTIONS] --workspace <WORKSPACE>` → `--workspace`.
fn required(help: &str) -> BTreeSet<String> {
    let usage = help
        .lines()
        .find_map(|l| l.strip_prefix("Usage: "))
        .expect("a usage line");
    let mut depth = 0i32;
    let mut out = BTreeSet::new();
    for word in usage.split_whitespace() {
        if depth == 0 && word.starts_with("--") {
            out.insert(word.to_string());
        }
        depth += word.matches('[').count() as i32 - word.matches(']').count() as i32;
    }
    out
}

/// One line of the documented list: `reflexr <DB> pause|resume KIND NAME
/// description` → its commands, the word after them when it may name a
/// subcommand (`runs steps RUN_ID`: a plain lowercase word), the options it
/// names (each with whether it is written outside brackets) and whether it
/// offers alternatives (`retry RUN_ID | retry --dead-letter ID`).
#[derive(Debug, PartialEq, Eq)]
struct Documented {
    line: String,
    commands: Vec<String>,
    sub: Option<String>,
    options: BTreeMap<String, bool>,
    alternatives: bool,
}

/// The lines of the page's first ```text block of `reflexr <DB>` lines:
/// the synopsis is the line up to its description, set off by two spaces.
fn documented(page: &str) -> Vec<Documented> {
    let mut lines = page.lines();
    let block: Vec<&str> = loop {
        let Some(line) = lines.next() else {
            panic!("no ```text block of `reflexr <DB> …` lines");
        };
        if line.trim() != "```text" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        if !block.is_empty() && block.iter().all(|l| l.starts_with("reflexr <DB> ")) {
            break block;
        }
    };
    block
        .iter()
        .map(|line| {
            let rest = line.strip_prefix("reflexr <DB> ").unwrap();
            let synopsis = rest.split("  ").next().unwrap().trim();
            let mut words = synopsis.split_whitespace();
            let first = words.next().expect("a command");
            let commands: Vec<String> = first.split('|').map(String::from).collect();
            let sub = words
                .next()
                .filter(|w| {
                    w.starts_with(|c: char| c.is_ascii_lowercase())
                        && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                })
                .map(String::from);
            let mut options = BTreeMap::new();
            let mut alternatives = false;
            let mut depth = 0i32;
            for word in synopsis.split_whitespace().skip(1) {
                if word == "|" && depth == 0 {
                    alternatives = true;
                }
                let name = word.trim_start_matches('[');
                let name = name
                    .split(|c: char| "[]|.".contains(c))
                    .next()
                    .unwrap_or("");
                if name.starts_with('-') {
                    let outside = depth == 0 && !word.starts_with('[');
                    options.insert(name.to_string(), outside);
                }
                depth += word.matches('[').count() as i32 - word.matches(']').count() as i32;
            }
            Documented {
                line: line.to_string(),
                commands,
                sub,
                options,
                alternatives,
            }
        })
        .collect()
}

/// What is wrong between the documented list and what clap says of each
/// command (`None`: the binary has no such command).
fn mismatches(
    documented: &[Documented],
    known: &BTreeSet<String>,
    help_of: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for d in documented {
        for c in &d.commands {
            // `runs steps …` is the subcommand's line, when the binary has it.
            let nested = d.sub.as_ref().map(|s| format!("{c} {s}"));
            let c = match nested {
                Some(n) if known.contains(&n) => n,
                _ => c.clone(),
            };
            let c = &c;
            if !seen.insert(c.clone()) {
                wrong.push(format!("`{c}` has two lines"));
            }
            if !known.contains(c) {
                let gated_off = GATED.iter().any(|(g, on)| g == c && !on);
                if !gated_off {
                    wrong.push(format!(
                        "`{c}` is documented but the binary has no such command"
                    ));
                }
                continue;
            }
            let help = help_of(c);
            let opts = options(&help);
            let required = required(&help);
            for o in &opts {
                if o.long == "--help" || o.long == "--version" || SHARED.contains(&o.long.as_str())
                {
                    continue;
                }
                let by_short = o.short.as_ref().and_then(|s| d.options.get(s));
                let Some(&outside) = d.options.get(&o.long).or(by_short) else {
                    wrong.push(format!(
                        "`{c}`'s option {} is not in its line: {}",
                        o.long, d.line
                    ));
                    continue;
                };
                let needed = required.contains(&o.long);
                if !d.alternatives && outside != needed {
                    wrong.push(format!(
                        "`{c}`'s option {} is {}, but its line writes it {}brackets: {}",
                        o.long,
                        if needed { "required" } else { "optional" },
                        if outside { "outside " } else { "in " },
                        d.line
                    ));
                }
            }
            for name in d.options.keys() {
                let exists = opts
                    .iter()
                    .any(|o| o.long == *name || o.short.as_deref() == Some(name.as_str()));
                if !exists {
                    wrong.push(format!("`{c}` has no option {name}: {}", d.line));
                }
            }
        }
    }
    for c in known {
        if !seen.contains(c) {
            wrong.push(format!("`{c}` is a command but has no line in the list"));
        }
    }
    wrong
}

#[test]
fn every_command_and_option_the_binary_has_is_in_the_documented_list_and_no_other() {
    let page = page();
    let documented = documented(&page);
    let known = all_commands();
    assert!(
        known.len() > 15 && known.contains("status") && known.contains("runs steps"),
        "{known:?}"
    );
    let wrong = mismatches(&documented, &known, help_of);
    assert!(
        wrong.is_empty(),
        "docs/guide/operating.md's command list:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_options_every_command_takes_are_named_in_the_prose_and_json_is_global() {
    let page = page();
    for o in SHARED {
        assert!(
            page.contains(&format!("`{o}`")),
            "docs/guide/operating.md does not name `{o}`"
        );
    }
    for c in all_commands() {
        let help = help_of(&c);
        assert!(
            options(&help).iter().any(|o| o.long == "--json"),
            "`{c}` does not take --json"
        );
        // An audited command takes both halves of the audit record.
        let audit: Vec<bool> = ["--operator", "--reason"]
            .iter()
            .map(|a| options(&help).iter().any(|o| o.long == *a))
            .collect();
        assert!(
            audit[0] || !audit[1],
            "`{c}` takes --reason without --operator"
        );
    }
}

#[test]
fn the_list_reader_reads_commands_options_brackets_and_alternatives() {
    let page = "\
Prose.

```text
not the list
```

```text
reflexr <DB> events -w WS [--after SEQ] [-t TYPE]... [--limit N]
reflexr <DB> retry RUN_ID | retry --dead-letter ID                  a dead run gets a fresh set of attempts
reflexr <DB> pause|resume action|channel NAME     audited, like --not-an-option
reflexr <DB> enqueue ACTION [--unique KEY [--unique-while pending|active|1h]]
reflexr <DB> runs reset RUN_ID --step NAME [--yes]   asks first
```
";
    let got = documented(page);
    let opts = |pairs: &[(&str, bool)]| -> BTreeMap<String, bool> {
        pairs.iter().map(|(n, o)| (n.to_string(), *o)).collect()
    };
    assert_eq!(got.len(), 5);
    assert_eq!(got[0].commands, ["events"]);
    assert_eq!(
        got[0].options,
        opts(&[
            ("-w", true),
            ("--after", false),
            ("-t", false),
            ("--limit", false)
        ])
    );
    assert!(!got[0].alternatives);
    assert_eq!(got[1].commands, ["retry"]);
    assert_eq!(got[1].options, opts(&[("--dead-letter", true)]));
    assert!(got[1].alternatives);
    assert_eq!(got[2].commands, ["pause", "resume"]);
    assert!(got[2].options.is_empty(), "{:?}", got[2].options);
    assert_eq!(
        got[3].options,
        opts(&[("--unique", false), ("--unique-while", false)])
    );
    let subs: Vec<Option<&str>> = got.iter().map(|d| d.sub.as_deref()).collect();
    assert_eq!(subs, [None, None, None, None, Some("reset")]);
    assert_eq!(got[4].commands, ["runs"]);
    assert_eq!(got[4].options, opts(&[("--step", true), ("--yes", false)]));

    // Against a help text: an option missing from the line, one the line
    // invents, a required one in brackets, a command with no line and a
    // line with no command are each told.
    let events_help = "\
A workspace's events after a seq

Usage: reflexr <DB> events [OPTIONS] --workspace <WORKSPACE>

Options:
  -w, --workspace <WORKSPACE>  The workspace
      --after <AFTER>          Only events after this seq
                               [default: 0]
      --json                   Print JSON instead of tables
  -h, --help                   Print help
";
    let lines = documented(
        "```text\nreflexr <DB> events [-w WS] [--before SEQ]\nreflexr <DB> nothing\n```\n",
    );
    let known: BTreeSet<String> = ["events", "status"].map(String::from).into();
    let wrong = mismatches(&lines, &known, |_| events_help.to_string());
    assert_eq!(
        wrong,
        [
            "`events`'s option --workspace is required, but its line writes it in brackets: \
             reflexr <DB> events [-w WS] [--before SEQ]",
            "`events`'s option --after is not in its line: reflexr <DB> events [-w WS] [--before SEQ]",
            "`events` has no option --before: reflexr <DB> events [-w WS] [--before SEQ]",
            "`nothing` is documented but the binary has no such command",
            "`status` is a command but has no line in the list",
        ]
    );
    assert_eq!(
        options(events_help),
        [
            Opt {
                short: Some("-w".into()),
                long: "--workspace".into()
            },
            Opt {
                short: None,
                long: "--after".into()
            },
            Opt {
                short: None,
                long: "--json".into()
            },
            Opt {
                short: Some("-h".into()),
                long: "--help".into()
            },
        ]
    );
}
