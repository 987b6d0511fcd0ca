//! The `txinbox` binary: the lab's exact output, its arguments, and its errors.

mod common;

use std::process::{Command, Stdio};

use common::{outcome, scratch, settings_file, txinbox_command};

fn txinbox(args: &[&str]) -> (i32, String, String) {
    outcome(&mut txinbox_command(args))
}

fn pg_url() -> String {
    std::env::var("TXINBOX_TEST_PG_URL")
        .unwrap_or_else(|_| panic!("TXINBOX_TEST_PG_URL is not set: run `bash scripts/test.sh`"))
}

/// A PostgreSQL schema of a test's own at TXINBOX_TEST_PG_URL, dropped with all it holds when the test ends.
struct PgSchema {
    rt: tokio::runtime::Runtime,
    /// A pool on the database, outside the schema.
    admin: sqlx::PgPool,
    name: String,
    /// The store URL of the schema (its search_path), as a command is given it.
    url: String,
    /// The inbox's store on the schema, when it has the inbox.
    store: Option<txinbox_store::Store<sqlx::Postgres>>,
}

impl PgSchema {
    /// An empty schema: no inbox in it.
    fn empty() -> Self {
        let base = pg_url();
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let admin = rt.block_on(sqlx::PgPool::connect(&base)).unwrap();
        rt.block_on(sqlx::query(&format!("CREATE SCHEMA {name}")).execute(&admin))
            .unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        Self {
            rt,
            admin,
            name,
            url,
            store: None,
        }
    }

    /// A schema with the inbox in it, and its store open on it ([`Self::store`]).
    fn with_inbox() -> Self {
        let mut schema = Self::empty();
        let store = schema
            .rt
            .block_on(txinbox_store::Store::<sqlx::Postgres>::connect_with(
                &pg_url(),
                txinbox_store::StoreOptions::new().schema(&schema.name),
            ))
            .unwrap();
        schema.store = Some(store);
        schema
    }

    /// Makes the inbox in the schema, as a worker does, and closes its store.
    fn make_inbox(&self) {
        self.rt.block_on(async {
            txinbox_store::Store::<sqlx::Postgres>::connect_in_schema(&pg_url(), &self.name, 1)
                .await
                .expect("PostgreSQL at TXINBOX_TEST_PG_URL")
                .close()
                .await
        });
    }

    /// The inbox's store on the schema.
    fn store(&self) -> &txinbox_store::Store<sqlx::Postgres> {
        self.store.as_ref().expect("a schema with the inbox")
    }

    /// How many tables the schema holds.
    fn tables(&self) -> i64 {
        self.rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
                )
                .bind(&self.name)
                .fetch_one(&self.admin),
            )
            .unwrap()
    }

    /// Writes `effect` to the inbox's effects.
    fn insert_effect(&self, effect: Effect<'_>) {
        self.rt
            .block_on(
                sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at, result_reference, last_error) VALUES ('c', 'm-1', $1, 'crm', 'crm', '\\x00', '{}', 'r', $2, now(), now() - make_interval(mins => $3), now(), $4, $5)")
                    .bind(effect.key)
                    .bind(effect.state)
                    .bind(effect.minutes_ago)
                    .bind(effect.reference)
                    .bind(effect.last_error)
                    .execute(self.store().pool()),
            )
            .unwrap();
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            self.rt.block_on(store.close());
        }
        let dropped = self.rt.block_on(
            sqlx::query(&format!("DROP SCHEMA {} CASCADE", self.name)).execute(&self.admin),
        );
        self.rt.block_on(self.admin.close());
        if !std::thread::panicking() {
            dropped.expect("drop the test's schema");
        }
    }
}

/// An effect of consumer `c`, message `m-1`, destination `crm` (name `crm`, external ref `r`): its key and
/// state, how long ago it was created, the destination's reference and its last error.
#[derive(Default)]
struct Effect<'a> {
    key: &'a str,
    state: &'a str,
    minutes_ago: i32,
    reference: Option<&'a str>,
    last_error: Option<&'a str>,
}

#[test]
fn lab_prints_the_lab_lines() {
    let (code, out, err) = txinbox(&["lab"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "deliveries=4\naccepted=2\nduplicates=2\ninbox_rows=2\nbusiness_effects=2\n"
    );
}

/// `txinbox lab` runs in memory unless `--store` names a store: a TXINBOX_STORE_URL exported for the operator
/// commands (the workers' own store) stood for `--store`, so the lab created schemas (or DynamoDB tables) and
/// ran its deliveries in that store.
#[test]
fn lab_ignores_an_exported_store_url() {
    let out = Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .arg("lab")
        .env(
            "TXINBOX_STORE_URL",
            "postgres://crm:s3cret@127.0.0.1:1/production",
        )
        .output()
        .expect("run txinbox");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("deliveries=4\n"), "{stdout}");
}

