//! pgbench on the inbox's own SQL: the scripts (one message, a batch, its savepoint pass) and the run.

use txinbox_lab::lab::LabError;

use crate::fixture::BUSINESS_INSERT;
use crate::rate::{cpu_per_op, cpu_ticks, Rate};
use crate::BenchArgs;

#[cfg(test)]
mod tests;

/// The pgbench script: one message per transaction (`batch` 0), or `batch` messages per transaction as
/// [`txinbox_core::Inbox::process_batch`] sends them when every handler succeeds (the store's one statement
/// for all the markers, then each message's business insert), or with `savepoints` as its savepoint pass
/// sends them (per message a savepoint, the marker insert and the business insert).
pub(super) fn pgbench_script(
    dir: &std::path::Path,
    batch: usize,
    savepoints: bool,
) -> Result<std::path::PathBuf, LabError> {
    let mut script = String::from("\\set n random(1, 9000000000000000000)\nBEGIN;\n");
    if batch == 0 {
        let (marker, business) = pgbench_statements("");
        script.push_str(&format!("{marker};\n{business};\n"));
    } else if !savepoints {
        script.push_str(&format!("{};\n", pgbench_batch_markers(batch)));
    }
    for k in 0..batch {
        let (marker, business) = pgbench_statements(&format!("-{k}"));
        if savepoints {
            script.push_str(&format!(
                "{};\n{marker};\n",
                txinbox_store::postgres::savepoint_sql()
            ));
        }
        script.push_str(&format!("{business};\n"));
    }
    script.push_str("COMMIT;\n");
    let path = dir.join(format!(
        "txinbox-bench-{}.sql",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, script)
        .map_err(|e| LabError::Usage(format!("cannot write the pgbench script: {e}")))?;
    Ok(path)
}

/// The store's batch marker insert of `batch` messages (ids ending in `-0` .. `-{batch-1}`), with the arrays
/// written out as the values the inbox binds.
fn pgbench_batch_markers(batch: usize) -> String {
    let array = |value: &dyn Fn(usize) -> String| -> String {
        let items: Vec<String> = (0..batch).map(value).collect();
        format!("ARRAY[{}]", items.join(", "))
    };
    let same = |v: &'static str| move |_: usize| v.to_owned();
    let columns: [(&str, String); 13] = [
        ("$1::", array(&same("'bench'"))),
        ("$2::", array(&same("'urn.bench'"))),
        ("$3::", array(&|k| pgbench_id(&format!("-{k}")))),
        ("$4::", array(&same("'bench.event'"))),
        ("$5::", array(&same("NULL"))),
        (
            "$6::",
            array(&same(
                "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'",
            )),
        ),
        ("$7::", array(&same("NULL"))),
        ("$8::", array(&same("NULL"))),
        ("$9::", array(&same("now()"))),
        ("$10::", array(&same("now()"))),
        ("$11::", array(&same("now() + interval '30 days'"))),
        ("$12::", array(&same("'cloudevents_attributes'"))),
        ("$13::", array(&same("1"))),
    ];
    let mut sql = txinbox_store::postgres::insert_markers_sql().to_owned();
    for (param, value) in columns {
        sql = sql.replace(param, &format!("{value}::"));
    }
    sql
}

/// A bench message id in pgbench, ending in `suffix`.
fn pgbench_id(suffix: &str) -> String {
    format!("'pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text) || '{suffix}'")
}

/// The marker insert and the business insert of one message, ids ending in `suffix`.
fn pgbench_statements(suffix: &str) -> (String, String) {
    let id = pgbench_id(suffix);
    // Exactly the statements the inbox sends on the apply path, with values of the same shape.
    let marker = txinbox_store::postgres::insert_marker_sql()
        .replace("$10", "now()")
        .replace("$11", "now() + interval '30 days'")
        .replace("$12", "'cloudevents_attributes'")
        .replace("$13", "1")
        .replace("$1,", "'bench',")
        .replace("$2,", "'urn.bench',")
        .replace("$3,", &format!("{id},"))
        .replace("$4,", "'bench.event',")
        .replace("$5,", "NULL,")
        .replace(
            "$6,",
            "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',",
        )
        .replace("$7,", "NULL,")
        .replace("$8,", "NULL,")
        .replace("$9,", "now(),");
    let business = BUSINESS_INSERT
        .replace(
            "$1",
            &format!("'t-' || CAST(:client_id AS text) || '-' || CAST(:n AS text) || '{suffix}'"),
        )
        .replace("$2", &id);
    (marker, business)
}

pub(crate) fn run_pgbench(
    args: &BenchArgs,
    url: &str,
    script: &std::path::Path,
    c: usize,
) -> Result<Rate, LabError> {
    let cpu_before = cpu_ticks().map(|c| c.1);
    let jobs = c.clamp(1, 2);
    let out = std::process::Command::new(&args.pgbench)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &c.to_string(),
            "-j",
            &jobs.to_string(),
        ])
        .args(["-T", &args.seconds.to_string(), "-f"])
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| {
            LabError::Usage(format!(
                "cannot run {}: {e} (it ships with PostgreSQL)",
                args.pgbench
            ))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(LabError::Usage(format!(
            "pgbench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| l.contains("error"))
                .collect::<Vec<_>>()
                .join(" | ")
        )));
    }
    let field = |prefix: &str| -> Option<f64> {
        stdout.lines().find_map(|l| {
            l.trim()
                .strip_prefix(prefix)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
    };
    let per_sec =
        field("tps = ").ok_or_else(|| LabError::Usage("pgbench printed no tps line".into()))?;
    let ops = field("number of transactions actually processed: ").unwrap_or(0.0);
    Ok(Rate {
        per_sec,
        cpu_us: cpu_per_op(cpu_before, cpu_ticks().map(|c| c.1), ops),
    })
}
