//! How `txinbox inbox` prints: one JSON document, or human tables and fields.

use chrono::{DateTime, SecondsFormat, Utc};

use txinbox_core::store::ops::{ConsumerStats, EffectView, MarkerView, MessageStory, RejectionRow};

use crate::out::outln;

pub(super) fn print_json(v: &serde_json::Value) -> Result<(), String> {
    let s = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    outln!("{s}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// Human output.

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn exact_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// `12.3s`, `4m05s`, `3h02m`, `2d03h`.
fn age(secs: f64) -> String {
    let s = secs.max(0.0);
    let whole = s as u64;
    match whole {
        0..=59 => format!("{s:.1}s"),
        60..=3599 => format!("{}m{:02}s", whole / 60, whole % 60),
        3600..=86_399 => format!("{}h{:02}m", whole / 3600, whole % 3600 / 60),
        _ => format!("{}d{:02}h", whole / 86_400, whole % 86_400 / 3600),
    }
}

/// Prints aligned columns: numbers (columns whose header is in `right`) right-aligned; cells [escaped](crate::out::escaped).
fn print_table(headers: &[&str], right: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::out::escaped(c).into_owned())
                .collect()
        })
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            if right.contains(&headers[i]) {
                out.push_str(&format!("{c:>w$}"));
            } else {
                out.push_str(&format!("{c:<w$}"));
            }
        }
        outln!("{}", out.trim_end());
    };
    line(&mut headers.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
}

pub(super) fn print_stats(stats: &[ConsumerStats]) {
    let headers = [
        "consumer",
        "rows",
        "last_hour",
        "oldest_processed_at",
        "newest_processed_at",
        "payload_collision",
        "business_duplicate",
        "effect_lag",
        "effects",
    ];
    let right = [
        "rows",
        "last_hour",
        "payload_collision",
        "business_duplicate",
        "effect_lag",
    ];
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            let effects: Vec<String> = s
                .effects
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(state, n)| format!("{state}={n}"))
                .collect();
            vec![
                s.consumer.clone(),
                s.inbox_rows.to_string(),
                s.rows_last_hour.to_string(),
                opt(s.oldest_processed_at, time),
                opt(s.newest_processed_at, time),
                s.rejections
                    .get("payload_collision")
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
                s.rejections
                    .get("business_duplicate")
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
                opt(s.effect_lag_seconds, age),
                if effects.is_empty() {
                    "-".into()
                } else {
                    effects.join(" ")
                },
            ]
        })
        .collect();
    print_table(&headers, &right, &rows);
}

fn print_fields(indent: &str, fields: &[(&str, String)]) {
    let w = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in fields {
        outln!("{indent}{k:<w$}  {}", crate::out::escaped(v));
    }
}

fn marker_fields(m: &MarkerView) -> Vec<(&'static str, String)> {
    vec![
        ("consumer_name", m.consumer.clone()),
        ("source", m.source.clone()),
        ("message_id", m.message_id.clone()),
        ("event_type", opt(m.event_type.clone(), |s| s)),
        ("business_key", opt(m.business_key.clone(), |s| s)),
        ("payload_hash", m.payload_hash.clone()),
        ("contract_version", opt(m.contract_version.clone(), |s| s)),
        ("tenant_id", opt(m.tenant_id.clone(), |s| s)),
        ("received_at", exact_time(m.received_at)),
        ("processed_at", exact_time(m.processed_at)),
        ("result_reference", opt(m.result_reference.clone(), |s| s)),
        ("retention_until", exact_time(m.retention_until)),
        ("id_origin", m.id_origin.clone()),
        ("delivery_count", m.delivery_count.to_string()),
    ]
}

fn rejection_fields(r: &RejectionRow) -> Vec<(&'static str, String)> {
    vec![
        ("id", r.id.to_string()),
        ("kind", r.kind.clone()),
        ("recorded_at", exact_time(r.recorded_at)),
        ("source", r.source.clone()),
        ("business_key", opt(r.business_key.clone(), |s| s)),
        ("payload_hash", r.payload_hash.clone()),
        ("conflicts_with", r.conflicts_with.clone()),
        ("detail", r.detail.clone()),
    ]
}

fn effect_fields(e: &EffectView) -> Vec<(&'static str, String)> {
    vec![
        ("id", e.id.to_string()),
        ("key", e.key.clone()),
        ("name", e.name.clone()),
        ("destination", e.destination.clone()),
        ("state", e.state.clone()),
        ("attempts", e.attempts.to_string()),
        ("reconciliations", e.reconciliations.to_string()),
        ("reference", opt(e.reference.clone(), |s| s)),
        ("last_error", opt(e.last_error.clone(), |s| s)),
        ("external_ref", e.external_ref.clone()),
        ("group_key", opt(e.group_key.clone(), |s| s)),
        ("created_at", exact_time(e.created_at)),
        ("updated_at", exact_time(e.updated_at)),
        ("next_attempt_at", exact_time(e.next_attempt_at)),
        ("claimed_by", opt(e.claimed_by.clone(), |s| s)),
        ("claim_until", opt(e.claim_until, exact_time)),
        ("finished_at", opt(e.finished_at, exact_time)),
    ]
}

pub(super) fn print_story(s: &MessageStory) {
    outln!(
        "message {} of consumer {} ({})",
        crate::out::escaped(&s.message_id),
        crate::out::escaped(&s.consumer),
        s.source
            .as_deref()
            .map_or("any source".to_owned(), |src| format!(
                "source {}",
                crate::out::escaped(src)
            ))
    );
    if !s.found() {
        outln!("not found: no marker, rejection or effect");
        return;
    }
    if s.markers.is_empty() {
        outln!("\nmarker: none (not applied, or purged after its retention)");
    }
    for m in &s.markers {
        outln!("\nmarker");
        print_fields("  ", &marker_fields(m));
    }
    outln!("\nrejections: {}", s.rejections.len());
    for (i, r) in s.rejections.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        print_fields("  ", &rejection_fields(r));
    }
    outln!("\neffects: {}", s.effects.len());
    for (i, e) in s.effects.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        print_fields("  ", &effect_fields(e));
    }
}

pub(super) fn print_rejections(rows: &[RejectionRow]) {
    let headers = [
        "recorded_at",
        "consumer",
        "kind",
        "source",
        "message_id",
        "business_key",
        "conflicts_with",
        "detail",
    ];
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                time(r.recorded_at),
                r.consumer.clone(),
                r.kind.clone(),
                r.source.clone(),
                r.message_id.clone(),
                opt(r.business_key.clone(), |s| s),
                r.conflicts_with.clone(),
                r.detail.clone(),
            ]
        })
        .collect();
    print_table(&headers, &[], &rows);
}
