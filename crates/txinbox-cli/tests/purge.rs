//! `txinbox inbox purge`: bounded batches until nothing expired is left; killed with SIGKILL mid-run it
//! resumes on the next pass and never removes a row that was not expired.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use txinbox_store::Store;

const EXPIRED: i64 = 200_000;
const LIVE: i64 = 5_000;

async fn counts(store: &Store<sqlx::Postgres>) -> (i64, i64) {
    sqlx::query_as("SELECT count(*) FILTER (WHERE consumer_name = 'old'), count(*) FILTER (WHERE consumer_name = 'live') FROM txinbox_inbox")
        .fetch_one(store.pool())
        .await
        .expect("count markers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_killed_mid_run_resumes_and_removes_only_expired_rows() {
    let base = txinbox_testkit::pg_url();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 2)
        .await
        .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
    for (consumer, n, until) in [
        ("old", EXPIRED, "now() - interval '1 day'"),
        ("live", LIVE, "now() + interval '30 days'"),
    ] {
        sqlx::query(&format!("INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin) SELECT '{consumer}', '', 'm-' || g, 'h', now(), now(), {until}, 'producer_id' FROM generate_series(1, $1) g"))
            .bind(n)
            .execute(store.pool())
            .await
            .expect("load markers");
    }

    let mut first = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args([
            "inbox",
            "purge",
            "--store",
            &url,
            "--batch",
            "500",
            "--pause-ms",
            "20",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start txinbox inbox purge");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (old, _) = counts(&store).await;
        if old < EXPIRED - 5_000 {
            break;
        }
        assert!(Instant::now() < deadline, "the purge made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().expect("SIGKILL the purge");
    let _ = first.wait();
    // A DELETE the dead process had sent may still finish on the server: wait until the counts stop moving.
    let mut last = counts(&store).await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = counts(&store).await;
        if now == last {
            break;
        }
        assert!(Instant::now() < deadline, "the counts never settled");
        last = now;
    }
    let (old, live) = last;
    assert_eq!(live, LIVE, "nothing unexpired removed");
    assert!(old > 0, "killed before the end ({old} expired rows left)");

    let out = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args(["inbox", "purge", "--store", &url, "--json"])
        .output()
        .expect("run txinbox inbox purge");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(
        report["markers"],
        serde_json::json!(old),
        "the second pass removed what was left: {report}"
    );
    assert!(
        report["batches"].as_u64().unwrap_or(0) > 1,
        "several batches: {report}"
    );
    assert_eq!(counts(&store).await, (0, LIVE));
    store.close().await;
}

#[test]
fn a_purge_with_a_tiny_budget_says_so_in_its_exit_code() {
    let dir = std::env::temp_dir().join(format!(
        "txinbox-purge-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite:{}", dir.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Store::<sqlx::Sqlite>::connect(&url).await.unwrap();
        sqlx::query("WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 3000) INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin) SELECT 'old', '', 'm-' || n, 'h', '2020-01-01T00:00:00.000000Z', '2020-01-01T00:00:00.000000Z', '2020-02-01T00:00:00.000000Z', 'producer_id' FROM g")
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
    });
    // Batches of 100 with a 300 ms pause and a 1 s budget: stopped before the end, exit code 3.
    let out = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args([
            "inbox",
            "purge",
            "--store",
            &url,
            "--batch",
            "100",
            "--pause-ms",
            "300",
            "--budget-secs",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("time budget reached"));
    // The next pass finishes.
    let out = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args(["inbox", "purge", "--store", &url, "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["markers"].as_u64().unwrap() > 0 && report["budget_exhausted"] == false,
        "{report}"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", dir.display()));
    }
}

/// `--config` on a settings file with shards: one pass on each shard, under its heading; `--shard` for one,
/// with `--json`; `--json` on several shards refused with one line. Each shard loses only its own expired rows.
#[tokio::test]
async fn on_shards_a_pass_runs_on_each_shard_of_the_settings_file() {
    let base = txinbox_testkit::pg_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut shards = Vec::new();
    for expired in [30_i64, 70] {
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 2)
            .await
            .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
        sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin) SELECT 'old', '', 'm-' || g, 'h', now(), now(), now() - interval '1 day', 'producer_id' FROM generate_series(1, $1) g")
            .bind(expired)
            .execute(store.pool())
            .await
            .expect("load markers");
        shards.push((
            store,
            format!("{base}{sep}options=-csearch_path%3D{schema}"),
        ));
    }
    let dir = std::env::temp_dir().join(format!("txinbox-purge-shards-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("worker.toml");
    std::fs::write(
        &file,
        format!(
            "[store.shards.eu-1]\nurl = \"{}\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"{}\"\ntenants = [\"globex\"]\n",
            shards[0].1, shards[1].1
        ),
    )
    .unwrap();
    let config = file.display().to_string();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_txinbox"))
            .args(args)
            .env_remove("TXINBOX_STORE_URL")
            .output()
            .expect("run txinbox inbox purge")
    };
    let o = run(&["inbox", "purge", "--config", &config, "--json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--shard"));

    let o = run(&[
        "inbox", "purge", "--config", &config, "--shard", "eu-2", "--json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["markers"], 70, "{doc}");
    let left = |s: &Store<sqlx::Postgres>| {
        let pool = s.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM txinbox_inbox")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        left(&shards[0].0).await,
        30,
        "shard eu-1 untouched by --shard eu-2"
    );
    assert_eq!(left(&shards[1].0).await, 0);

    let o = run(&["inbox", "purge", "--config", &config]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("shard eu-1:") && out.contains("shard eu-2:"),
        "{out}"
    );
    assert_eq!(left(&shards[0].0).await, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A keep of more days than a u32 holds keeps everything (it once wrapped to a keep of 0 days, and the pass
/// deleted evidence recorded an hour ago).
#[test]
fn a_keep_of_more_days_than_u32_holds_keeps_recent_evidence() {
    let file = std::env::temp_dir().join(format!(
        "txinbox-purge-keep-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite:{}", file.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let count = |url: String| async move {
        let store = Store::<sqlx::Sqlite>::connect(&url).await.unwrap();
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM txinbox_rejections")
            .fetch_one(store.pool())
            .await
            .unwrap();
        store.close().await;
        n
    };
    rt.block_on(async {
        let store = Store::<sqlx::Sqlite>::connect(&url).await.unwrap();
        let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1))
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, payload_hash, conflicts_with, detail, recorded_at) VALUES ('c', '', 'm-1', 'payload_collision', 'h', 'h0', '', ?)")
            .bind(an_hour_ago)
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
    });
    let out = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args([
            "inbox",
            "purge",
            "--store",
            &url,
            "--json",
            "--rejections-keep-days",
            "4294967296",
        ])
        .env_remove("TXINBOX_STORE_URL")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rejections"], 0, "{report}");
    assert_eq!(rt.block_on(count(url.clone())), 1, "the evidence is kept");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// A store URL without the inbox's schema is refused: a mistyped SQLite path is not created, a PostgreSQL
/// schema without the inbox's tables does not get them, and the exit code says so.
#[tokio::test]
async fn a_purge_refuses_a_store_without_the_inbox_and_creates_nothing() {
    let run = |url: &str| {
        Command::new(env!("CARGO_BIN_EXE_txinbox"))
            .args(["inbox", "purge", "--store", url])
            .env_remove("TXINBOX_STORE_URL")
            .output()
            .expect("run txinbox inbox purge")
    };
    let file = std::env::temp_dir().join(format!(
        "txinbox-purge-typo-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let o = run(&format!("sqlite:{}", file.display()));
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!file.exists(), "no SQLite file was created");

    let base = txinbox_testkit::pg_url();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let pool = sqlx::PgPool::connect(&base).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let o = run(&format!("{base}{sep}options=-csearch_path%3D{schema}"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no txinbox schema"), "{err}");
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 0, "no table was created in {schema}");
    sqlx::query(&format!("DROP SCHEMA {schema}"))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}
