//! `txinbox effects`: run the effects of a store (for operators, or as a process of its own beside the
//! workers) and count them by state.

use std::collections::BTreeMap;

use txinbox_core::effects::EffectStore;
use txinbox_core::error::redact_url;
use txinbox_core::http::{runner_from_settings, HttpEffect};
use txinbox_core::settings::{
    ConfirmSettings, EffectsSettings, HttpDestinationSettings, WorkerSettings,
};
use txinbox_core::{EffectRunner, EffectState};

use crate::out::outln;

/// Arguments of `txinbox effects run`. The destinations come from the settings file's `[effects]` section
/// (`--config`), and from the flags below, which say the same thing per destination NAME and win over the file:
/// every rule of the file can be given on the command line. Its `Debug` masks the URLs' passwords and query
/// values and the headers' values.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Store URL (`sqlite:path.db`, `postgres://...` or `dynamodb://TABLE`); default: the settings file's
    /// `[store] url`; without `--store` and `--config`, `TXINBOX_STORE_URL`.
    // Not clap's `env`, as for the other commands (`targets::StoreArgs`): a TXINBOX_STORE_URL exported in the
    // operator's shell would stand for `--store` and win over `--config`'s store.
    #[arg(long)]
    pub store: Option<String>,
    /// The settings file (its `[effects]` section: runner options and `[effects.destinations.NAME]`).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// With `--config` on shards (`[store.shards]`): the shard whose effects this runner runs (its URL, in
    /// place of `--store`, which it refuses beside it). One runner per shard: without `--store`, a file with
    /// shards needs it.
    #[arg(long, requires = "config", conflicts_with = "store")]
    pub shard: Option<String>,
    /// An HTTP destination: `NAME=URL` (effects of destination NAME are POSTed to URL). Repeat for several.
    #[arg(long = "http", value_parser = Pair)]
    pub http: Vec<(String, String)>,
    /// An upsert destination: `NAME=URL` with `{external_ref}` or `{key}` in it (PUT; idempotent by itself).
    #[arg(long = "upsert", value_parser = Pair)]
    pub upsert: Vec<(String, String)>,
    /// `NAME=METHOD`: the call's method (POST; PUT or PATCH for an upsert).
    #[arg(long = "method", value_parser = Pair)]
    pub method: Vec<(String, String)>,
    /// `NAME=header:HEADER`, `NAME=body:FIELD` or `NAME=none`: where the key goes, and that the destination
    /// honours it (unset: `Idempotency-Key` sent, not relied on).
    #[arg(long = "key", value_parser = Pair)]
    pub key: Vec<(String, String)>,
    /// `NAME=SECONDS`: how long the destination keeps a key (86400).
    #[arg(long = "key-kept-secs", value_parser = Pair)]
    pub key_kept_secs: Vec<(String, String)>,
    /// `NAME=POINTER`: where the reference is in a 2xx answer (`/id`).
    #[arg(long = "reference", value_parser = Pair)]
    pub reference: Vec<(String, String)>,
    /// `NAME`: the destination's 2xx may carry no reference (done without reference).
    #[arg(long = "reference-optional")]
    pub reference_optional: Vec<String>,
    /// `NAME`: the destination's own API answers with HTML pages: a 2xx page is its answer, not a captive
    /// portal's, a proxy's or a firewall's (with `--reference-optional`, an upsert or a compensation URL).
    #[arg(long = "html-answers")]
    pub html_answers: Vec<String>,
    /// `NAME=URL`: the confirmation is a lookup (`GET`; 404 = not found; a 2xx must carry the reference),
    /// with `{key}` or `{external_ref}` in the URL.
    #[arg(long = "confirm", value_parser = Pair)]
    pub confirm: Vec<(String, String)>,
    /// `NAME=URL`: the confirmation is a search (`GET`; an empty list or a zero count = not found).
    #[arg(long = "confirm-search", value_parser = Pair)]
    pub confirm_search: Vec<(String, String)>,
    /// `NAME=URL`: the confirmation is a search by `POST`, with `--confirm-body`.
    #[arg(long = "confirm-search-post", value_parser = Pair)]
    pub confirm_search_post: Vec<(String, String)>,
    /// `NAME=JSON`: the body of a `POST` search (`{key}`, `{external_ref}` replaced).
    #[arg(long = "confirm-body", value_parser = Pair)]
    pub confirm_body: Vec<(String, String)>,
    /// `NAME=POINTER`: where the confirmation's reference is (`/id` for a lookup, `/data/0/id` for a search).
    #[arg(long = "found-at", value_parser = Pair)]
    pub found_at: Vec<(String, String)>,
    /// `NAME=POINTER`: where a search's count is (`/total`).
    #[arg(long = "count-at", value_parser = Pair)]
    pub count_at: Vec<(String, String)>,
    /// `NAME=POINTER`: where what the confirmation found carries the effect's external reference or key
    /// (`/data/0/external_ref`); a found object without it is not this effect.
    #[arg(long = "matches-at", value_parser = Pair)]
    pub matches_at: Vec<(String, String)>,
    /// `NAME`: the search leaves the list out when nothing matches (Square's `{}`): read as not found.
    #[arg(long = "absent-list-is-empty")]
    pub absent_list_is_empty: Vec<String>,
    /// `NAME=STATUS:ANSWER`: what a status or class means (`crm=409:in_progress`, `crm=4xx:rejected`).
    #[arg(long = "answer", value_parser = Pair)]
    pub answer: Vec<(String, String)>,
    /// `NAME=SECONDS`: wait this long after an uncertain call before the first confirmation (unset: 60 for a
    /// search where no key is kept, whose index may not show a fresh object yet; 0 otherwise; 0 set stands).
    #[arg(long = "reconcile-after-secs", value_parser = Pair)]
    pub reconcile_after_secs: Vec<(String, String)>,
    /// `NAME=HEADER=VALUE`: a header sent with every request (`crm=Authorization=env:CRM_TOKEN` reads the value
    /// from the environment).
    #[arg(long = "header", value_parser = Pair)]
    pub header: Vec<(String, String)>,
    /// Destinations that ignore idempotency keys (`--key NAME=none`): only the confirmation protects them.
    #[arg(long = "no-idempotency")]
    pub no_idempotency: Vec<String>,
    /// Run until nothing is due, then exit (else until SIGTERM / Ctrl-C); exit 2 when a store error met may
    /// have left effects unrun.
    #[arg(long)]
    pub once: bool,
    /// Effects claimed per pass (`[effects] batch`).
    #[arg(long)]
    pub batch: Option<i64>,
    /// Seconds a claim lasts before another runner may reconcile the effect (`[effects] claim_seconds`).
    #[arg(long)]
    pub claim_secs: Option<u64>,
    /// Seconds each HTTP request may take before the call is uncertain (every destination without its own).
    #[arg(long)]
    pub timeout_secs: Option<u64>,
}

