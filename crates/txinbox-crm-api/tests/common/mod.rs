//! Helpers shared by the integration tests: real HTTP with reqwest.

#![allow(dead_code)]

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;
use txinbox_crm_api::CrmApi;

/// An answer: status, headers and the body parsed as JSON (`Null` when it is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub bytes: Vec<u8>,
    pub json: Value,
}

impl Answer {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn retry_after(&self) -> Option<String> {
        self.headers
            .get("retry-after")
            .map(|v| v.to_str().expect("ASCII").to_string())
    }
}

pub async fn answer(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await?.to_vec();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer {
        status,
        headers,
        bytes,
        json,
    })
}

/// `POST /v1/tasks` with an optional `Idempotency-Key`.
pub async fn post_v1(
    http: &reqwest::Client,
    api: &CrmApi,
    key: Option<&str>,
    body: &Value,
) -> Result<Answer, reqwest::Error> {
    let mut request = http.post(format!("{}/v1/tasks", api.url())).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    answer(request).await
}

/// `POST /tasks` with an optional `Idempotency-Key`.
pub async fn post_legacy(
    http: &reqwest::Client,
    api: &CrmApi,
    key: Option<&str>,
    body: &Value,
) -> Result<Answer, reqwest::Error> {
    let mut request = http.post(format!("{}/tasks", api.url())).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    answer(request).await
}

/// `PUT /v1/tasks/by_ref/{reference}`.
pub async fn upsert(
    http: &reqwest::Client,
    api: &CrmApi,
    reference: &str,
    body: &Value,
) -> Result<Answer, reqwest::Error> {
    let url = format!("{}/v1/tasks/by_ref/{reference}", api.url());
    answer(http.put(url).json(body)).await
}

/// `GET /v1/tasks?external_ref=R`.
pub async fn list_by_ref(http: &reqwest::Client, api: &CrmApi, reference: &str) -> Answer {
    let request = http
        .get(format!("{}/v1/tasks", api.url()))
        .query(&[("external_ref", reference)]);
    answer(request).await.expect("an answer")
}

/// `POST /v1/tasks/search` for one `external_ref`.
pub async fn search_by_ref(http: &reqwest::Client, api: &CrmApi, reference: &str) -> Answer {
    let body = serde_json::json!({"filterGroups": [{"filters": [
        {"propertyName": "external_ref", "operator": "EQ", "value": reference}
    ]}]});
    let request = http
        .post(format!("{}/v1/tasks/search", api.url()))
        .json(&body);
    answer(request).await.expect("an answer")
}

pub async fn get(http: &reqwest::Client, url: String) -> Answer {
    answer(http.get(url)).await.expect("an answer")
}
