//! The operations files (`ops/dashboard.json`, `ops/alerts.yml`, `ops/alerts_test.yml`) use only metric names
//! and labels the code emits, and every alert has its labels, annotations and a runbook section in
//! `docs/operations.md`.

use std::collections::BTreeSet;

const DASHBOARD: &str = include_str!("../../../ops/dashboard.json");
const ALERTS: &str = include_str!("../../../ops/alerts.yml");
const ALERTS_TEST: &str = include_str!("../../../ops/alerts_test.yml");
const OPERATIONS: &str = include_str!("../../../docs/operations.md");

/// Where the metric names are defined: the core's `metrics` module and the adapters' `metrics` modules.
const NAME_SOURCES: [&str; 3] = [
    include_str!("../src/metrics.rs"),
    include_str!("../../txinbox-sqs/src/lib.rs"),
    include_str!("../../txinbox-servicebus/src/lib.rs"),
];

/// Where the labels are attached: every source file of the core (the `metrics::counter!`/`gauge!`/`histogram!`
/// call sites are spread over its subsystems), read when the test runs so that a new file is never missed.
fn label_sources() -> Vec<String> {
    fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("the core's src directory is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&path).expect("a source file is readable"));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut out,
    );
    assert!(out.len() > 20, "the core's sources were not found");
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
}

/// Every `txinbox_[a-z_]+` token of `text` (not preceded by a name character).
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("txinbox_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail.find(|c: char| !is_name_char(c)).unwrap_or(tail.len());
        if !before.is_some_and(|c| is_name_char(c) || c == '/' || c == '.' || c == '-') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// The metric names defined as string constants: `pub const X: &str = "txinbox_...";`.
fn defined_names() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for src in NAME_SOURCES {
        for line in src.lines() {
            let line = line.trim();
            if !(line.starts_with("pub const ") && line.contains(": &str = \"txinbox_")) {
                continue;
            }
            let value = line.split('"').nth(1).expect("a quoted name");
            out.insert(value.to_owned());
        }
    }
    out
}

/// The name a series belongs to: a histogram's `_bucket`, `_sum` and `_count` series map to the histogram.
fn family<'a>(series: &'a str, defined: &BTreeSet<String>) -> &'a str {
    if defined.contains(series) {
        return series;
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix) {
            if defined.contains(base) {
                return base;
            }
        }
    }
    series
}

#[test]
fn the_sources_define_the_metric_names() {
    let defined = defined_names();
    assert!(defined.contains("txinbox_received_total"), "{defined:?}");
    assert!(defined.contains("txinbox_receive_to_commit_seconds"));
    assert!(defined.contains("txinbox_effects"));
    assert!(defined.len() >= 25, "too few names parsed: {defined:?}");
    assert_eq!(
        txinbox_core::metrics::RECEIVE_TO_COMMIT,
        "txinbox_receive_to_commit_seconds"
    );
}

#[test]
fn every_metric_in_the_ops_files_exists_in_the_source() {
    let defined = defined_names();
    for (file, text) in [
        ("ops/dashboard.json", DASHBOARD),
        ("ops/alerts.yml", ALERTS),
        ("ops/alerts_test.yml", ALERTS_TEST),
    ] {
        let used = metric_tokens(text);
        assert!(
            used.len() >= 5,
            "{file}: too few metric names found: {used:?}"
        );
        let unknown: Vec<_> = used
            .iter()
            .filter(|s| !defined.contains(family(s, &defined)))
            .collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metric names no source defines: {unknown:?}"
        );
    }
}

/// Label names in `by (...)` clauses and `{label=...}` selectors of the ops files.
fn label_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let text = text.replace("\\\"", "\"");
    for (i, _) in text.match_indices("by (") {
        let inner = &text[i + 4..];
        let inner = &inner[..inner.find(')').unwrap_or(0)];
        out.extend(inner.split(',').map(|l| l.trim().to_owned()));
    }
    for (i, _) in text.match_indices('{') {
        let before = text[..i].chars().next_back();
        if !before.is_some_and(is_name_char) {
            continue;
        }
        let inner = &text[i + 1..];
        let Some(end) = inner.find('}') else { continue };
        for m in inner[..end].split(',') {
            if let Some(j) = m.find(['=', '!']) {
                out.insert(m[..j].trim().to_owned());
            }
        }
    }
    out.retain(|l| !l.is_empty());
    out
}