/// `NAME=URL` pairs for a `Debug`: each URL's password and query values masked.
fn redacted_urls(pairs: &[(String, String)]) -> Vec<(&str, String)> {
    pairs
        .iter()
        .map(|(name, url)| (name.as_str(), redact_url(url)))
        .collect()
}

/// `NAME=HEADER=VALUE` pairs for a `Debug`: a header's value may be a token, so only its name is shown.
fn redacted_headers(pairs: &[(String, String)]) -> Vec<(&str, String)> {
    pairs
        .iter()
        .map(|(name, h)| {
            let header = h.split_once('=').map_or(h.as_str(), |(n, _)| n);
            (name.as_str(), format!("{header}=***"))
        })
        .collect()
}

impl std::fmt::Debug for RunArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunArgs")
            .field("store", &self.store.as_deref().map(redact_url))
            .field("config", &self.config)
            .field("shard", &self.shard)
            .field("http", &redacted_urls(&self.http))
            .field("upsert", &redacted_urls(&self.upsert))
            .field("method", &self.method)
            .field("key", &self.key)
            .field("key_kept_secs", &self.key_kept_secs)
            .field("reference", &self.reference)
            .field("reference_optional", &self.reference_optional)
            .field("html_answers", &self.html_answers)
            .field("confirm", &redacted_urls(&self.confirm))
            .field("confirm_search", &redacted_urls(&self.confirm_search))
            .field(
                "confirm_search_post",
                &redacted_urls(&self.confirm_search_post),
            )
            .field("confirm_body", &self.confirm_body)
            .field("found_at", &self.found_at)
            .field("count_at", &self.count_at)
            .field("matches_at", &self.matches_at)
            .field("absent_list_is_empty", &self.absent_list_is_empty)
            .field("answer", &self.answer)
            .field("reconcile_after_secs", &self.reconcile_after_secs)
            .field("header", &redacted_headers(&self.header))
            .field("no_idempotency", &self.no_idempotency)
            .field("once", &self.once)
            .field("batch", &self.batch)
            .field("claim_secs", &self.claim_secs)
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

impl std::fmt::Debug for CompensateArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompensateArgs")
            .field("store", &self.store.as_deref().map(redact_url))
            .field("shard", &self.shard)
            .field("key", &self.key)
            .field("compensate", &redacted_urls(&self.compensate))
            .field("config", &self.config)
            .field("key_in", &self.key_in)
            .field("header", &redacted_headers(&self.header))
            .field("html_answers", &self.html_answers)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

/// Arguments of `txinbox effects show`. Its `Debug` masks the URL's password.
#[derive(clap::Args)]
pub struct ShowArgs {
    /// Store URL (`sqlite:path.db`, `postgres://...` or `dynamodb://TABLE`).
    #[arg(long, env = "TXINBOX_STORE_URL")]
    pub store: String,
    /// The idempotency key.
    #[arg(long)]
    pub key: String,
}

impl std::fmt::Debug for ShowArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShowArgs")
            .field("store", &redact_url(&self.store))
            .field("key", &self.key)
            .finish()
    }
}

