//! Injected faults over HTTP: status, headers (`Retry-After` in seconds and as a date) and
//! whether the request was performed; their order; random faults; the binary's flags.

mod common;

use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{answer, get, post_legacy, post_v1, upsert};
use reqwest::StatusCode;
use serde_json::{json, Value};
use txinbox_crm_api::{CrmApi, FaultRates};
use txinbox_testkit::child::Running;

async fn start() -> CrmApi {
    CrmApi::builder().start().await.expect("the CRM API starts")
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) to Unix seconds.
fn parse_http_date(date: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let rest = date.strip_suffix(" GMT")?;
    let (_weekday, rest) = rest.split_once(", ")?;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time] = parts[..] else {
        return None;
    };
    let day: i64 = day.parse().ok()?;
    let month = MONTHS.iter().position(|m| *m == month)? as i64 + 1;
    let year: i64 = year.parse().ok()?;
    let hms: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms[..] else { return None };
    // days_from_civil (Howard Hinnant).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3_600 + m * 60 + s).ok()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[test]
fn the_test_date_parser_is_right() {
    assert_eq!(
        parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(784_111_777)
    );
}

#[tokio::test]
async fn a_gateway_502_forwards_nothing_and_records_no_key() {
    let api = start().await;
    let http = reqwest::Client::new();
    api.gateway_502_next(1);
    let body = json!({"external_ref": "g2"});
    let bad_gateway = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(bad_gateway.status, StatusCode::BAD_GATEWAY);
    assert!(bad_gateway.json["error"].is_string());
    assert_eq!(bad_gateway.retry_after(), None);
    assert_eq!((api.creates(), api.attempts()), (0, 1));
    // The key was never seen: the retry creates.
    let retry = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(api.creates_for_key("k"), 1);
}

#[tokio::test]
async fn a_gateway_504_performs_and_loses_the_answer() {
    let api = start().await;
    let http = reqwest::Client::new();
    api.gateway_504_next(2);
    let body = json!({"external_ref": "g4"});
    let timeout = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(timeout.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(api.creates_for_ref("g4"), 1);
    let put = upsert(&http, &api, "g4-up", &json!({})).await.unwrap();
    assert_eq!(put.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(api.creates_for_ref("g4-up"), 1);
    let retry = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed());
    assert_eq!(api.creates(), 2);
}

#[tokio::test]
async fn unavailable_and_rate_limited_carry_retry_after_and_perform_nothing() {
    let api = start().await;
    let http = reqwest::Client::new();
    let body = json!({"external_ref": "ra"});

    api.unavailable_next(1);
    let unavailable = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(unavailable.retry_after().as_deref(), Some("1"));

    api.set_retry_after(5, false);
    api.rate_limit_next(1);
    let limited = post_legacy(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.retry_after().as_deref(), Some("5"));
    assert!(limited.json["error"].is_string());

    api.set_retry_after(3, true);
    api.rate_limit_next(1);
    let before = unix_now();
    let dated = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    let after = unix_now();
    assert_eq!(dated.status, StatusCode::TOO_MANY_REQUESTS);
    let date = dated.retry_after().expect("a Retry-After");
    let at = parse_http_date(&date).unwrap_or_else(|| panic!("not an HTTP-date: {date:?}"));
    assert!(
        (before + 3..=after + 4).contains(&at),
        "{date} is not 3 s ahead of {before}..{after}"
    );

    // fail_before: 503 without Retry-After.
    api.fail_next(1);
    let failed = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.retry_after(), None);

    assert_eq!((api.creates(), api.attempts()), (0, 4));
    let created = post_v1(&http, &api, Some("k"), &body).await.unwrap();
    assert_eq!(created.status, StatusCode::CREATED);
}

