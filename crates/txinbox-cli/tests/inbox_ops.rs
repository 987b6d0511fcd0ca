//! `txinbox inbox stats|show|rejections` run as the real binary against SQLite files and PostgreSQL schemas
//! filled through the real inbox: applied messages, a payload collision, a business duplicate and pending
//! effects.

use std::process::{Command, Output};

use chrono::{DateTime, Utc};
use serde_json::Value;
use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::{
    ConsumerName, Effect, Handled, HandlerError, IdentityPolicy, Inbox, Message, Raw,
};
use txinbox_lab::lab::{lab_message, lab_processor, task_handler, CONSUMER, SOURCE};
use txinbox_lab::labdb::LabDb;
use txinbox_store::{Store, Tx};

fn queue() -> MemoryQueue {
    MemoryQueue::new(QueueOptions {
        max_receive_count: Some(5),
        ..QueueOptions::default()
    })
}

/// Fills a store through the inbox: 3 lab messages applied, a payload collision of `evt-482`, a business
/// duplicate `evt-republished` of `evt-483`; consumer `crm` applies 2 messages with one effect each (pending).
async fn populate<DB: LabDb>(store: Store<DB>) {
    DB::create_tables(&store).await.expect("lab tables");
    let p = lab_processor(store.clone(), task_handler::<Store<DB>>());
    let q = queue();
    for i in 0..3 {
        q.send(lab_message(i));
    }
    let mut altered = lab_message(0);
    let mut body: Value = serde_json::from_slice(&altered.body).unwrap();
    body["quantity"] = serde_json::json!(12);
    altered.body = body.to_string().into_bytes();
    q.send(altered);
    q.send(lab_message(1).attribute("ce-id", "evt-republished"));
    let mut labels = Vec::new();
    for _ in 0..5 {
        let d = q.receive_now(1).pop().expect("a delivery");
        labels.push(p.process_one(d).await.label().to_owned());
    }
    assert_eq!(
        labels,
        [
            "applied",
            "applied",
            "applied",
            "payload_collision",
            "business_duplicate"
        ]
    );

    let crm = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm").unwrap()),
    )
    .bind(|_tx: Tx<DB>, msg: Message<Raw>| async move {
        Ok::<_, HandlerError>(Handled::done().effect(Effect::new(
            "crm.create_task",
            "crm",
            msg.raw.body.clone(),
        )))
    });
    let q = queue();
    for i in 0..2 {
        q.send(OutgoingMessage::new(format!("{{\"n\":{i}}}")).cloudevent(
            "urn:test",
            &format!("evt-{i}"),
            "t",
        ));
    }
    for _ in 0..2 {
        let d = q.receive_now(1).pop().expect("a delivery");
        assert_eq!(crm.process_one(d).await.label(), "applied");
    }
    store.close().await;
}

fn txinbox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args(args)
        .env_remove("TXINBOX_STORE_URL")
        .output()
        .expect("run txinbox")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