/// The parser of a `NAME=VALUE` flag. What it refuses is never quoted, by it nor by clap (whose own error for a
/// value a parser refuses quotes it): the value may be a token (`--header 'Authorization: Bearer ...'`, as curl
/// takes it) or a URL with its key (`--http https://...?api_key=...`, its `NAME=` left out, whose `=` then
/// falls inside the URL).
#[derive(Clone, Copy)]
struct Pair;

impl clap::builder::TypedValueParser for Pair {
    type Value = (String, String);

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let flag = arg.map_or_else(
            || "a flag".to_owned(),
            |a| format!("--{}", a.get_long().unwrap_or(a.get_id().as_str())),
        );
        let refused = |why: &str| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("{flag}: expected NAME=VALUE, {why} (the value is not shown: it may hold a secret)\n"),
            )
            .with_cmd(cmd)
        };
        let s = value
            .to_str()
            .ok_or_else(|| refused("and it is not UTF-8"))?;
        match s.split_once('=') {
            // A destination's name holds no `:`, `/`, `?`, `@`, `#` or space: one that does is a URL's start.
            Some((k, _)) if k.contains([':', '/', '?', '@', '#', ' ']) => Err(refused(
                "and what comes before its `=` is not a destination's name",
            )),
            Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(refused("and it has no name or no value around its `=`")),
        }
    }
}

impl RunArgs {
    /// The settings file, if any.
    fn file(&self) -> Result<Option<WorkerSettings>, String> {
        self.config
            .as_deref()
            .map(WorkerSettings::load)
            .transpose()
            .map_err(|e| e.to_string())
    }

    /// The store URL: `--shard`'s, else `--store`, else the settings file's (a file with shards needs
    /// `--shard`: its `[store] url` is none of them), else `TXINBOX_STORE_URL`.
    pub fn store_url(&self) -> Result<String, String> {
        store_url(
            self.store.as_deref(),
            self.config.as_deref(),
            self.shard.as_deref(),
            "a runner runs the effects of one, name it with --shard NAME (one `txinbox effects run` per shard)",
        )
    }

    /// The runner's settings: the file's `[effects]`, then the flags. Every destination's rules are checked.
    pub fn effects(&self) -> Result<EffectsSettings, String> {
        let mut fx = self.file()?.map(|f| f.effects).unwrap_or_default();
        if let Some(n) = self.batch {
            fx.batch = n;
        }
        if let Some(n) = self.claim_secs {
            fx.claim_seconds = n.max(1);
        }
        let d = &mut fx.destinations;
        for (name, url) in &self.http {
            d.entry(name.clone()).or_default().url.clone_from(url);
        }
        for (name, url) in &self.upsert {
            let dest = d.entry(name.clone()).or_default();
            dest.url.clone_from(url);
            dest.upsert = true;
        }
        let known = |d: &BTreeMap<String, HttpDestinationSettings>, flag: &str, name: &str| {
            if d.contains_key(name) {
                Ok(())
            } else {
                Err(format!(
                    "{flag} names {name:?}, which no --http, --upsert or [effects.destinations.{name}] defines"
                ))
            }
        };
        for (flag, pairs) in [
            ("--method", &self.method),
            ("--key", &self.key),
            ("--key-kept-secs", &self.key_kept_secs),
            ("--reference", &self.reference),
            ("--confirm", &self.confirm),
            ("--confirm-search", &self.confirm_search),
            ("--confirm-search-post", &self.confirm_search_post),
            ("--confirm-body", &self.confirm_body),
            ("--found-at", &self.found_at),
            ("--count-at", &self.count_at),
            ("--matches-at", &self.matches_at),
            ("--answer", &self.answer),
            ("--reconcile-after-secs", &self.reconcile_after_secs),
            ("--header", &self.header),
        ] {
            for (name, value) in pairs {
                known(d, flag, name)?;
                let dest = d.get_mut(name).ok_or("checked above")?;
                apply(dest, flag, value)?;
            }
        }
        for (flag, names) in [
            ("--reference-optional", &self.reference_optional),
            ("--html-answers", &self.html_answers),
            ("--no-idempotency", &self.no_idempotency),
            ("--absent-list-is-empty", &self.absent_list_is_empty),
        ] {
            for name in names {
                known(d, flag, name)?;
                let dest = d.get_mut(name).ok_or("checked above")?;
                match flag {
                    "--no-idempotency" => dest.key = Some("none".into()),
                    "--reference-optional" => dest.reference_optional = true,
                    "--html-answers" => dest.html_answers = true,
                    _ => confirm(dest).absent_list_is_empty = true,
                }
            }
        }
        if let Some(t) = self.timeout_secs {
            for dest in d.values_mut() {
                dest.timeout_seconds.get_or_insert(t.max(1));
            }
        }
        if d.is_empty() {
            return Err(
                "no destination: give --http NAME=URL (or --upsert), or [effects.destinations.NAME] in --config"
                    .into(),
            );
        }
        for (name, dest) in d.iter() {
            HttpEffect::from_settings(name, dest, |v| std::env::var(v).ok())
                .map_err(|e| e.to_string())?;
        }
        Ok(fx)
    }
}

