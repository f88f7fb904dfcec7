//! The docs list what the code has, and only that: every config key the
//! node accepts is in docs/OPERATIONS.md's "Configuration keys" table and
//! every key there is accepted; every metric the node exports is in its
//! "Metrics and health" section and every metric in that section's table
//! is exported; every command of the dispatch table is in
//! docs/PROTOCOL.md, and every command its tables document is dispatched.
//! The lists come from the server crate itself, never from its source text.

use std::collections::BTreeSet;
use std::path::Path;

use strata_server::cmd::COMMANDS;
use strata_server::config;
use strata_server::metrics::Metrics;

fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text under `## heading`, up to the next `## ` heading.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("no \"## {heading}\" section"));
    let body = &text[start + heading.len() + 5..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// The first cell of each table row, the header and separator rows left
/// out.
fn first_cells(text: &str) -> Vec<&str> {
    tables(text)
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .collect()
}

/// Each table of `text`: the first cell of its header, and of its rows.
fn tables(text: &str) -> Vec<(&str, Vec<&str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let Some(cell) = line.strip_prefix("| ").and_then(|l| l.split(" |").next()) else {
            in_table = false;
            continue;
        };
        match out.last_mut() {
            Some((_, rows)) if in_table => {
                if !cell.starts_with("---") {
                    rows.push(cell);
                }
            }
            _ => out.push((cell, Vec::new())),
        }
        in_table = true;
    }
    out
}

/// The code spans (`...`) of `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Fails naming what each side lacks.
fn assert_same(what: &str, code: &BTreeSet<String>, docs: &BTreeSet<String>, where_: &str) {
    let undocumented: Vec<&String> = code.difference(docs).collect();
    let unknown: Vec<&String> = docs.difference(code).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "{what}: missing from {where_}: {undocumented:?}; in {where_} but not in the code: {unknown:?}"
    );
}

#[test]
fn config_keys_are_documented_and_accepted() {
    let code: BTreeSet<String> = config::keys().into_iter().collect();
    let text = doc("OPERATIONS.md");
    let table = section(&text, "Configuration keys");
    let docs: BTreeSet<String> = first_cells(table)
        .into_iter()
        .flat_map(code_spans)
        .map(String::from)
        .collect();
    assert_same(
        "config keys",
        &code,
        &docs,
        "docs/OPERATIONS.md \"Configuration keys\"",
    );
}

#[test]
fn metrics_are_documented_and_exported() {
    let names: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
    let code: BTreeSet<String> = Metrics::new(&names).names().into_iter().collect();
    assert!(!code.is_empty(), "the node exports no metrics");
    let text = doc("OPERATIONS.md");
    let body = section(&text, "Metrics and health");
    let mentioned = |name: &String| {
        body.match_indices(name.as_str()).any(|(i, _)| {
            let next = body[i + name.len()..].chars().next();
            !matches!(next, Some(c) if c.is_ascii_alphanumeric() || c == '_')
        })
    };
    // Documented: named anywhere in the section. Listed: in the metric
    // column of its table, which must hold nothing else.
    let documented: BTreeSet<String> = code.iter().filter(|n| mentioned(n)).cloned().collect();
    let listed: BTreeSet<String> = first_cells(body)
        .into_iter()
        .flat_map(code_spans)
        .filter(|s| s.starts_with("strata_"))
        .map(|s| s[..s.find('{').unwrap_or(s.len())].to_string())
        .collect();
    let docs: BTreeSet<String> = documented.union(&listed).cloned().collect();
    assert_same(
        "metrics",
        &code,
        &docs,
        "docs/OPERATIONS.md \"Metrics and health\"",
    );
}

#[test]
fn commands_are_documented_and_dispatched() {
    let code: BTreeSet<String> = COMMANDS.iter().map(|c| c.name.to_string()).collect();
    let text = doc("PROTOCOL.md");
    // A command is documented where a code span starts with its name.
    let spans: BTreeSet<&str> = code_spans(&text)
        .into_iter()
        .filter_map(|s| s.split_whitespace().next())
        .collect();
    let documented: BTreeSet<String> = code
        .iter()
        .filter(|c| spans.contains(c.as_str()))
        .cloned()
        .collect();
    // And every command a command table starts a row with exists.
    let tabled: BTreeSet<String> = tables(&text)
        .into_iter()
        .filter(|(header, _)| *header == "command")
        .flat_map(|(_, rows)| rows)
        .filter_map(|cell| code_spans(cell).first().copied())
        .filter_map(|span| span.split_whitespace().next())
        .map(String::from)
        .collect();
    let docs: BTreeSet<String> = documented.union(&tabled).cloned().collect();
    assert_same("commands", &code, &docs, "docs/PROTOCOL.md");
}