#[tokio::test]
async fn faults_armed_over_http_are_consumed_in_order() {
    let api = start().await;
    let http = reqwest::Client::new();
    let arm = json!({"fail_before": 1, "unavailable": 1, "rate_limited": 1, "gateway_502": 1,
        "gateway_504": 1, "drop_answer": 1, "retry_after_secs": 2});
    let faults_url = format!("{}/_faults", api.url());
    let armed = answer(http.post(&faults_url).json(&arm)).await.unwrap();
    assert_eq!(armed.status, StatusCode::OK);
    assert_eq!(armed.json, arm);

    let mut seen = Vec::new();
    for n in 0..7 {
        let body = json!({"external_ref": format!("r{n}")});
        match post_v1(&http, &api, None, &body).await {
            Ok(a) => seen.push((Some(a.status.as_u16()), a.retry_after())),
            Err(_) => seen.push((None, None)),
        }
    }
    let two = Some("2".to_string());
    assert_eq!(
        seen,
        [
            (Some(503), None),
            (Some(503), two.clone()),
            (Some(429), two),
            (Some(502), None),
            (Some(504), None),
            (None, None), // dropped
            (Some(201), None),
        ]
    );
    // Performed: the 504, the dropped one and the last.
    let performed: Vec<usize> = (0..7)
        .map(|n| api.creates_for_ref(&format!("r{n}")))
        .collect();
    assert_eq!(performed, [0, 0, 0, 0, 1, 1, 1]);
    let left = get(&http, faults_url.clone()).await;
    assert_eq!(
        left.json,
        json!({"drop_answer": 0, "fail_before": 0, "retry_after_secs": 2})
    );

    for bad in [
        json!({"gateway_502": -1}),
        json!({"random": {"drop_answer": 1.5}}),
        json!({"random": {"drop_answer": 0.6, "unavailable": 0.6}}),
        json!({"random": {"dropped": 0.1}}),
        json!({"retry_after_date": "yes"}),
    ] {
        let refused = answer(http.post(&faults_url).json(&bad)).await.unwrap();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// The outcome of each of `n` creates: a status, or 0 for a dropped answer.
async fn outcomes(api: &CrmApi, n: usize) -> Vec<u16> {
    let http = reqwest::Client::new();
    let mut seen = Vec::new();
    for i in 0..n {
        let body = json!({"external_ref": format!("x{i}")});
        let status = match post_v1(&http, api, Some(&format!("k{i}")), &body).await {
            Ok(a) => a.status.as_u16(),
            Err(_) => 0,
        };
        seen.push(status);
    }
    seen
}

#[tokio::test]
async fn random_faults_are_deterministic_for_a_seed() {
    let rates = FaultRates {
        drop_answer: 0.15,
        gateway_502: 0.15,
        gateway_504: 0.15,
        unavailable: 0.1,
        rate_limited: 0.1,
    };
    let start_with = |seed| async move {
        CrmApi::builder()
            .random_faults(rates, seed)
            .start()
            .await
            .expect("the CRM API starts")
    };
    let a = outcomes(&start_with(7).await, 40).await;
    let b = outcomes(&start_with(7).await, 40).await;
    assert_eq!(a, b);
    for status in [0, 201, 502, 504, 503, 429] {
        assert!(a.contains(&status), "no {status} in {a:?}");
    }
    let other = outcomes(&start_with(8).await, 40).await;
    assert_ne!(a, other);

    // The same over HTTP; a counted fault goes before the random draw (which it does not use).
    let api = start().await;
    let http = reqwest::Client::new();
    let armed = answer(
        http.post(format!("{}/_faults", api.url()))
            .json(&json!({"random": rates, "seed": 7})),
    )
    .await
    .unwrap();
    assert_eq!(armed.json["random"], serde_json::to_value(rates).unwrap());
    assert_eq!(armed.json["seed"], 7);
    assert_eq!(outcomes(&api, 40).await, a);
    let mut expected = vec![503];
    expected.extend(&a[..10]);
    let fresh = start().await;
    fresh.set_random_faults(rates, 7).expect("valid rates");
    fresh.fail_next(1);
    assert_eq!(outcomes(&fresh, 11).await, expected);

    let invalid = FaultRates {
        rate_limited: 2.0,
        ..FaultRates::default()
    };
    assert!(api.set_random_faults(invalid, 1).is_err());
    let refused = CrmApi::builder().random_faults(invalid, 1).start().await;
    assert!(
        matches!(refused, Err(txinbox_crm_api::Error::InvalidFaultRates(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn the_binary_takes_the_new_flags() {
    let mut running = Running::spawn(
        Command::new(env!("CARGO_BIN_EXE_txinbox-crm-api"))
            .args([
                "--key",
                "body:idempotency_key",
                "--processing-ms",
                "10",
                "--search-lag-ms",
                "0",
                "--random-faults",
                "rate_limited=1",
                "--seed",
                "3",
                "--retry-after-secs",
                "7",
            ])
            .env("RUST_LOG", "warn"),
    );
    let url = running.first_line_after("export TXINBOX_CRM_URL=").await;
    let http = reqwest::Client::new();
    let limited = answer(
        http.post(format!("{url}/v1/tasks"))
            .json(&json!({"idempotency_key": "b"})),
    )
    .await
    .unwrap();
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.retry_after().as_deref(), Some("7"));
    let faults = answer(http.get(format!("{url}/_faults"))).await.unwrap();
    assert_eq!(faults.json["seed"], Value::from(3));

    let conflicting = Command::new(env!("CARGO_BIN_EXE_txinbox-crm-api"))
        .args(["--no-idempotency", "--key", "none"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the binary runs");
    assert!(!conflicting.success());
    let bad_key = Command::new(env!("CARGO_BIN_EXE_txinbox-crm-api"))
        .args(["--key", "cookie:x"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the binary runs");
    assert!(!bad_key.success());
}