/// The one store a command acts on: `--shard`'s, else `--store`, else the settings file's (a file with several
/// shards needs `--shard`, said with `which_shard`: its `[store] url` is none of them), else
/// `TXINBOX_STORE_URL`.
fn store_url(
    store: Option<&str>,
    config: Option<&std::path::Path>,
    shard: Option<&str>,
    which_shard: &str,
) -> Result<String, String> {
    if let (Some(url), None) = (store, shard) {
        return Ok(url.to_owned());
    }
    let Some(path) = config else {
        return crate::targets::StoreArgs::default()
            .targets()
            .map(|mut t| t.remove(0).url);
    };
    // Several shards and none named: said before any shard's URL is read (their variables need not be set
    // where the command runs).
    if shard.is_none() {
        let shards = WorkerSettings::load(path)
            .map_err(|e| e.to_string())?
            .store
            .shards;
        if shards.len() > 1 {
            let names: Vec<&str> = shards.keys().map(String::as_str).collect();
            return Err(format!(
                "{} has shards ({}): {which_shard}",
                path.display(),
                names.join(", ")
            ));
        }
    }
    let args = crate::targets::StoreArgs {
        store: None,
        config: Some(path.to_owned()),
        shard: shard.map(str::to_owned),
    };
    let mut targets = args.targets()?;
    if targets.len() != 1 {
        return Err(format!("{}: no store", path.display()));
    }
    Ok(targets.remove(0).url)
}

fn confirm(d: &mut HttpDestinationSettings) -> &mut ConfirmSettings {
    d.confirm.get_or_insert_with(ConfirmSettings::default)
}

/// One flag's value on a destination.
fn apply(d: &mut HttpDestinationSettings, flag: &str, v: &str) -> Result<(), String> {
    let secs = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| format!("{flag}: {v:?} is not a number of seconds"))
    };
    match flag {
        "--method" => d.method = Some(v.to_owned()),
        "--key" => d.key = Some(v.to_owned()),
        "--key-kept-secs" => d.key_kept_seconds = Some(secs(v)?),
        "--reference" => d.reference = Some(v.to_owned()),
        "--reconcile-after-secs" => d.reconcile_after_seconds = Some(secs(v)?),
        "--confirm" | "--confirm-search" | "--confirm-search-post" => {
            let c = confirm(d);
            c.url = v.to_owned();
            c.rule = Some(
                if flag == "--confirm" {
                    "lookup"
                } else {
                    "search"
                }
                .into(),
            );
            if flag == "--confirm-search-post" {
                c.method = Some("POST".into());
            }
        }
        "--confirm-body" => confirm(d).body = Some(v.to_owned()),
        "--found-at" => confirm(d).found_at = Some(v.to_owned()),
        "--count-at" => confirm(d).count_at = Some(v.to_owned()),
        "--matches-at" => confirm(d).matches_at = Some(v.to_owned()),
        "--answer" => {
            let (status, answer) = v
                .split_once(':')
                .ok_or_else(|| format!("--answer: expected NAME=STATUS:ANSWER, got {v:?}"))?;
            d.answers.insert(status.to_owned(), answer.to_owned());
        }
        "--header" => {
            let (h, value) = v
                .split_once('=')
                .ok_or_else(|| "--header: expected NAME=HEADER=VALUE".to_owned())?;
            d.headers.insert(h.to_owned(), value.to_owned());
        }
        _ => return Err(format!("unknown flag {flag}")),
    }
    Ok(())
}

/// Runs the effects of `store` through the destinations of `args`; prints the report. With `--once`, a pass
/// that claimed nothing looks for waiting effects of destinations the runner has no rule for when
/// `count_waiting` (the SQL stores, where the count is one grouped query; on DynamoDB it would read every
/// effect item) and names them on stderr.
pub async fn run<S: EffectStore>(
    store: S,
    args: &RunArgs,
    count_waiting: bool,
) -> Result<(), String> {
    let settings = args.effects()?;
    let counts_from = store.clone();
    let runner = runner_from_settings(store, &settings).map_err(|e| e.to_string())?;
    tracing::info!(holder = runner.holder(), "effect runner started");
    let report = if args.once {
        runner.run_until_idle().await
    } else {
        runner.run_until(txinbox_core::shutdown_signal()).await
    };
    outln!("{report}");
    if args.once && report.claimed == 0 && count_waiting {
        // A misspelt destination name claims nothing and would look like a pass with nothing due.
        if let Ok(counts) = counts_from.effect_counts().await {
            if let Some(note) = waiting_elsewhere(&counts, &settings) {
                crate::out::errln!("note: nothing claimed, but {note}");
            }
        }
    }
    // `--once` promises nothing due is left: a store error (a claim that failed) may have left effects unrun.
    if args.once && report.store_errors > 0 {
        return Err(format!(
            "{} store error(s) during the run: effects may be left unrun (TXINBOX_LOG=warn shows the errors)",
            report.store_errors
        ));
    }
    Ok(())
}