#[test]
fn lab_scales_with_messages_and_copies() {
    let (code, out, err) = txinbox(&["lab", "--messages", "7", "--copies", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "deliveries=21\naccepted=7\nduplicates=14\ninbox_rows=7\nbusiness_effects=7\n"
    );
}

#[test]
fn lab_runs_on_a_sqlite_file_and_cleans_up() {
    let dir = std::env::temp_dir().join(format!("txinbox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("lab.db").display());
    let (code, out, err) = txinbox(&["lab", "--messages", "3", "--copies", "2", "--store", &url]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "deliveries=6\naccepted=3\nduplicates=3\ninbox_rows=3\nbusiness_effects=3\n"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the lab's database files are removed"
    );
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn lab_runs_on_postgres() {
    let (code, out, err) = txinbox(&[
        "lab",
        "--messages",
        "5",
        "--copies",
        "2",
        "--store",
        &pg_url(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "deliveries=10\naccepted=5\nduplicates=5\ninbox_rows=5\nbusiness_effects=5\n"
    );
}

/// The lab reads its store URL as the store does, from its start to its cleanup: a parameter sqlx does not
/// know is never logged with its value.
#[test]
fn lab_on_postgres_never_logs_a_parameters_value() {
    let base = pg_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}sslpassword=SECRETxyz123");
    let (code, out, err) = outcome(
        txinbox_command(&["lab", "--messages", "2", "--store", &url]).env("TXINBOX_LOG", "warn"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("accepted=2"), "{out}");
    assert!(err.contains("sslpassword"), "the parameter is named: {err}");
    assert!(!err.contains("SECRETxyz123"), "its value leaked: {err}");
}

#[test]
fn windows_print_one_ok_row_each() {
    let (code, out, err) = txinbox(&["lab", "--windows"]);
    assert_eq!(code, 0, "{out}{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), txinbox_lab::windows::Window::ALL.len(), "{out}");
    for r in rows {
        assert!(r.ends_with(" ok"), "{r}");
        assert!(
            r.contains("inbox_rows=")
                && r.contains("business_effects=")
                && r.contains("broker[")
                && r.contains("outcome="),
            "{r}"
        );
    }
}

#[test]
fn bad_arguments_are_clear_errors_and_urls_keep_their_secrets() {
    let (code, _, err) = txinbox(&["lab", "--store", "mysql://root:s3cret@localhost/db"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unsupported store URL scheme \"mysql\""),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "the password leaked: {err}");

    let (code, _, err) = txinbox(&["lab", "--messages", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("at least 1"), "{err}");

    let (code, _, err) = txinbox(&[
        "lab",
        "--store",
        "postgres://postgres:hunter2@127.0.0.1:1/nope",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("hunter2"), "the password leaked: {err}");
}

/// A store given that is not a URL (a libpq `key=value` string, a bare password in TXINBOX_STORE_URL) has no
/// scheme to name: every command refuses it without quoting it.
#[test]
fn a_store_that_is_not_a_url_is_refused_without_being_quoted() {
    let conninfo = "host=db user=crm password=SECRETxyz123 dbname=crm";
    for args in [
        &["effects", "stats", "--store", conninfo][..],
        &["inbox", "stats", "--store", conninfo][..],
        &["inbox", "purge", "--store", conninfo][..],
        &["inbox", "partition", "--store", conninfo][..],
        &["lab", "--store", conninfo][..],
    ] {
        let (code, _, err) = txinbox(args);
        assert_ne!(code, 0, "{args:?}: {err}");
        assert!(err.contains("scheme"), "{args:?} says what is wrong: {err}");
        assert!(
            !err.contains("SECRETxyz123"),
            "{args:?} leaked the password: {err}"
        );
    }
}

/// The lab's counts are bounded and refused before anything is opened: the store here refuses connections,
/// so an error that is not the usage error would be the store's.
#[test]
fn lab_refuses_counts_beyond_its_bound_before_opening_the_store() {
    let nowhere = "postgres://postgres@127.0.0.1:1/nope";
    for (args, says) in [
        (&["--messages", "100001"][..], "at most 100000"),
        (&["--copies", "100001"][..], "at most 100000"),
        (&["--messages", "0"][..], "at least 1"),
        (&["--copies", "0"][..], "at least 1"),
        (
            &["--messages", "18446744073709551615"][..],
            "at most 100000",
        ),
        (
            &["--messages", "1000", "--copies", "101"][..],
            "101000 deliveries, more than the 100000",
        ),
        (
            &["--messages", "100000", "--copies", "100000"][..],
            "more than the 100000",
        ),
    ] {
        let mut all = vec!["lab", "--store", nowhere];
        all.extend_from_slice(args);
        let (code, out, err) = txinbox(&all);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(out, "", "{args:?}: nothing ran");
    }
    // The largest run allowed is taken (refused here by the store, not by the bound).
    let (code, _, err) = txinbox(&[
        "lab",
        "--store",
        nowhere,
        "--messages",
        "1000",
        "--copies",
        "100",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        !err.contains("at most") && !err.contains("more than"),
        "{err}"
    );
    // --batch was bounded already (2 to 64), before any store is opened.
    for n in ["1", "65"] {
        let (code, out, err) = txinbox(&["lab", "--windows", "--batch", n, "--store", nowhere]);
        assert_eq!(code, 2, "--batch {n}: {out}{err}");
        assert!(err.contains("--batch must be 2 to 64"), "{err}");
    }
    // The windows choose their own messages: a count given with them is refused, not ignored.
    for flag in ["--messages", "--copies"] {
        let (code, out, err) = txinbox(&["lab", "--windows", flag, "5", "--store", nowhere]);
        assert_eq!(code, 2, "{flag}: {out}{err}");
        assert!(err.contains("cannot be used with"), "{flag}: {err}");
    }
}

#[test]
fn check_infra_passes_the_samples_and_fails_a_missing_folder() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra");
    for dir in ["aws-sqs-fifo", "azure-servicebus"] {
        let (code, out, err) = txinbox(&["check-infra", &format!("{root}/{dir}")]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("ok, no violation"), "{out}");
    }
    let (code, _, err) = txinbox(&["check-infra", "/definitely/not/here"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn effects_commands_refuse_bad_input_without_leaking_the_url() {
    let (code, _, err) = txinbox(&[
        "effects",
        "stats",
        "--store",
        "mysql://root:s3cret@localhost/db",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"mysql\""), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    let dir = scratch("effects-bad-input");
    let url = sqlite_store(&dir, "fx.db");
    let (code, _, err) = txinbox(&[
        "effects",
        "run",
        "--store",
        &url,
        "--http",
        "no-equals-sign",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("expected NAME=VALUE"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A flag's `NAME=VALUE` written wrong (a header as curl takes it, a URL without its `NAME=`) is refused
/// without its value, which may be a token or a URL with its key: neither the flag's parser nor clap quote it.
#[test]
fn effects_flags_written_wrong_are_refused_without_their_value() {
    for flags in [
        &[
            "--http",
            "crm=https://crm.example/v1",
            "--header",
            "Authorization: Bearer SECRETxyz123",
        ][..],
        &[
            "--http",
            "https://u:SECRETxyz123@crm.example/v1?api_key=SECRETxyz123",
        ][..],
        &["--http", "https://crm.example/v1?api_key=SECRETxyz123"][..],
    ] {
        let mut args = vec!["effects", "run", "--store", "sqlite::memory:"];
        args.extend_from_slice(flags);
        let (code, _, err) = txinbox(&args);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(
            err.contains("NAME="),
            "{flags:?} says what is expected: {err}"
        );
        assert!(
            !err.contains("SECRETxyz123"),
            "{flags:?} leaked the value: {err}"
        );
    }
}

#[test]
fn effects_run_refuses_a_rule_that_cannot_work_at_start_with_one_line_naming_it() {
    // A store with the inbox: what is refused is the rule, not the store.
    let dir = scratch("effects-rules");
    let url = sqlite_store(&dir, "fx.db");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "effects",
            "run",
            "--store",
            &url,
            "--once",
            "--http",
            "crm=https://crm.example/v1/tasks",
        ];
        args.extend_from_slice(extra);
        txinbox(&args)
    };
    for (extra, says) in [
        (
            &["--confirm", "crm=https://crm.example/v1/tasks"][..],
            "names neither {key} nor {external_ref}",
        ),
        (
            &[
                "--confirm-search",
                "crm=https://crm.example/v1/tasks?r={external_ref}",
                "--found-at",
                "crm=data/0/id",
            ],
            "found_at \"data/0/id\" is not a JSON pointer",
        ),
        (
            &[
                "--key",
                "crm=none",
                "--confirm",
                "crm=https://crm.example/v1/tasks?idempotency_key={key}",
            ],
            "keeps no key",
        ),
        (&["--answer", "crm=409:maybe"], "unknown answer \"maybe\""),
        (
            &["--key", "mailer=none"],
            "no --http, --upsert or [effects.destinations.mailer]",
        ),
        (
            &["--header", "crm=Authorization=env:TXINBOX_TEST_NOT_SET"],
            "TXINBOX_TEST_NOT_SET is not set",
        ),
    ] {
        let (code, out, err) = run(extra);
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert!(
            err.contains("effects destination") || err.contains("names"),
            "{err}"
        );
        assert!(err.contains(says), "{extra:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    // The settings file says the same, and is refused the same way.
    let file = dir.join("settings.toml");
    std::fs::write(
        &file,
        format!("[store]\nurl = \"{url}\"\n[effects.destinations.crm]\nurl = \"https://crm.example/v1/tasks\"\n[effects.destinations.crm.confirm]\nurl = \"https://crm.example/v1/tasks?ref={{externalref}}\"\n"),
    )
    .unwrap();
    let (code, _, err) = txinbox(&[
        "effects",
        "run",
        "--once",
        "--config",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("crm") && err.contains("{externalref}"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn effects_stats_lists_nothing_on_a_store_without_effects() {
    let dir = scratch("effects-stats-empty");
    let url = sqlite_store(&dir, "fx.db");
    let (code, out, err) = txinbox(&["effects", "stats", "--store", &url]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "only the header: {out}");
    assert!(out.starts_with("consumer"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Each `txinbox effects` command on `url`, none of which may answer.
fn effects_commands_on(url: &str) -> Vec<(i32, String, String)> {
    [
        &["effects", "stats", "--store", url][..],
        &[
            "effects",
            "run",
            "--once",
            "--store",
            url,
            "--http",
            "crm=http://127.0.0.1:9/tasks",
        ][..],
        &[
            "effects",
            "compensate",
            "--store",
            url,
            "--key",
            "k",
            "--compensate",
            "crm=http://127.0.0.1:9/tasks/{reference}",
        ][..],
        &["effects", "show", "--store", url, "--key", "k"][..],
    ]
    .into_iter()
    .map(txinbox)
    .collect()
}

/// A store URL without the inbox's schema is refused by every effects command (as by `inbox purge`): a
/// mistyped SQLite path is not created, an in-memory database is not made, a PostgreSQL schema without the
/// inbox's tables does not get them, and none answers as if on an empty store.
#[test]
fn effects_commands_refuse_a_store_without_the_inbox_and_create_nothing() {
    let dir = scratch("effects-typo");
    let typo = dir.join("typo.db");
    for (code, out, err) in effects_commands_on(&format!("sqlite:{}", typo.display())) {
        assert_eq!(code, 2, "{out}{err}");
        assert_eq!(out, "", "nothing answered: {err}");
        assert!(err.starts_with("error: store (sqlite)"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!typo.exists(), "no SQLite file was created");
    }
    for (code, out, err) in effects_commands_on("sqlite::memory:") {
        assert_eq!(code, 2, "{out}{err}");
        assert_eq!(out, "", "nothing answered: {err}");
        assert!(err.contains("no txinbox schema"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();

    let schema = PgSchema::empty();
    for (code, out, err) in effects_commands_on(&schema.url) {
        assert_eq!(code, 2, "{out}{err}");
        assert_eq!(out, "", "nothing answered: {err}");
        assert!(err.contains("no txinbox schema"), "{err}");
    }
    let tables = schema.tables();
    assert_eq!(tables, 0, "no table was created in {}", schema.name);
}

#[test]
fn check_infra_reads_var_files_and_plans() {
    let fixtures = format!(
        "{}/../txinbox-infra/tests/fixtures",
        env!("CARGO_MANIFEST_DIR")
    );
    let module = format!("{fixtures}/module-fifo");
    let (code, out, err) = txinbox(&["check-infra", &module]);
    assert_eq!(code, 0, "the local module passes: {out}{err}");
    let (code, out, err) = txinbox(&[
        "check-infra",
        &module,
        "--var-file",
        &format!("{module}/broken.tfvars"),
    ]);
    assert_eq!(
        code, 1,
        "a -var-file that breaks it is reported: {out}{err}"
    );
    assert!(
        out.contains("[sqs-visibility-timeout-too-short] module.queues.aws_sqs_queue.main"),
        "{out}"
    );
    let (code, out, err) = txinbox(&[
        "check-infra",
        &format!("{fixtures}/plan/existing-queues.json"),
    ]);
    assert_eq!(code, 0, "a plan JSON: {out}{err}");
    assert!(out.contains("check-infra: ok"), "{out}");
}

/// Creates the inbox's schema in a SQLite file and returns its URL.
fn sqlite_store(dir: &std::path::Path, name: &str) -> String {
    let url = format!("sqlite:{}", dir.join(name).display());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        txinbox_store::Store::<sqlx::Sqlite>::connect(&url)
            .await
            .unwrap()
            .close()
            .await;
    });
    url
}

#[test]
fn an_exported_txinbox_store_url_gives_way_to_config() {
    let dir = scratch("env-config");
    let url = sqlite_store(&dir, "inbox.db");
    let config = settings_file(&dir, &format!("[store]\nurl = \"{url}\"\n"))
        .display()
        .to_string();
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = txinbox_command(args);
        if let Some(v) = env {
            c.env("TXINBOX_STORE_URL", v);
        }
        outcome(&mut c)
    };
    let elsewhere = "postgres://crm:s3cret@127.0.0.1:1/elsewhere";
    let http = "crm=http://127.0.0.1:9/tasks";
    for command in [
        &["inbox", "stats", "--config", &config][..],
        &["inbox", "purge", "--config", &config][..],
        &["effects", "stats", "--config", &config][..],
        &[
            "effects", "run", "--once", "--config", &config, "--http", http,
        ][..],
    ] {
        let (code, out, err) = run(command, Some(elsewhere));
        assert_eq!(code, 0, "{command:?} reads --config: {out}{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
    // A compensation reads the file's store too: it read TXINBOX_STORE_URL's, and would have sent the DELETE
    // of another store's effect (its reference) to the file's destinations.
    let compensate = [
        "effects",
        "compensate",
        "--config",
        &config,
        "--key",
        "no-such-key",
        "--compensate",
        "crm=http://127.0.0.1:9/tasks/{reference}",
    ];
    for env in [Some(elsewhere), None] {
        let (code, out, err) = run(&compensate, env);
        assert_eq!(code, 2, "{out}{err}");
        assert!(
            err.contains("no effect has the key no-such-key"),
            "compensate reads --config's store ({env:?}): {err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
    // The variable still stands for --store when neither is given.
    let (code, out, err) = run(&["inbox", "stats"], Some(&url));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&["effects", "run", "--once", "--http", http], Some(&url));
    assert_eq!(code, 0, "{out}{err}");
    // Both given on the command line: a usage error.
    let (code, _, err) = run(
        &["inbox", "stats", "--store", &url, "--config", &config],
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn effects_run_on_a_settings_file_with_shards_runs_the_shard_named_and_never_a_default_store() {
    let dir = scratch("effects-shards");
    // Shards are PostgreSQL stores: each in a schema of its own.
    let [eu1, eu2] = ["eu1", "eu2"].map(|_| {
        let schema = PgSchema::empty();
        schema.make_inbox();
        schema
    });
    let config = settings_file(
        &dir,
        &format!(
            "[store.shards.eu-1]\nurl = \"{}\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"{}\"\nrest = true\n",
            eu1.url, eu2.url
        ),
    )
    .display()
    .to_string();
    let run = |extra: &[&str]| {
        outcome(
            txinbox_command(&["effects", "run", "--once", "--config", &config])
                .args(["--http", "crm=http://127.0.0.1:9/tasks"])
                .args(extra)
                .current_dir(&dir),
        )
    };
    let (code, out, err) = run(&[]);
    assert_eq!(code, 2, "no shard named: {out}{err}");
    assert!(
        err.contains("--shard") && err.contains("eu-1, eu-2"),
        "{err}"
    );
    assert!(
        !dir.join("txinbox.db").exists(),
        "no store of the default URL was made and run"
    );
    let (code, out, err) = run(&["--shard", "eu-2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("EffectReport"), "{out}");
    let (code, _, err) = run(&["--shard", "us-1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no such shard"), "{err}");
    assert!(!dir.join("txinbox.db").exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// `effects run --config` on a file with several shards and no `--shard` says to name one, whatever the shards'
/// variables hold where the command runs (a shard's `url_env` unset there is no reason to ask about it).
#[test]
fn effects_run_on_shards_without_shard_asks_for_one_before_reading_their_variables() {
    let dir = scratch("effects-shards-unset");
    let config = settings_file(
        &dir,
        "[store.shards.eu-1]\nurl_env = \"TXINBOX_TEST_NEVER_SET_SHARD\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"postgres://crm@127.0.0.1:1/crm\"\nrest = true\n",
    );
    let out = txinbox_command(&["effects", "run", "--once", "--config"])
        .arg(&config)
        .args(["--http", "crm=http://127.0.0.1:9/tasks"])
        .env_remove("TXINBOX_TEST_NEVER_SET_SHARD")
        .output()
        .expect("run txinbox");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--shard") && err.contains("eu-1, eu-2"),
        "{err}"
    );
    assert!(!err.contains("TXINBOX_TEST_NEVER_SET_SHARD"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `effects run --store URL --config F --shard NAME` names two stores: the shard's URL used to win silently, so
/// the runner ran the effects of a store the operator had not asked for. It is refused.
#[test]
fn effects_run_refuses_store_beside_shard() {
    let dir = scratch("effects-store-and-shard");
    let config = settings_file(
        &dir,
        "[store.shards.eu-1]\nurl = \"postgres://crm@127.0.0.1:1/crm\"\nrest = true\n",
    );
    let out = txinbox_command(&[
        "effects",
        "run",
        "--once",
        "--store",
        "sqlite::memory:",
        "--config",
    ])
    .arg(&config)
    .args(["--shard", "eu-1", "--http", "crm=http://127.0.0.1:9/tasks"])
    .output()
    .expect("run txinbox");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--shard") && err.contains("--store"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn effects_run_once_exits_non_zero_when_the_store_failed() {
    let dir = scratch("effects-store-error");
    let url = sqlite_store(&dir, "fx.db");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = txinbox_store::Store::<sqlx::Sqlite>::connect(&url)
            .await
            .unwrap();
        // Every claim now fails on the store.
        sqlx::query("DROP TABLE txinbox_effects")
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
    });
    let (code, out, err) = txinbox(&[
        "effects",
        "run",
        "--once",
        "--store",
        &url,
        "--http",
        "crm=http://127.0.0.1:9/tasks",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("store_errors=1"), "{out}");
    assert!(err.contains("store error"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_settings_file_error_never_prints_the_store_password() {
    let dir = scratch("settings-secret");
    // A stray token after the URL: TOML's error quotes the line.
    let config = settings_file(&dir, "[store]\nurl = \"postgres://crm:s3cret@db/crm\" x\n")
        .display()
        .to_string();
    let infra = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/aws-sqs-fifo");
    for args in [
        &["inbox", "stats", "--config", &config][..],
        &["inbox", "purge", "--config", &config][..],
        &["effects", "stats", "--config", &config][..],
        &["check-infra", infra, "--config", &config][..],
    ] {
        let (code, _, err) = txinbox(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("line 2"), "{args:?} names the line: {err}");
        assert!(
            !err.contains("s3cret"),
            "{args:?} leaked the password: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A store URL's query parameter sqlx does not know (libpq's `sslpassword`) is left out with a warning that
/// names its key, never its value: sqlx's own warning quotes the value.
#[test]
fn a_store_url_parameter_sqlx_does_not_know_is_never_printed_with_its_value() {
    let url = "postgres://postgres@127.0.0.1:1/nope?sslpassword=SECRETxyz123&application_name=x";
    for args in [
        &["inbox", "stats", "--store", url][..],
        &["effects", "stats", "--store", url][..],
    ] {
        let (code, _, err) = outcome(txinbox_command(args).env("TXINBOX_LOG", "warn"));
        assert_ne!(code, 0, "{args:?}: the store refuses connections: {err}");
        assert!(err.contains("sslpassword"), "{args:?} names the key: {err}");
        assert!(
            !err.contains("SECRETxyz123"),
            "{args:?} leaked the value: {err}"
        );
    }
}

#[test]
fn partition_status_changes_nothing_in_a_store_without_the_inbox() {
    partition_refuses_a_store_without_the_inbox(&["--status"]);
}

/// The conversion (without `--status`) on a URL without the inbox (a mistyped database or search_path) is
/// refused and creates nothing. It migrated the empty schema, created a partitioned inbox there and answered
/// `converted: ...` with exit 0, while the inbox the operator meant stayed row by row.
#[test]
fn partition_refuses_to_convert_a_store_without_the_inbox() {
    partition_refuses_a_store_without_the_inbox(&[]);
}

fn partition_refuses_a_store_without_the_inbox(flags: &[&str]) {
    let schema = PgSchema::empty();
    let url = schema.url.clone();
    let mut args = vec!["inbox", "partition", "--store", &url];
    args.extend_from_slice(flags);
    let (code, out, err) = txinbox(&args);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("no txinbox schema"), "{err}");
    let tables = schema.tables();
    assert_eq!(tables, 0, "{flags:?} created tables in {}", schema.name);
    // Once a worker made the inbox there, the same command converts it (or reports its layout).
    schema.make_inbox();
    let (code, out, err) = txinbox(&args);
    assert_eq!(code, 0, "{out}{err}");
    let expect = if flags.is_empty() {
        "converted: "
    } else {
        "row-by-row"
    };
    assert!(out.starts_with(expect), "{out}");
}

/// With the workers' settings file, a `--keep-days` shorter than its `[inbox] retention_seconds` (the time the
/// workers keep a marker, which must cover the queue's, the dead-letter queue's and a redrive's time) is refused
/// and changes nothing: the partitions of markers would be dropped while copies of their messages can still
/// come back, and each such copy would be dead-lettered `retention_expired`, a message never applied among
/// them. It converted with the shorter keep and exit 0. A keep as long or longer converts.
#[test]
fn partition_refuses_a_keep_shorter_than_the_workers_retention() {
    let schema = PgSchema::empty();
    schema.make_inbox();
    let dir = scratch("partition-keep");
    let file = settings_file(
        &dir,
        &format!(
            "[store]\nurl = \"{}\"\n[inbox]\nretention_seconds = 2592000\n",
            schema.url
        ),
    );
    let file = file.to_str().unwrap();
    let (code, out, err) = txinbox(&["inbox", "partition", "--config", file, "--keep-days", "3"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--keep-days 3") && err.contains("retention_seconds = 2592000"),
        "{err}"
    );
    let (code, out, err) = txinbox(&["inbox", "partition", "--config", file, "--status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("row-by-row"), "nothing changed: {out}");
    let (code, out, err) = txinbox(&["inbox", "partition", "--config", file, "--keep-days", "31"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("converted: "), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A pipe whose only reader (`true`) has exited: a write to it is a broken pipe, whenever it comes.
fn closed_pipe() -> std::process::ChildStdin {
    let mut reader = Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("run true");
    let writer = reader.stdin.take().expect("the pipe to true");
    reader.wait().expect("true exits");
    writer
}

/// Runs txinbox with `stdout` as its standard output: (exit code, stderr).
fn txinbox_to(args: &[&str], stdout: impl Into<Stdio>) -> (i32, String) {
    let (code, _, err) = outcome(txinbox_command(args).stdout(stdout));
    (code, err)
}

#[test]
fn a_closed_pipe_on_stdout_ends_every_command_quietly_with_141() {
    let dir = scratch("closed-pipe");
    let url = sqlite_store(&dir, "inbox.db");
    let infra = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/aws-sqs-fifo");
    for args in [
        &["lab", "--messages", "50"][..],
        &["schema", "--backend", "postgres"][..],
        &["inbox", "stats", "--store", &url][..],
        &[
            "inbox",
            "show",
            "--consumer",
            "c",
            "--message-id",
            "m",
            "--store",
            &url,
        ][..],
        &["effects", "stats", "--store", &url][..],
        &["check-infra", infra][..],
    ] {
        let (code, err) = txinbox_to(args, closed_pipe());
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert_eq!(code, 141, "{args:?}: {err}");
        assert_eq!(err, "", "{args:?} printed nothing on stderr");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// An error for a standard error that is gone: the exit status still says so (a panic in `eprintln!` made it
/// 101, a crash).
#[test]
fn an_error_with_standard_error_closed_still_exits_with_its_status() {
    for args in [
        &[
            "inbox",
            "stats",
            "--store",
            "sqlite:/definitely/not/here.db",
        ][..],
        &["inbox", "stats"][..],
    ] {
        let out = txinbox_command(args)
            .stdout(Stdio::piped())
            .stderr(closed_pipe())
            .output()
            .expect("run txinbox");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn another_write_error_on_stdout_is_reported_with_exit_2() {
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let (code, err) = txinbox_to(&["lab"], full());
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("error: writing to standard output") && err.contains("No space left"),
        "{err}"
    );
    let infra = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/aws-sqs-fifo");
    let (code, err) = txinbox_to(&["check-infra", infra], full());
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("No space left"), "{err}");
}

/// `effects show` lists every effect of one key, oldest first: on the partitioned layout a re-send in another
/// bucket of event time records a second effect under the key, and an operator sees both, with the state and
/// the destination's reference of each. An unknown key is an error.
#[test]
fn effects_show_lists_every_effect_of_a_key() {
    let schema = PgSchema::with_inbox();
    let _ = schema
        .rt
        .block_on(
            schema
                .store()
                .partition(&txinbox_store::PartitionOptions::new()),
        )
        .unwrap();
    for (minutes_ago, state, reference) in [(5, "done", Some("task-1")), (0, "pending", None)] {
        schema.insert_effect(Effect {
            key: "k-two",
            state,
            minutes_ago,
            reference,
            ..Default::default()
        });
    }
    let url = schema.url.clone();
    let (code, out, err) = txinbox(&["effects", "show", "--store", &url, "--key", "k-two"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two effects: {out}");
    assert!(lines[0].trim_start().starts_with("id"), "{out}");
    assert!(
        lines[1].contains(" done ") && lines[1].ends_with("task-1"),
        "{out}"
    );
    assert!(
        lines[2].contains(" pending ") && lines[2].ends_with(" -"),
        "{out}"
    );
    // An unknown key is "nothing found", exit 1 as for `inbox show`: not 2, which says the store failed.
    let (code, out, err) = txinbox(&["effects", "show", "--store", &url, "--key", "k-none"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("no effect has the key k-none"), "{err}");
}

/// `inbox rejections --since T1 --until T2` with T1 not before T2 (the two swapped at 3 a.m.) can match nothing:
/// it is refused as a usage error naming both, where it printed an empty table with exit 0, as if no delivery
/// had been refused in that range.
#[test]
fn rejections_with_since_not_before_until_is_a_usage_error() {
    let dir = scratch("since-until");
    let url = sqlite_store(&dir, "inbox.db");
    let (code, out, err) = txinbox(&[
        "inbox",
        "rejections",
        "--store",
        &url,
        "--since",
        "2026-12-02T00:00:00Z",
        "--until",
        "2026-12-01T00:00:00Z",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("--since") && err.contains("--until") && err.contains("nothing can match"),
        "{err}"
    );
    // In order, the same store answers (no rejection in it).
    let (code, out, err) = txinbox(&[
        "inbox",
        "rejections",
        "--store",
        &url,
        "--since",
        "2026-12-01T00:00:00Z",
        "--until",
        "2026-12-02T00:00:00Z",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `effects compensate --dry-run` says what a compensation would undo (each done effect of the key, the
/// request its destination would get) and changes nothing: no request sent (the destination here refuses every
/// connection, so a request would fail the command), the effect still done. A compensation undoes something
/// at a destination that cannot be taken back; there was no way to see it first.
#[test]
fn compensate_dry_run_says_what_it_would_undo_and_changes_nothing() {
    let schema = PgSchema::with_inbox();
    schema.insert_effect(Effect {
        key: "k-dry",
        state: "done",
        reference: Some("task-9"),
        ..Default::default()
    });
    let url = schema.url.clone();
    let compensate = |extra: &[&str]| {
        let mut args = vec![
            "effects",
            "compensate",
            "--store",
            &url,
            "--key",
            "k-dry",
            "--compensate",
            "crm=http://127.0.0.1:9/tasks/{reference}?token=s3cretTOKEN",
        ];
        args.extend_from_slice(extra);
        txinbox(&args)
    };
    let state = || -> String {
        schema
            .rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT state FROM txinbox_effects WHERE idempotency_key = 'k-dry'",
                )
                .fetch_one(schema.store().pool()),
            )
            .unwrap()
    };
    let (code, out, err) = compensate(&["--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("crm")
            && out.contains("task-9")
            && out.contains("DELETE http://127.0.0.1:9/tasks/{reference}"),
        "{out}"
    );
    assert!(out.contains("nothing sent, nothing changed"), "{out}");
    assert!(
        !out.contains("s3cret") && !err.contains("s3cret"),
        "{out}{err}"
    );
    assert_eq!(state(), "done");
    // The same command without --dry-run sends the request (refused here: the effect stays done).
    let (code, out, err) = compensate(&[]);
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(state(), "done");
    // A key with nothing done to undo is said as a real run says it.
    let (code, out, err) = txinbox(&[
        "effects",
        "compensate",
        "--store",
        &url,
        "--key",
        "k-none",
        "--compensate",
        "crm=http://127.0.0.1:9/tasks/{reference}",
        "--dry-run",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("no effect has the key k-none"), "{err}");
}

/// `effects run --once` with a destination name that matches none of the store's waiting effects (a misspelt
/// `--http cmr=...`) claims nothing: it says so on stderr, naming the destinations whose effects wait, where it
/// printed `claimed=0` as after a pass with nothing due.
#[test]
fn effects_run_once_names_waiting_effects_it_has_no_destination_for() {
    let schema = PgSchema::with_inbox();
    schema.insert_effect(Effect {
        key: "k-wait",
        state: "pending",
        ..Default::default()
    });
    let url = schema.url.clone();
    let (code, out, err) = txinbox(&[
        "effects",
        "run",
        "--once",
        "--store",
        &url,
        "--http",
        "cmr=http://127.0.0.1:9/tasks",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("claimed=0"), "{out}");
    assert!(
        err.contains("1 effect(s) wait for destinations this runner has no rule for: crm (1)"),
        "{err}"
    );
}

/// What `inbox show` and `effects show` print in text comes partly from outside: a destination's reference and
/// error text. A control character there (an escape sequence that rewrites the operator's terminal, a line break
/// that forges a line of the output) is shown escaped, never written raw; `--json` keeps the value as it is.
#[test]
fn text_output_escapes_control_characters_from_outside() {
    let schema = PgSchema::with_inbox();
    schema.insert_effect(Effect {
        key: "k-esc",
        state: "failed",
        reference: Some("task-1\u{1b}]52;c;cm0gLXJmIC8=\u{7}"),
        last_error: Some("refused\nstate               done\u{1b}[2J"),
        ..Default::default()
    });
    let url = schema.url.clone();
    for args in [
        &[
            "inbox",
            "show",
            "--store",
            &url,
            "--consumer",
            "c",
            "--message-id",
            "m-1",
        ][..],
        &["effects", "show", "--store", &url, "--key", "k-esc"][..],
    ] {
        let (code, out, err) = txinbox(args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{7}'),
            "{args:?} wrote a control character: {out:?}"
        );
        assert!(
            !out.contains("\nstate               done"),
            "{args:?}: {out}"
        );
    }
    let (code, out, err) = txinbox(&[
        "inbox",
        "show",
        "--store",
        &url,
        "--consumer",
        "c",
        "--message-id",
        "m-1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        doc["effects"][0]["last_error"],
        "refused\nstate               done\u{1b}[2J"
    );
}

// An error can quote outside input: a settings file's line, a Terraform file's. Its control characters are
// written escaped, so a file cannot rewrite the operator's terminal or forge a line of the error (`fail` wrote
// the error's text raw; the settings reader quotes the offending line).
#[test]
fn an_error_quoting_a_file_writes_its_control_characters_escaped() {
    let dir = scratch("esc");
    // The override in the key, which the quoted line keeps (its values are masked).
    let config = settings_file(
        &dir,
        "[store]\nurl = \"sqlite:x.db\"\n\u{202e}consumer = 7\u{1b}[2K\r error: none, all ok\n",
    );
    let (code, _, err) = txinbox(&["inbox", "stats", "--config", config.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 2, "{err}");
    // The bidi override, which makes the rest of the line read right to left, reached the terminal as it was.
    assert!(
        err.contains("\\u{202e}"),
        "the override is shown escaped: {err}"
    );
    assert!(
        !err.contains(['\u{1b}', '\r', '\u{202e}']),
        "a control character or a bidi override went out raw: {err:?}"
    );
}