/// Runs `txinbox inbox <args> --store url --json`, checks the exit code and parses the document.
fn json(url: &str, args: &[&str], expect: i32) -> Value {
    let mut all = vec!["inbox"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", url, "--json"]);
    let o = txinbox(&all);
    assert_eq!(
        code(&o),
        expect,
        "{all:?}: stderr {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{all:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

fn human(url: &str, args: &[&str], expect: i32) -> String {
    let mut all = vec!["inbox"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", url]);
    let o = txinbox(&all);
    assert_eq!(
        code(&o),
        expect,
        "{all:?}: stderr {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn consumer<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer"] == name)
        .unwrap_or_else(|| panic!("consumer {name} in {doc}"))
}

fn checks(url: &str, started: DateTime<Utc>) {
    // Stats of every consumer.
    let doc = json(url, &["stats"], 0);
    assert_eq!(doc["consumers"].as_array().unwrap().len(), 2, "{doc}");
    let lab = consumer(&doc, CONSUMER);
    assert_eq!(lab["inbox_rows"], 3);
    assert_eq!(lab["rows_last_hour"], 3);
    assert!(lab["oldest_processed_at"].is_string());
    assert_eq!(lab["rejections"]["payload_collision"], 1);
    assert_eq!(lab["rejections"]["business_duplicate"], 1);
    assert_eq!(lab["effects"]["pending"], 0);
    assert!(lab["effect_lag_seconds"].is_null());
    let crm = consumer(&doc, "crm");
    assert_eq!(crm["inbox_rows"], 2);
    assert_eq!(crm["effects"]["pending"], 2);
    assert_eq!(crm["effects"]["done"], 0);
    assert_eq!(crm["rejections"]["payload_collision"], 0);
    assert!(crm["oldest_pending_effect_at"].is_string());
    assert!(crm["effect_lag_seconds"].as_f64().unwrap() >= 0.0);
    // One consumer; the human table.
    let doc = json(url, &["stats", "--consumer", "crm"], 0);
    assert_eq!(doc["consumers"].as_array().unwrap().len(), 1);
    // A consumer the store knows nothing of (a typo): nothing matched, exit 1 and said on stderr, where it was
    // a row of zeros and exit 0, as if the consumer were idle.
    let doc = json(url, &["stats", "--consumer", "crn"], 1);
    assert_eq!(doc["consumers"][0]["inbox_rows"], 0, "{doc}");
    let o = txinbox(&["inbox", "stats", "--consumer", "crn", "--store", url]);
    assert_eq!(code(&o), 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("nothing matched") && err.contains("\"crn\""),
        "{err}"
    );
    let out = human(url, &["stats"], 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("consumer"), "{out}");
    assert!(out.contains("pending=2"), "{out}");

    // A collided message: its marker and the rejection of the altered copy.
    let doc = json(
        url,
        &["show", "--consumer", CONSUMER, "--message-id", "evt-482"],
        0,
    );
    assert_eq!(doc["found"], true);
    let markers = doc["markers"].as_array().unwrap();
    assert_eq!(markers.len(), 1, "{doc}");
    let m = &markers[0];
    assert_eq!(m["source"], SOURCE);
    assert_eq!(
        m["business_key"],
        "criar_tarefa_followup:oportunidade_2481:reuniao_184"
    );
    assert!(m["result_reference"].as_str().unwrap().starts_with("task-"));
    for field in [
        "payload_hash",
        "received_at",
        "processed_at",
        "retention_until",
        "id_origin",
        "delivery_count",
        "event_type",
    ] {
        assert!(!m[field].is_null(), "{field} in {m}");
    }
    let rej = doc["rejections"].as_array().unwrap();
    assert_eq!(rej.len(), 1, "{doc}");
    assert_eq!(rej[0]["kind"], "payload_collision");
    assert_eq!(rej[0]["conflicts_with"], m["payload_hash"]);
    assert_ne!(rej[0]["payload_hash"], m["payload_hash"]);
    assert_eq!(doc["effects"].as_array().unwrap().len(), 0);
    // The same with its source; with another source nothing is found.
    let doc = json(
        url,
        &[
            "show",
            "--consumer",
            CONSUMER,
            "--message-id",
            "evt-482",
            "--source",
            SOURCE,
        ],
        0,
    );
    assert_eq!(doc["markers"].as_array().unwrap().len(), 1);
    assert_eq!(doc["rejections"].as_array().unwrap().len(), 1);
    let doc = json(
        url,
        &[
            "show",
            "--consumer",
            CONSUMER,
            "--message-id",
            "evt-482",
            "--source",
            "urn:other",
        ],
        1,
    );
    assert_eq!(doc["found"], false);
    // A business duplicate: no marker, the rejection names the holder.
    let doc = json(
        url,
        &[
            "show",
            "--consumer",
            CONSUMER,
            "--message-id",
            "evt-republished",
        ],
        0,
    );
    assert_eq!(doc["markers"].as_array().unwrap().len(), 0);
    assert_eq!(doc["rejections"][0]["kind"], "business_duplicate");
    assert_eq!(doc["rejections"][0]["conflicts_with"], "evt-483");
    // A message with an effect.
    let doc = json(
        url,
        &["show", "--consumer", "crm", "--message-id", "evt-1"],
        0,
    );
    let fx = doc["effects"].as_array().unwrap();
    assert_eq!(fx.len(), 1, "{doc}");
    assert_eq!(fx[0]["state"], "pending");
    assert_eq!(fx[0]["destination"], "crm");
    assert_eq!(fx[0]["name"], "crm.create_task");
    assert_eq!(fx[0]["attempts"], 0);
    assert!(fx[0]["key"].as_str().is_some_and(|k| !k.is_empty()));
    // Human story, and an unknown message (exit 1).
    let out = human(
        url,
        &["show", "--consumer", CONSUMER, "--message-id", "evt-482"],
        0,
    );
    assert!(
        out.contains("payload_collision") && out.contains("processed_at"),
        "{out}"
    );
    let out = human(
        url,
        &["show", "--consumer", CONSUMER, "--message-id", "evt-nope"],
        1,
    );
    assert!(out.contains("not found"), "{out}");

    // Rejections: newest first, by kind, by time, limited.
    let doc = json(url, &["rejections"], 0);
    let rows = doc["rejections"].as_array().unwrap();
    assert_eq!(doc["count"], 2);
    assert_eq!(rows[0]["kind"], "business_duplicate", "newest first: {doc}");
    assert_eq!(rows[1]["kind"], "payload_collision");
    let doc = json(url, &["rejections", "--kind", "payload_collision"], 0);
    assert_eq!(doc["count"], 1);
    assert_eq!(doc["rejections"][0]["message_id"], "evt-482");
    let doc = json(
        url,
        &[
            "rejections",
            "--consumer",
            "crm",
            "--kind",
            "business_duplicate",
        ],
        0,
    );
    assert_eq!(doc["count"], 0);
    let since = started.to_rfc3339();
    let later = (Utc::now() + chrono::Duration::minutes(1)).to_rfc3339();
    let doc = json(
        url,
        &[
            "rejections",
            "--consumer",
            CONSUMER,
            "--since",
            &since,
            "--until",
            &later,
        ],
        0,
    );
    assert_eq!(doc["count"], 2);
    let doc = json(url, &["rejections", "--since", &later], 0);
    assert_eq!(doc["count"], 0);
    let doc = json(url, &["rejections", "--until", &since], 0);
    assert_eq!(doc["count"], 0);
    let doc = json(url, &["rejections", "--limit", "1"], 0);
    assert_eq!(doc["count"], 1);
    assert_eq!(doc["limit"], 1);
    assert_eq!(doc["rejections"][0]["kind"], "business_duplicate");
    let out = human(url, &["rejections"], 0);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.starts_with("recorded_at"), "{out}");

    // Usage errors: exit 2.
    for args in [
        vec!["rejections", "--kind", "bogus"],
        vec!["rejections", "--since", "yesterday"],
        vec!["rejections", "--limit", "0"],
        vec!["show", "--consumer", CONSUMER],
    ] {
        let mut all = vec!["inbox"];
        all.extend_from_slice(&args);
        all.extend_from_slice(&["--store", url]);
        assert_eq!(code(&txinbox(&all)), 2, "{args:?}");
    }
}

/// A store error: exit 2, one line on stderr, no password.
fn store_error(url: &str) {
    for cmd in [
        vec!["inbox", "stats", "--store", url],
        vec![
            "inbox",
            "show",
            "--store",
            url,
            "--consumer",
            "c",
            "--message-id",
            "m",
        ],
        vec!["inbox", "rejections", "--store", url, "--json"],
    ] {
        let o = txinbox(&cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(code(&o), 2, "{cmd:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(!err.contains("s3cretpw"), "the password leaked: {err}");
        assert!(o.stdout.is_empty());
    }
}

#[tokio::test]
async fn sqlite_stats_story_rejections_and_exit_codes() {
    let started = Utc::now();
    let path = std::env::temp_dir().join(format!("txinbox-ops-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite:{}", path.display());
    populate(Store::<sqlx::Sqlite>::connect(&url).await.unwrap()).await;
    checks(&url, started);
    // A missing file is an error, and is not created.
    let missing = format!("sqlite:{}.missing", path.display());
    store_error(&missing);
    assert!(!std::path::Path::new(&format!("{}.missing", path.display())).exists());
    store_error("mysql://admin:s3cretpw@db.example/app");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test]
async fn postgres_stats_story_rejections_and_exit_codes() {
    let started = Utc::now();
    let base = txinbox_testkit::pg_url();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 4)
        .await
        .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
    let admin = store.pool().clone();
    populate(store).await;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
    checks(&url, started);
    // Nothing listening, with a password in the URL.
    store_error("postgres://admin:s3cretpw@127.0.0.1:1/app");
    // An empty schema: no txinbox tables.
    let empty = format!("{base}{sep}options=-csearch_path%3Dno_such_schema_{schema}");
    store_error(&empty);
    drop(admin);
    let pool = sqlx::PgPool::connect(&base).await.unwrap();
    sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

/// `--config` on a settings file with shards: each shard in turn under its heading, one with `--shard`, the
/// shard's URL read from the variable `url_env` names (its password never printed), `show` found in the shard
/// that holds the message, `--json` on several shards refused with one line.
#[tokio::test]
async fn on_shards_the_commands_read_each_shard_of_the_settings_file() {
    let base = txinbox_testkit::pg_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut urls = Vec::new();
    for filled in [true, false] {
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 4)
            .await
            .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
        if filled {
            populate(store).await;
        } else {
            store.close().await;
        }
        urls.push(format!("{base}{sep}options=-csearch_path%3D{schema}"));
    }
    let dir = std::env::temp_dir().join(format!("txinbox-shard-ops-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("worker.toml");
    std::fs::write(
        &file,
        format!(
            "[store.shards.eu-1]\nurl_env = \"TXINBOX_TEST_SHARD_EU_1\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"{}\"\ntenants = [\"globex\"]\n",
            urls[1]
        ),
    )
    .unwrap();
    let config = file.display().to_string();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_txinbox"))
            .args(args)
            .env_remove("TXINBOX_STORE_URL")
            .env("TXINBOX_TEST_SHARD_EU_1", &urls[0])
            .output()
            .expect("run txinbox")
    };
    let o = run(&["inbox", "stats", "--config", &config]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let (eu1, eu2) = out.split_once("shard eu-2:").expect("both headings");
    assert!(eu1.starts_with("shard eu-1:"), "{out}");
    assert!(
        eu1.contains(CONSUMER),
        "shard eu-1 holds the lab's markers: {out}"
    );
    assert!(!eu2.contains(CONSUMER), "shard eu-2 holds nothing: {out}");

    let o = run(&[
        "inbox", "stats", "--config", &config, "--shard", "eu-1", "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(consumer(&doc, CONSUMER)["inbox_rows"], 3, "{doc}");

    let o = run(&[
        "inbox",
        "show",
        "--config",
        &config,
        "--consumer",
        CONSUMER,
        "--source",
        SOURCE,
        "--message-id",
        "evt-482",
    ]);
    assert_eq!(
        code(&o),
        0,
        "found in shard eu-1: {}",
        String::from_utf8_lossy(&o.stdout)
    );

    let o = run(&["inbox", "stats", "--config", &config, "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 2, "{err}");
    assert!(err.contains("--shard"), "{err}");

    let o = run(&["inbox", "stats", "--config", &config, "--shard", "us-1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 2, "{err}");
    assert!(
        err.contains("no such shard") && err.contains("eu-1, eu-2"),
        "{err}"
    );

    let o = run(&["effects", "stats", "--config", &config]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("shard eu-1:") && out.contains("shard eu-2:"),
        "{out}"
    );

    // The variable unset: one line naming it, never a URL.
    let o = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args(["inbox", "stats", "--config", &config])
        .env_remove("TXINBOX_STORE_URL")
        .env_remove("TXINBOX_TEST_SHARD_EU_1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 2, "{err}");
    assert!(err.contains("TXINBOX_TEST_SHARD_EU_1"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--config` on shards, one of them down: every command still runs on the others, and says on one line which
/// shard failed (never its password); the exit code is 2 because one shard could not be read, except `show`
/// finding the message in a shard that answered (a message lives in one shard).
#[tokio::test]
async fn on_shards_a_shard_that_is_down_is_named_and_the_others_are_still_read() {
    let base = txinbox_testkit::pg_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 4)
        .await
        .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
    populate(store).await;
    let up = format!("{base}{sep}options=-csearch_path%3D{schema}");
    let dir = std::env::temp_dir().join(format!("txinbox-shard-down-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("worker.toml");
    // eu-1 comes first and refuses every connection (nothing listens on port 1).
    std::fs::write(
        &file,
        format!(
            "[store.shards.eu-1]\nurl_env = \"TXINBOX_TEST_SHARD_DOWN\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"{up}\"\ntenants = [\"globex\"]\n"
        ),
    )
    .unwrap();
    let config = file.display().to_string();
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_txinbox"))
            .args(args)
            .args(["--config", &config])
            .env_remove("TXINBOX_STORE_URL")
            .env(
                "TXINBOX_TEST_SHARD_DOWN",
                "postgres://crm:s3cretpw@127.0.0.1:1/crm",
            )
            .output()
            .expect("run txinbox");
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        assert!(
            !out.contains("s3cretpw") && !err.contains("s3cretpw"),
            "{out}{err}"
        );
        assert!(
            err.lines().any(|l| l.starts_with("error: shard eu-1: ")),
            "{args:?}: the failed shard is named: {err}"
        );
        (code(&o), out)
    };
    for (args, exit) in [
        (&["inbox", "stats"][..], 2),
        (&["inbox", "rejections"][..], 2),
        (&["effects", "stats"][..], 2),
        (
            &[
                "inbox",
                "show",
                "--consumer",
                CONSUMER,
                "--source",
                SOURCE,
                "--message-id",
                "evt-482",
            ][..],
            0,
        ),
    ] {
        let (got, out) = run(args);
        assert_eq!(got, exit, "{args:?}: {out}");
        let (_, eu2) = out
            .split_once("shard eu-2:")
            .unwrap_or_else(|| panic!("{args:?}: shard eu-2 was not read: {out}"));
        assert!(
            eu2.contains(CONSUMER) || eu2.contains("crm"),
            "{args:?}: {out}"
        );
    }
    // Not found in the shard that answered: unknown, since the other could not be read.
    let (got, _) = run(&[
        "inbox",
        "show",
        "--consumer",
        CONSUMER,
        "--message-id",
        "evt-never-sent",
    ]);
    assert_eq!(got, 2);
    // A maintenance pass runs on the shard that answers.
    let (got, out) = run(&["inbox", "purge"]);
    assert_eq!(got, 2, "{out}");
    assert!(out.contains("shard eu-2:"), "{out}");
    let pool = sqlx::PgPool::connect(&base).await.unwrap();
    sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