/// The effects waiting to run (pending, in flight, uncertain) whose destination `settings` has no rule for, as
/// `N effect(s) wait for destinations this runner has no rule for: NAME (n), ...`; `None` when there are none.
fn waiting_elsewhere(
    counts: &[txinbox_core::effects::EffectCount],
    settings: &EffectsSettings,
) -> Option<String> {
    let mut by_destination: BTreeMap<&str, i64> = BTreeMap::new();
    for c in counts {
        let waiting = matches!(
            c.state,
            EffectState::Pending | EffectState::InFlight | EffectState::Uncertain
        );
        if waiting && c.count > 0 && !settings.destinations.contains_key(&c.destination) {
            *by_destination.entry(c.destination.as_str()).or_default() += c.count;
        }
    }
    if by_destination.is_empty() {
        return None;
    }
    let total: i64 = by_destination.values().sum();
    let names: Vec<String> = by_destination
        .iter()
        .map(|(d, n)| format!("{} ({n})", d.escape_debug()))
        .collect();
    Some(format!(
        "{total} effect(s) wait for destinations this runner has no rule for: {} (a misspelt --http, --upsert or [effects.destinations] NAME?)",
        names.join(", ")
    ))
}

/// Arguments of `txinbox effects compensate`. Its `Debug` masks the URLs' passwords and query values.
#[derive(clap::Args)]
pub struct CompensateArgs {
    /// Store URL (`sqlite:path.db`, `postgres://...` or `dynamodb://TABLE`); default: the settings file's
    /// `[store] url` (`--config`); without `--store` and `--config`, `TXINBOX_STORE_URL`.
    // Not clap's `env` (see `RunArgs::store`): an exported TXINBOX_STORE_URL would stand for `--store` beside
    // `--config`, and the compensation would read another store's effect (its reference) and send its DELETE
    // to the file's destinations.
    #[arg(long)]
    pub store: Option<String>,
    /// With `--config` on shards (`[store.shards]`): the shard that holds the effect (its URL, in place of
    /// `--store`, which it refuses beside it).
    #[arg(long, requires = "config", conflicts_with = "store")]
    pub shard: Option<String>,
    /// The idempotency key of the done effect to undo.
    #[arg(long)]
    pub key: String,
    /// The compensation request of a destination: `NAME=URL` with `{reference}`, `{key}` or `{external_ref}`
    /// in it (a DELETE); it wins over the settings file's `compensate_url`.
    #[arg(long = "compensate", value_parser = Pair, required_unless_present = "config")]
    pub compensate: Vec<(String, String)>,
    /// The workers' settings file: its store (without `--store`) and its `[effects.destinations.NAME]` (their
    /// `compensate_url`, `key` and `headers`), as the effect runner reads them.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// `NAME=header:HEADER`, `NAME=body:FIELD` or `NAME=none`: where the destination takes the key (as
    /// `effects run --key`); the compensation sends `KEY-compensate` in that header, none for a body or none.
    #[arg(long = "key-in", value_parser = Pair)]
    pub key_in: Vec<(String, String)>,
    /// `NAME=HEADER=VALUE`: a header sent with the compensation (`crm=Authorization=env:CRM_TOKEN` reads the
    /// value from the environment).
    #[arg(long = "header", value_parser = Pair)]
    pub header: Vec<(String, String)>,
    /// `NAME`: the destination's own API answers with HTML pages (as `effects run --html-answers`): a 2xx page
    /// answered to the compensation is read as undone.
    #[arg(long = "html-answers")]
    pub html_answers: Vec<String>,
    /// Print each done effect of the key and the request its destination would get, and send nothing, change
    /// nothing (a compensation cannot be taken back).
    #[arg(long)]
    pub dry_run: bool,
}

impl CompensateArgs {
    /// The store holding the effect: `--shard`'s, else `--store`, else the settings file's, else
    /// `TXINBOX_STORE_URL`.
    pub fn store_url(&self) -> Result<String, String> {
        store_url(
            self.store.as_deref(),
            self.config.as_deref(),
            self.shard.as_deref(),
            "name the shard that holds the effect with --shard NAME",
        )
    }