#[test]
fn every_label_in_the_ops_files_is_attached_by_the_code() {
    let sources = label_sources();
    for (file, text) in [
        ("ops/dashboard.json", DASHBOARD),
        ("ops/alerts.yml", ALERTS),
    ] {
        let labels = label_names(text);
        assert!(labels.contains("consumer"), "{file}: {labels:?}");
        for label in &labels {
            // `le` is the histogram's bucket label, added by the exporter.
            let quoted = format!("\"{label}\"");
            assert!(
                label == "le" || sources.iter().any(|s| s.contains(&quoted)),
                "{file}: label `{label}` is attached by no metrics call site"
            );
        }
    }
}

/// The alert blocks of `ops/alerts.yml`: (name, block text).
fn alerts() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in ALERTS.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            out.push((name.trim().to_owned(), String::new()));
        } else if let Some((_, block)) = out.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    out
}

#[test]
fn every_alert_has_its_labels_annotations_tests_and_runbook() {
    let alerts = alerts();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for (name, block) in &alerts {
        for key in [
            "severity: ",
            "owner: ",
            "summary: ",
            "probable_cause: ",
            "consequence: ",
            "runbook: ",
        ] {
            assert!(block.contains(key), "{name}: no `{key}`");
        }
        assert!(
            block.contains("by (consumer"),
            "{name}: the alert must keep the series' consumer label"
        );
        let anchor = name.to_lowercase();
        assert!(
            block.contains(&format!("docs/operations.md#{anchor}")),
            "{name}: runbook must link docs/operations.md#{anchor}"
        );
        assert!(
            OPERATIONS
                .lines()
                .any(|l| l.starts_with('#') && l.trim_start_matches('#').trim() == name),
            "{name}: docs/operations.md has no `### {name}` section (anchor #{anchor})"
        );
        // promtool cases: at least one where the alert fires and one where it stays silent.
        let evals: Vec<&str> = ALERTS_TEST
            .split("- eval_time:")
            .skip(1)
            .filter(|e| e.contains(&format!("alertname: {name}\n")))
            .collect();
        assert!(
            evals.iter().any(|e| e.contains("exp_labels:")),
            "{name}: no promtool case where it fires"
        );
        assert!(
            evals.iter().any(|e| e.contains("exp_alerts: []")),
            "{name}: no promtool case where it stays silent"
        );
    }
    for required in [
        "txinbox_duplicates_total",
        "txinbox_payload_collisions_total",
        "txinbox_effects{state=\"uncertain\"}",
        "txinbox_effects{state=\"needs_attention\"}",
        "txinbox_retention_expired_total",
        "txinbox_inbox_rows",
        "txinbox_retention_purged_total",
        "txinbox_identity_broker_fallback_total",
        "txinbox_lease_lost_total",
        "txinbox_dead_letters_total",
        "txinbox_contract_version_failures_total",
        "txinbox_unknown_identity_total",
    ] {
        assert!(ALERTS.contains(required), "no alert uses {required}");
    }
}

#[test]
fn the_dashboard_has_its_variables_and_panels() {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard.json is JSON");
    assert_eq!(d["schemaVersion"], 39);
    let vars = d["templating"]["list"].as_array().expect("variables");
    assert!(vars
        .iter()
        .any(|v| v["name"] == "datasource" && v["query"] == "prometheus"));
    assert!(vars.iter().any(|v| v["name"] == "consumer"
        && v["definition"] == "label_values(txinbox_received_total, consumer)"));
    let exprs: Vec<&str> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(exprs.len() >= 20, "{exprs:?}");
    for e in &exprs {
        assert!(
            e.contains("consumer=~\"$consumer\""),
            "not filtered by $consumer: {e}"
        );
    }
    // A histogram is only queried through its _bucket/_sum/_count series.
    assert!(
        !exprs
            .iter()
            .any(|e| e.contains("txinbox_receive_to_commit_seconds{")),
        "{exprs:?}"
    );
    for needle in [
        "histogram_quantile(0.5,",
        "histogram_quantile(0.95,",
        "txinbox_receive_to_commit_seconds_bucket",
    ] {
        assert!(exprs.iter().any(|e| e.contains(needle)), "no {needle}");
    }
}
