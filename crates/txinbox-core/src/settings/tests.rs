use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn shards_resolve_their_url_from_the_environment_and_bad_claims_are_one_line() {
    let s = WorkerSettings::from_toml_str(
    "[store]\nmax_connections = 6\n[store.shards.eu-1]\nurl_env = \"EU1\"\ntenants = [\"acme\", \"globex\"]\n[store.shards.eu-2]\nurl = \"postgres://crm@db-eu-2/crm\"\ntenants = [\"initech\"]\nrest = true\nmax_connections = 3\n",
)
.unwrap();
    let shards = s
        .store
        .resolved_shards_with(|v| (v == "EU1").then(|| "postgres://crm:s3cret@db-eu-1/crm".into()))
        .unwrap();
    assert_eq!(shards.len(), 2);
    assert_eq!(shards[0].name, "eu-1");
    assert_eq!(shards[0].url, "postgres://crm:s3cret@db-eu-1/crm");
    assert_eq!(shards[0].max_connections, 6);
    assert!(!format!("{shards:?}").contains("s3cret"), "{shards:?}");
    assert!(shards[1].rest && shards[1].max_connections == 3);
    let unset = s
        .store
        .resolved_shards_with(|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        unset.contains("EU1") && unset.contains("not set"),
        "{unset}"
    );

    let twice = WorkerSettings::from_toml_str(
    "[store.shards.a]\nurl = \"postgres://x@a/db\"\ntenants = [\"acme\"]\n[store.shards.b]\nurl = \"postgres://x@b/db\"\ntenants = [\"acme\"]\n",
)
.unwrap_err()
.to_string();
    assert!(
        twice.contains(r#"tenant "acme" is claimed by shard "a" and by shard "b""#),
        "{twice}"
    );
    for (text, says) in [
    ("[store.shards.a]\ntenants = [\"x\"]\n", "no url and no url_env"),
    (
        "[store.shards.a]\nurl = \"postgres://h/d\"\nurl_env = \"V\"\ntenants = [\"x\"]\n",
        "both url and url_env",
    ),
    ("[store.shards.a]\nurl = \"sqlite:a.db\"\ntenants = [\"x\"]\n", "PostgreSQL"),
    ("[store.shards.a]\nurl = \"postgres://h/d\"\n", "claims no tenant"),
    (
        "[store.shards.a]\nurl = \"postgres://h/d\"\ntenants = [\"acme\", \"acme\"]\n",
        r#"shard "a" lists tenant "acme" twice"#,
    ),
    (
        "[store.shards.a]\nurl = \"postgres://h/d\"\nrest = true\n[store.shards.b]\nurl = \"postgres://h/e\"\nrest = true\n",
        "both take the unclaimed tenants",
    ),
] {
    let e = WorkerSettings::from_toml_str(text).unwrap_err().to_string();
    assert!(e.contains(says), "{text}: {e}");
}
}

/// A shard's `url_env` variable that is set but empty, or holds something else than a PostgreSQL URL (a
/// `sqlite:` file, a password alone), is refused at start naming the variable and the shard, never quoting the
/// value; as is a file's `url` that is no `postgres://` URL.
#[test]
fn a_shard_s_url_variable_set_empty_or_to_another_store_is_refused_naming_it() {
    let s = WorkerSettings::from_toml_str("[store.shards.eu-1]\nurl_env = \"EU1\"\nrest = true\n")
        .unwrap();
    for value in ["", "  ", "sqlite:eu1.db", "hunter2pw", "postgresfoo:x"] {
        let e = s
            .store
            .resolved_shards_with(|v| (v == "EU1").then(|| value.to_owned()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("EU1") && e.contains("store.shards.eu-1"),
            "{value:?}: {e}"
        );
        assert!(!e.contains("not set"), "{value:?}: {e}");
        if !value.trim().is_empty() {
            assert!(!e.contains(value), "the value is quoted: {e}");
        }
    }
    for value in ["postgres://crm:pw@db/crm", "postgresql://crm@db/crm"] {
        let r = s
            .store
            .resolved_shards_with(|v| (v == "EU1").then(|| value.to_owned()))
            .unwrap();
        assert_eq!(r[0].url, value);
    }
    let e = WorkerSettings::from_toml_str(
        "[store.shards.a]\nurl = \"postgresfoo:x\"\ntenants = [\"x\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("PostgreSQL"), "{e}");
}

/// A `[store] url` beside `[store.shards]`, in the file or by `TXINBOX_STORE__URL`, is refused at start: the
/// worker and the operator commands would run on the shards and never on it, without a word.
#[test]
fn a_store_url_beside_shards_is_refused_naming_the_key_not_the_url() {
    let shards = "[store.shards.eu-1]\nurl = \"postgres://crm@db-eu-1/crm\"\nrest = true\n";
    let in_file = format!("[store]\nurl = \"postgres://crm:filepw@db/crm\"\n{shards}");
    let e = WorkerSettings::from_toml_str(&in_file)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("store.url") && e.contains("[store.shards]"),
        "{e}"
    );
    assert!(!e.contains("filepw"), "{e}");
    let e = WorkerSettings::parse(
        shards,
        "<text>".into(),
        env(&[("TXINBOX_STORE__URL", "postgres://crm:envpw@db/crm")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("store.url") && e.contains("TXINBOX_STORE__URL"),
        "{e}"
    );
    assert!(!e.contains("envpw"), "{e}");
    // Shards alone, or a store alone, are fine.
    WorkerSettings::from_toml_str(shards).unwrap();
    WorkerSettings::from_toml_str("[store]\nurl = \"postgres://crm@db/crm\"\n").unwrap();
}

/// `require_all_shards` without shards was accepted and did nothing: a file that asks for every shard (a shards
/// section left out, say in a per-environment copy) ran on the single store without a word.
#[test]
fn require_all_shards_without_shards_is_refused() {
    let e = WorkerSettings::from_toml_str(
        "[store]\nurl = \"postgres://crm@db/crm\"\nrequire_all_shards = true\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("store.require_all_shards"), "{e}");
    WorkerSettings::from_toml_str(
        "[store]\nrequire_all_shards = true\n[store.shards.eu-1]\nurl = \"postgres://crm@db/crm\"\nrest = true\n",
    )
    .unwrap();
}

#[test]
fn defaults_come_from_the_library() {
    let s = WorkerSettings::default();
    let w = WorkerOptions::default();
    assert_eq!(s.worker.concurrency, w.concurrency);
    assert_eq!(
        s.worker.shutdown_timeout_seconds,
        w.shutdown_timeout.as_secs()
    );
    assert_eq!(
        s.inbox.retention_seconds,
        RetentionPolicy::default().keep.as_secs()
    );
    assert_eq!(s.sqs.heartbeat_interval(), Duration::from_secs(20));
    assert_eq!(
        s.servicebus.lock_renewal_interval(),
        Duration::from_secs(20)
    );
    assert_eq!(WorkerSettings::from_toml_str("").unwrap(), s);
}

#[test]
fn overrides_set_keys_and_name_the_variable_when_they_cannot() {
    let dir = std::env::temp_dir().join(format!("txinbox-settings-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("worker.toml");
    std::fs::write(&f, "[sqs]\nvisibility_timeout_seconds = 60\n").unwrap();
    let s = WorkerSettings::load_with_env(
        &f,
        env(&[
            ("TXINBOX_SQS__VISIBILITY_TIMEOUT_SECONDS", "120"),
            ("txinbox_store__url", "postgres://u:secret@db/app"),
            ("TXINBOX_STORE__URL", "postgres://u:secret@db/app"),
            ("TXINBOX_CRM_URL", "http://crm"), // not a setting: ignored
            ("PATH", "/bin"),
        ]),
    )
    .unwrap();
    assert_eq!(s.sqs.visibility_timeout_seconds, 120);
    assert_eq!(s.sqs.heartbeat_interval(), Duration::from_secs(40));
    assert_eq!(s.store.url, "postgres://u:secret@db/app");

    let e = WorkerSettings::load_with_env(
        &f,
        env(&[("TXINBOX_SQS__VISIBILTY_TIMEOUT_SECONDS", "120")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("worker.toml"), "{e}");
    assert!(e.contains("TXINBOX_SQS__VISIBILTY_TIMEOUT_SECONDS"), "{e}");
    assert!(e.contains("visibilty_timeout_seconds"), "{e}");

    let e = WorkerSettings::load_with_env(&f, env(&[("TXINBOX_QUEUE__URL", "x")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("TXINBOX_QUEUE__URL") && e.contains("no section"),
        "{e}"
    );

    // The value of an override never appears in an error (it may be a password).
    let e =
        WorkerSettings::load_with_env(&f, env(&[("TXINBOX_STORE__MAX_CONNECTIONS", "hunter2")]))
            .unwrap_err()
            .to_string();
    assert!(e.contains("TXINBOX_STORE__MAX_CONNECTIONS"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_renewal_cadence_no_worker_would_run_is_refused() {
    let e = WorkerSettings::from_toml_str(
        "[sqs]\nvisibility_timeout_seconds = 60\nheartbeat_interval_seconds = 45\n",
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            SettingsError::Value {
                key: "sqs.heartbeat_interval_seconds",
                ..
            }
        ),
        "{e}"
    );
    WorkerSettings::from_toml_str(
        "[sqs]\nvisibility_timeout_seconds = 60\nheartbeat_interval_seconds = 20\n",
    )
    .unwrap();
    let e = WorkerSettings::from_toml_str("[servicebus]\nlock_renewal_interval_seconds = 59\n")
        .unwrap_err();
    assert!(
        e.to_string().contains("lock_renewal_interval_seconds"),
        "{e}"
    );
}

#[test]
fn the_delivery_pipeline_keys_reach_the_worker_options() {
    let d = WorkerSettings::default().worker_options();
    let w = WorkerOptions::default();
    assert_eq!(
        (
            d.batch_size,
            d.prefetch,
            d.batch_commit,
            d.batch_linger,
            d.get_receive_loops()
        ),
        (
            w.batch_size,
            w.prefetch,
            w.batch_commit,
            w.batch_linger,
            w.get_receive_loops()
        )
    );
    let s = WorkerSettings::from_toml_str(
    "[worker]\nconcurrency = 32\nreceive_max = 20\nprefetch = 16\nbatch_commit = 10\nbatch_linger_ms = 25\nreceive_loops = 3\n[sqs]\nqueue_url = \"https://sqs.eu-west-1.amazonaws.com/1/q.fifo\"\nbatch_size = 10\n",
)
.unwrap();
    let o = s.worker_options();
    assert_eq!(
        (o.concurrency, o.batch_size, o.prefetch, o.batch_commit),
        (32, 20, 16, 10)
    );
    assert_eq!(
        (o.batch_linger, o.get_receive_loops()),
        (Duration::from_millis(25), 3)
    );
    // Without receive_max, the SQS batch is the receive.
    let o = WorkerSettings::from_toml_str(
        "[sqs]\nqueue_url = \"https://sqs.eu-west-1.amazonaws.com/1/q.fifo\"\nbatch_size = 4\n",
    )
    .unwrap()
    .worker_options();
    assert_eq!(o.batch_size, 4);
    for bad in [
        "[worker]\nbatch_commit = 65\n",
        "[worker]\nbatch_commit = 0\n",
        "[worker]\nreceive_max = 0\n",
        "[worker]\nbatch_linger_ms = 1001\n",
        // A linger without batch commit would be ignored.
        "[worker]\nbatch_linger_ms = 50\n",
        "[worker]\nreceive_loops = 0\n",
        "[worker]\nreceive_loops = 17\n",
    ] {
        let e = WorkerSettings::from_toml_str(bad).unwrap_err().to_string();
        let key = bad.split('\n').nth(1).unwrap().split(' ').next().unwrap();
        assert!(e.contains(&format!("worker.{key}")), "{bad}: {e}");
    }
}

#[test]
fn unknown_keys_and_bad_addresses_name_the_key() {
    let e = WorkerSettings::from_toml_str("[inbox]\nretention_days = 30\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("retention_days"), "{e}");
    let e = WorkerSettings::from_toml_str("[worker]\nhealth_addr = \"localhost\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("worker.health_addr"), "{e}");
}

/// A value the runtime would raise to its floor without a word (a claim of 0 s run as 1 s, a shard's pool of 0
/// connections run as 1, a purge every 0 s run back to back) is refused, naming its key.
#[test]
fn values_the_runtime_would_raise_are_refused_naming_the_key() {
    for (toml, key) in [
        ("[effects]\nbatch = 0\n", "effects.batch"),
        ("[effects]\nclaim_seconds = 0\n", "effects.claim_seconds"),
        ("[effects]\nmax_attempts = 0\n", "effects.max_attempts"),
        ("[effects]\nmax_attempts = -3\n", "effects.max_attempts"),
        (
            "[effects]\nmax_reconciliations = 0\n",
            "effects.max_reconciliations",
        ),
        (
            "[effects]\nbackoff_ms = 5000\nmax_backoff_seconds = 1\n",
            "effects.max_backoff_seconds",
        ),
        (
            "[worker]\npurge_interval_seconds = 0\n",
            "worker.purge_interval_seconds",
        ),
        (
            "[store.shards.eu-1]\nurl = \"postgres://db/eu\"\nrest = true\nmax_connections = 0\n",
            "store.shards",
        ),
    ] {
        match WorkerSettings::from_toml_str(toml) {
            Err(e @ SettingsError::Value { .. }) => {
                assert!(e.to_string().contains(key), "{toml}: {e}")
            }
            other => panic!("{toml}: {other:?}"),
        }
    }
    // Their floors are accepted.
    let s = WorkerSettings::from_toml_str(
        "[effects]\nbatch = 1\nclaim_seconds = 1\nmax_attempts = 1\nmax_reconciliations = 1\n\
         backoff_ms = 1000\nmax_backoff_seconds = 1\n[worker]\npurge_interval_seconds = 1\n",
    )
    .unwrap();
    assert_eq!(s.effects.options().claim_for, Duration::from_secs(1));
}

/// An override's value that reads as a number or a boolean is still a string where the key takes one (a
/// consumer or a queue named with digits).
#[test]
fn an_override_of_a_string_key_may_be_all_digits() {
    let s = WorkerSettings::parse(
        "",
        "<text>".into(),
        env(&[
            ("TXINBOX_WORKER__CONSUMER", "2024"),
            ("TXINBOX_SERVICEBUS__QUEUE", "true"),
            ("TXINBOX_WORKER__CONCURRENCY", "4"),
        ]),
    )
    .unwrap();
    assert_eq!(s.worker.consumer, "2024");
    assert_eq!(s.servicebus.queue.as_deref(), Some("true"));
    assert_eq!(s.worker.concurrency, 4);
    // A number where a number is wanted is still checked as one.
    let e = WorkerSettings::parse(
        "",
        "<text>".into(),
        env(&[("TXINBOX_WORKER__CONCURRENCY", "many")]),
    )
    .unwrap_err();
    assert!(
        matches!(&e, SettingsError::Override { var, .. } if var == "TXINBOX_WORKER__CONCURRENCY"),
        "{e:?}"
    );
}

/// A consumer name refused says the rule it breaks, not another one.
#[test]
fn a_bad_consumer_name_is_refused_with_its_rule() {
    for (name, rule) in [
        ("crm followup", "A-Z a-z 0-9 . _ - :"),
        ("", "1 to 128 characters"),
    ] {
        let e = WorkerSettings::from_toml_str(&format!("[worker]\nconsumer = {name:?}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("worker.consumer") && e.contains(rule),
            "{name:?}: {e}"
        );
    }
}

/// The settings in a log line (`{:?}`, `tracing::info!(?settings)`) never show a password, a header's value
/// or a query's: the store's URL (TXINBOX_STORE__URL is where a password belongs), a shard's, a destination's.
#[test]
fn debug_never_shows_a_secret() {
    let s = WorkerSettings::parse(
        "[store.shards.eu-1]\nurl = \"postgres://app:sh4rdpw@db-eu/crm\"\nrest = true\n\
         [effects.destinations.crm]\nurl = \"https://crm.example/v1/tasks?api_key=k3y999&x={external_ref}\"\n\
         headers = { Authorization = \"Bearer t0ken42\" }\n\
         compensate_url = \"https://crm.example/v1/undo?token=c0mp77\"\n\
         confirm = { url = \"https://crm.example/v1/find?sig=s1g55\" }\n",
        "<text>".into(),
        env(&[]),
    )
    .unwrap();
    // The store's own URL (never beside shards).
    let one = WorkerSettings::parse(
        "",
        "<text>".into(),
        env(&[(
            "TXINBOX_STORE__URL",
            "postgres://app:s3cretpw@db/crm?sslpassword=ssl88",
        )]),
    )
    .unwrap();
    let shown = format!("{s:?} {:#?} {one:?} {:#?}", s.store, one.store);
    for secret in [
        "s3cretpw", "ssl88", "sh4rdpw", "k3y999", "t0ken42", "c0mp77", "s1g55",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    // What helps reading it stays: hosts, paths, header names, placeholders.
    for kept in [
        "db/crm",
        "db-eu/crm",
        "crm.example/v1/***?api_key=***",
        "Authorization",
        "{external_ref}",
    ] {
        assert!(shown.contains(kept), "{kept} not in {shown}");
    }
}

#[test]
fn a_toml_error_never_carries_the_password_of_the_line_it_quotes() {
    let text = "[store]\nurl = \"postgres://crm:s3cret@db/crm\" x\n";
    let e = WorkerSettings::from_toml_str(text).unwrap_err();
    let mut chain = vec![e.to_string(), format!("{e:?}")];
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        chain.push(s.to_string());
        chain.push(format!("{s:?}"));
        source = s.source();
    }
    assert!(chain.len() > 2, "the TOML error is the source");
    for text in &chain {
        assert!(!text.contains("s3cret"), "{text}");
    }
    assert!(
        chain[0].contains("postgres://crm:***@db/crm"),
        "the line is still quoted: {}",
        chain[0]
    );
}

/// The whole chain of a settings error, `Display` and `Debug` of each.
fn error_chain(e: &SettingsError) -> Vec<String> {
    let mut chain = vec![e.to_string(), format!("{e:?}")];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        chain.push(s.to_string());
        chain.push(format!("{s:?}"));
        source = s.source();
    }
    chain
}

/// A TOML error quotes the line it stops at, and a type error the value: a destination's header value (an API
/// key, a bearer token), a URL's query value (`?api_key=`), quoted or not, a string or a number, is masked
/// there; the line, the key and what is wrong are still told.
#[test]
fn a_toml_error_never_carries_a_header_value_or_a_query_value() {
    let d = "[effects.destinations.crm]\nurl = \"https://crm.example/v1/tasks\"\n";
    for (text, told) in [
        // An inline table left open.
        (
            format!("{d}headers = {{ Authorization = \"Bearer SECRETxyz123\" \n"),
            "line 3",
        ),
        // A duplicate key, in literal strings.
        (
            format!("{d}headers = {{ Authorization = 'Bearer SECRETxyz123', Authorization = 'x' }}\n"),
            "duplicate key",
        ),
        // A value left unquoted.
        (
            format!("{d}headers = {{ Authorization = Bearer SECRETxyz123 }}\n"),
            "must be quoted",
        ),
        // A bad escape inside the value.
        (
            format!("{d}headers = {{ Authorization = \"Bearer SECRETxyz123\\q\" }}\n"),
            "escape",
        ),
        // The headers as a table of their own, and something after the value.
        (
            format!("{d}[effects.destinations.crm.headers]\nX-Api-Key = \"SECRETxyz123\" x\n"),
            "X-Api-Key",
        ),
        // A line of an array that starts with `[` (not a table's header).
        (
            "[store.shards.eu-1]\ntenants = [\n  [\"SECRETxyz123\"] x\n]\n".to_owned(),
            "line 3",
        ),
        // A query value of a URL.
        (
            "[effects.destinations.crm]\nurl = \"https://crm.example/v1/tasks?api_key=SECRETxyz123\" x\n"
                .to_owned(),
            "crm.example/v1/***?api_key=***",
        ),
        // A webhook's token in the path.
        (
            "[effects.destinations.crm]\nurl = \"https://hooks.slack.com/services/T0/B0/SECRETxyz123\" x\n"
                .to_owned(),
            "hooks.slack.com/services/***/***/***",
        ),
        // Type errors quote the value.
        (
            format!("{d}headers = \"Bearer SECRETxyz123\"\n"),
            "expected a map",
        ),
        (
            format!("{d}headers = {{ X-Api-Key = 98765432109 }}\n"),
            "expected a string",
        ),
        (
            format!("{d}[effects.destinations.crm.headers]\nX-Api-Key = 98765432109\n"),
            "headers.X-Api-Key",
        ),
    ] {
        let e = WorkerSettings::from_toml_str(&text).unwrap_err();
        let chain = error_chain(&e);
        for shown in &chain {
            assert!(
                !shown.contains("SECRETxyz123") && !shown.contains("98765432109"),
                "{text:?}: {shown}"
            );
        }
        assert!(chain[0].contains(told), "{text:?}: {told} not in {}", chain[0]);
    }
}

/// A connection string given as `[servicebus] namespace` (or `TXINBOX_SERVICEBUS__NAMESPACE`) is never shown
/// by the settings' `Debug`; a namespace is.
#[test]
fn debug_never_shows_a_connection_string_given_as_the_namespace() {
    let s = WorkerSettings::parse(
        "",
        "<text>".into(),
        env(&[(
            "TXINBOX_SERVICEBUS__NAMESPACE",
            "Endpoint=sb://crm.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=SECRETxyz123",
        )]),
    )
    .unwrap();
    let shown = format!("{s:?} {:#?}", s.servicebus);
    assert!(!shown.contains("SECRETxyz123"), "{shown}");
    let s = WorkerSettings::from_toml_str("[servicebus]\nnamespace = \"crm-prod\"\n").unwrap();
    assert!(
        format!("{:?}", s.servicebus).contains("namespace: Some(\"crm-prod\")"),
        "{:?}",
        s.servicebus
    );
}