    /// The destinations a compensation may go to: the settings file's, then the flags'. Each `--compensate`
    /// URL stands in for its destination's call URL where the file has none (a compensation sends no call).
    pub fn destinations(&self) -> Result<BTreeMap<String, HttpDestinationSettings>, String> {
        let mut d = match &self.config {
            Some(path) => {
                WorkerSettings::load(path)
                    .map_err(|e| e.to_string())?
                    .effects
                    .destinations
            }
            None => BTreeMap::new(),
        };
        for (name, url) in &self.compensate {
            let dest = d.entry(name.clone()).or_default();
            if dest.url.is_empty() {
                // A call URL with `{reference}` is refused (it is known only once done): placeholders of the
                // compensation's own stand in.
                dest.url = url
                    .replace("{reference}", "r")
                    .replace("{key}", "k")
                    .replace("{external_ref}", "e");
            }
            dest.compensate_url = Some(url.clone());
        }
        // The destination a flag names, which the file or a --compensate must define.
        fn named<'a>(
            d: &'a mut BTreeMap<String, HttpDestinationSettings>,
            flag: &str,
            name: &str,
        ) -> Result<&'a mut HttpDestinationSettings, String> {
            d.get_mut(name).ok_or_else(|| {
                format!("{flag} names {name:?}, which no --compensate or [effects.destinations.{name}] defines")
            })
        }
        for (flag, pairs) in [("--key-in", &self.key_in), ("--header", &self.header)] {
            for (name, value) in pairs {
                let dest = named(&mut d, flag, name)?;
                apply(dest, if flag == "--key-in" { "--key" } else { flag }, value)?;
            }
        }
        for name in &self.html_answers {
            named(&mut d, "--html-answers", name)?.html_answers = true;
        }
        if d.is_empty() {
            return Err(format!(
                "no destination: give --compensate NAME=URL, or [effects.destinations.NAME] compensate_url in {}",
                self.config
                    .as_deref()
                    .map_or("--config".into(), |p| p.display().to_string())
            ));
        }
        Ok(d)
    }
}

/// Undoes one done effect through its destination and marks it compensated; with `--dry-run`, says what it
/// would do ([`compensate_dry_run`]).
pub async fn compensate<S: EffectStore>(store: S, args: &CompensateArgs) -> Result<(), String> {
    let destinations = args.destinations()?;
    // Every destination is built as for the real run, so a dry run refuses what the run would refuse.
    for (name, dest) in &destinations {
        HttpEffect::from_settings(name, dest, |v| std::env::var(v).ok())
            .map_err(|e| e.to_string())?;
    }
    if args.dry_run {
        return compensate_dry_run(&store, args, &destinations).await;
    }
    let mut runner = EffectRunner::new(store);
    for (name, dest) in destinations {
        let exec = HttpEffect::from_settings(&name, &dest, |v| std::env::var(v).ok())
            .map_err(|e| e.to_string())?;
        runner = runner.executor(name, exec);
    }
    let state = runner
        .compensate(&args.key)
        .await
        .map_err(|e| e.to_string())?;
    outln!("effect {} {state}", args.key);
    Ok(())
}

/// `effects compensate --dry-run`: each done effect of the key and the request its destination would get
/// (`EffectRunner::compensate`'s choices: every done row, one request per destination and reference), its
/// URL's password and query values masked; refused as the run would refuse it (no effect, none done, one not
/// finished, a destination without its settings or its compensation request). Sends and changes nothing.
async fn compensate_dry_run<S: EffectStore>(
    store: &S,
    args: &CompensateArgs,
    destinations: &BTreeMap<String, HttpDestinationSettings>,
) -> Result<(), String> {
    let key = args.key.escape_debug().to_string();
    let all = store
        .find_effects(&args.key)
        .await
        .map_err(|e| e.to_string())?;
    let Some(newest) = all.last() else {
        return Err(format!("no effect has the key {key}"));
    };
    let done: Vec<_> = all
        .iter()
        .filter(|e| e.claimed_from == EffectState::Done)
        .collect();
    if done.is_empty() {
        return Err(format!(
            "effect {key} is {}, not done: nothing to compensate",
            newest.claimed_from
        ));
    }
    // Refused as the run refuses it: a row of the key that may still run or may have happened.
    if let Some(open) = all.iter().find(|e| !e.claimed_from.is_finished()) {
        return Err(txinbox_core::effects::CompensateError::Unfinished {
            key,
            id: open.id,
            state: open.claimed_from,
        }
        .to_string());
    }
    let mut calls: Vec<(&str, Option<&str>, &str)> = Vec::new();
    for e in &done {
        let dest = destinations.get(&e.destination).ok_or_else(|| {
            format!(
                "effect {key} (id {}) went to destination {:?}, which no --compensate or [effects.destinations] defines",
                e.id, e.destination
            )
        })?;
        let template = dest.compensate_url.as_deref().ok_or_else(|| {
            format!(
                "destination {:?} has no compensation request (compensate_url)",
                e.destination
            )
        })?;
        let reference = e.reference.as_deref().unwrap_or_default();
        let request = if template.contains("{reference}") && reference.is_empty() {
            "refused: the request names {reference} and the destination gave this effect none"
                .to_owned()
        } else {
            let at = (
                e.destination.as_str(),
                e.reference.as_deref(),
                e.external_ref.as_str(),
            );
            if calls.contains(&at) {
                "the request above (same destination and reference)".to_owned()
            } else {
                calls.push(at);
                format!("DELETE {}", redact_url(template))
            }
        };
        outln!(
            "would compensate id={} destination={} reference={} external_ref={}: {request}",
            e.id,
            e.destination.escape_debug(),
            if reference.is_empty() {
                "-".to_owned()
            } else {
                reference.escape_debug().to_string()
            },
            e.external_ref.escape_debug()
        );
    }
    outln!(
        "dry run: {} done effect(s) of key {key}, {} request(s); nothing sent, nothing changed",
        done.len(),
        calls.len()
    );
    Ok(())
}

/// Prints every effect with the key of `args`, oldest first: one, except on the partitioned PostgreSQL layout,
/// where a re-send in another bucket of event time records its effects again under the same keys. None is
/// said on stderr and answered `Ok(false)` (nothing found, exit 1).
pub async fn show<S: EffectStore>(store: S, args: &ShowArgs) -> Result<bool, String> {
    let effects = store
        .find_effects(&args.key)
        .await
        .map_err(|e| e.to_string())?;
    if effects.is_empty() {
        crate::out::errln!("no effect has the key {}", args.key.escape_debug());
        return Ok(false);
    }
    outln!(
        "{:>10} {:<20} {:<16} {:<32} {:<24} reference",
        "id",
        "destination",
        "state",
        "created",
        "message"
    );
    for e in &effects {
        outln!(
            "{:>10} {:<20} {:<16} {:<32} {:<24} {}",
            e.id,
            e.destination.escape_debug().to_string(),
            e.claimed_from.to_string(),
            e.created_at.to_rfc3339(),
            e.message_id.escape_debug().to_string(),
            e.reference
                .as_deref()
                .map(|r| r.escape_debug().to_string())
                .unwrap_or_else(|| "-".to_owned())
        );
    }
    Ok(true)
}

/// Prints the effects of `store` by consumer, destination and state. Done effects without a reference from the
/// destination are shown on a row of their own (`done_without_reference`), apart from the uncertain ones.
pub async fn stats<S: EffectStore>(store: S) -> Result<(), String> {
    let mut counts = store.effect_counts().await.map_err(|e| e.to_string())?;
    outln!(
        "{:<24} {:<20} {:<24} {:>8}  oldest",
        "consumer",
        "destination",
        "state",
        "effects"
    );
    counts.sort_by(|a, b| {
        (&a.consumer, &a.destination, a.state).cmp(&(&b.consumer, &b.destination, b.state))
    });
    for c in counts {
        let oldest = c.oldest.map(|t| t.to_rfc3339()).unwrap_or_default();
        let with_reference = if c.state == EffectState::Done {
            c.count - c.without_reference
        } else {
            c.count
        };
        outln!(
            "{:<24} {:<20} {:<24} {:>8}  {oldest}",
            c.consumer,
            c.destination,
            c.state,
            with_reference
        );
        if c.state == EffectState::Done && c.without_reference > 0 {
            outln!(
                "{:<24} {:<20} {:<24} {:>8}",
                c.consumer,
                c.destination,
                "done_without_reference",
                c.without_reference
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::testing::SettingsFile;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Run {
        #[command(flatten)]
        args: super::RunArgs,
    }

    #[derive(clap::Parser)]
    struct Compensate {
        #[command(flatten)]
        args: super::CompensateArgs,
    }

    #[test]
    fn debug_of_the_arguments_masks_passwords_query_values_and_header_values() {
        let run = Run::try_parse_from([
            "run",
            "--store",
            "postgres://crm:s3cretpw@db/crm",
            "--http",
            "crm=https://u:s3cretweb@crm.example/v1/tasks?api_key=s3cretkey",
            "--confirm",
            "crm=https://crm.example/v1/tasks/{key}?token=s3cretconfirm",
            "--header",
            "crm=Authorization=Bearer s3cretbearer",
        ])
        .unwrap();
        let shown = format!("{:?}", run.args);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://crm:***@db/crm"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
        let compensate = Compensate::try_parse_from([
            "compensate",
            "--store",
            "postgres://crm:s3cretpw@db/crm",
            "--key",
            "k1",
            "--compensate",
            "crm=https://crm.example/v1/tasks/{reference}?api_key=s3cretkey",
        ])
        .unwrap();
        let shown = format!("{:?}", compensate.args);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("k1"), "{shown}");
        let compensate = Compensate::try_parse_from([
            "compensate",
            "--store",
            "sqlite:fx.db",
            "--key",
            "k1",
            "--compensate",
            "crm=https://crm.example/v1/tasks/{reference}",
            "--header",
            "crm=Authorization=Bearer s3cretbearer",
        ])
        .unwrap();
        let shown = format!("{:?}", compensate.args);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("Authorization=***"), "{shown}");
    }

    /// A compensation goes to the destination as the runner knows it: the settings file's
    /// `compensate_url`, key and headers, or the flags' (`--key-in`, `--header`). It was built from
    /// `--compensate` alone, so it sent no authentication header (a real API answers 401) and its key in
    /// `Idempotency-Key` whatever header the destination deduplicates on.
    #[test]
    fn a_compensation_takes_the_destinations_key_and_headers_from_the_file_or_the_flags() {
        let file = SettingsFile::new(
            "[effects.destinations.crm]\nurl = \"https://crm.example/v1/tasks\"\nkey = \"header:X-Request-Id\"\ncompensate_url = \"https://crm.example/v1/tasks/{reference}\"\n[effects.destinations.crm.headers]\nAuthorization = \"env:CRM_TOKEN\"\n",
        );
        let from_file = Compensate::try_parse_from([
            "compensate",
            "--store",
            "sqlite:fx.db",
            "--key",
            "k1",
            "--config",
            file.path().to_str().unwrap(),
        ])
        .unwrap();
        let d = from_file.args.destinations().unwrap();
        let crm = &d["crm"];
        assert_eq!(crm.key.as_deref(), Some("header:X-Request-Id"));
        assert_eq!(crm.headers["Authorization"], "env:CRM_TOKEN");
        assert_eq!(
            crm.compensate_url.as_deref(),
            Some("https://crm.example/v1/tasks/{reference}")
        );
        let from_flags = Compensate::try_parse_from([
            "compensate",
            "--store",
            "sqlite:fx.db",
            "--key",
            "k1",
            "--compensate",
            "mail=https://mail.example/v1/messages/{reference}",
            "--key-in",
            "mail=header:PayPal-Request-Id",
            "--header",
            "mail=Authorization=env:MAIL_TOKEN",
            "--html-answers",
            "mail",
        ])
        .unwrap();
        let d = from_flags.args.destinations().unwrap();
        let mail = &d["mail"];
        assert_eq!(mail.key.as_deref(), Some("header:PayPal-Request-Id"));
        assert_eq!(mail.headers["Authorization"], "env:MAIL_TOKEN");
        assert!(mail.html_answers);
        // Each builds as the runner builds it.
        for (name, dest) in &d {
            txinbox_core::http::HttpEffect::from_settings(name, dest, |_| Some("t".into()))
                .unwrap();
        }
        let unknown = Compensate::try_parse_from([
            "compensate",
            "--store",
            "sqlite:fx.db",
            "--key",
            "k1",
            "--compensate",
            "mail=https://mail.example/v1/messages/{reference}",
            "--header",
            "crm=Authorization=x",
        ])
        .unwrap();
        let err = unknown.args.destinations().unwrap_err();
        assert!(err.contains("--header names \"crm\""), "{err}");
        assert!(Compensate::try_parse_from([
            "compensate",
            "--store",
            "sqlite:fx.db",
            "--key",
            "k1"
        ])
        .is_err());
    }

    /// `effects compensate` on the partitioned PostgreSQL layout, a key whose re-send (another bucket of event
    /// time) recorded its effect again and that second row is still pending: the command undid the done row and
    /// left the pending one, which then ran and did again what the operator had undone (on the row-by-row
    /// layout the key has one row, and a pending one is refused). The run and its dry run now refuse the key,
    /// naming the row, and nothing changes.
    #[tokio::test]
    async fn a_key_with_an_unfinished_re_send_is_refused_on_the_partitioned_layout() {
        let crate::testing::PgSchema {
            schema,
            admin,
            store,
            ..
        } = crate::testing::PgSchema::new().await;
        let _ = store
            .partition(&txinbox_store::PartitionOptions::new())
            .await
            .unwrap();
        let pending: i64 = sqlx::query_scalar("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at, finished_at, result_reference) VALUES ('c', 'm', 'k-open', 'crm', 'crm', '\\x00', '{}', 'k-open', 'done', now() - interval '5 minutes', now() - interval '5 minutes', now(), now(), 'task-1'), ('c', 'm', 'k-open', 'crm', 'crm', '\\x00', '{}', 'k-open', 'pending', now(), now(), now(), NULL, NULL) RETURNING id")
            .fetch_all(store.pool())
            .await
            .unwrap()
            .into_iter()
            .max()
            .unwrap();
        let args = |dry: &[&str]| {
            let mut argv = vec![
                "compensate",
                "--store",
                "postgres://unused",
                "--key",
                "k-open",
                "--compensate",
                "crm=http://127.0.0.1:9/v1/tasks/{reference}",
            ];
            argv.extend_from_slice(dry);
            Compensate::try_parse_from(argv).unwrap().args
        };
        let dry = super::compensate(store.clone(), &args(&["--dry-run"])).await;
        let run = super::compensate(store.clone(), &args(&[])).await;
        let states: Result<Vec<String>, _> =
            sqlx::query_scalar("SELECT state FROM txinbox_effects ORDER BY id")
                .fetch_all(store.pool())
                .await;
        store.close().await;
        crate::testing::PgSchema::drop_schema(&schema, admin).await;
        for (what, answer) in [("dry run", dry), ("run", run)] {
            let err = answer.expect_err(what);
            assert!(
                err.contains(&format!("id {pending}, pending")) && !err.contains('\n'),
                "{what}: {err}"
            );
        }
        assert_eq!(states.unwrap(), ["done", "pending"], "nothing changed");
    }
}
