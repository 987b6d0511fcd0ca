//! The `/v1` routes, shaped like public APIs: a Stripe-like create and list, a HubSpot-like search
//! and a Salesforce-like upsert by external id. They share the task store with `/tasks`.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::create::{self, parse_new_task, parse_object, Create};
use crate::server::{
    error_response, json_response, parse_query, read_body, refusal, Body, DropConnection, Refusal,
    Shared,
};
use crate::state::{v1_task, Route, Task};

/// The prefix of the upsert's path: `PUT /v1/tasks/by_ref/{external_ref}`.
pub(crate) const BY_REF: &str = "/v1/tasks/by_ref/";

/// `POST /v1/tasks`.
pub(crate) async fn post(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let (parts, body) = req.into_parts();
    let mode = shared.state().key_mode().clone();
    let create = match read_body(body).await {
        Ok(bytes) => match parse_new_task(&parts.headers, &bytes, &mode) {
            Ok(new) => Create::Post {
                route: Route::V1,
                new,
            },
            Err(refused) => Create::Refused(refused),
        },
        Err(refused) => Create::Refused(refused),
    };
    create::run(shared, create).await
}

/// `GET /v1/tasks[?external_ref=R][&idempotency_key=K]`: Stripe's list shape, an empty `data`
/// when nothing matches.
pub(crate) fn list(shared: &Shared, query: Option<&str>) -> Response<Body> {
    let params = match parse_query(query.unwrap_or("")) {
        Ok(params) => params,
        Err((status, message)) => return error_response(status, &message),
    };
    let state = shared.state();
    let data: Vec<Value> = state
        .searchable(Instant::now())
        .filter(|t| {
            params
                .external_ref
                .as_deref()
                .is_none_or(|r| t.external_ref.as_deref() == Some(r))
                && params
                    .key
                    .as_deref()
                    .is_none_or(|k| t.idempotency_key.as_deref() == Some(k))
        })
        .map(v1_task)
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "has_more": false}),
    )
}

/// `GET /v1/tasks/{id}`: never delayed by the search lag.
pub(crate) fn get(shared: &Shared, id: &str) -> Response<Body> {
    match shared.state().task(id) {
        Some(task) => json_response(StatusCode::OK, &v1_task(task)),
        None => error_response(StatusCode::NOT_FOUND, "not found"),
    }
}

/// `PUT /v1/tasks/by_ref/{external_ref}` (`raw_ref` still percent-encoded).
pub(crate) async fn upsert(
    shared: &Arc<Shared>,
    raw_ref: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let parsed = match read_body(req.into_body()).await {
        Ok(bytes) => parse_upsert(raw_ref, &bytes),
        Err(refused) => Err(refused),
    };
    let create = match parsed {
        Ok((external_ref, body)) => Create::Upsert { external_ref, body },
        Err(refused) => Create::Refused(refused),
    };
    create::run(shared, create).await
}

fn parse_upsert(raw_ref: &str, bytes: &[u8]) -> Result<(String, Value), Refusal> {
    let external_ref = percent_decode_str(raw_ref)
        .decode_utf8()
        .map_err(|_| refusal(StatusCode::BAD_REQUEST, "the path is not valid UTF-8"))?
        .into_owned();
    if external_ref.is_empty() {
        return Err(refusal(StatusCode::BAD_REQUEST, "empty external_ref"));
    }
    let object = parse_object(bytes)?;
    match object.get("external_ref") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if *s == external_ref => {}
        Some(_) => {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "the body's external_ref differs from the path's",
            ))
        }
    }
    Ok((external_ref, Value::Object(object)))
}

/// `POST /v1/tasks/search`: HubSpot's search shape.
pub(crate) async fn search(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let request = match read_body(req.into_body()).await {
        Ok(bytes) => parse_search(&bytes),
        Err(refused) => Err(refused),
    };
    let request = match request {
        Ok(request) => request,
        Err((status, message)) => return error_response(status, &message),
    };
    let state = shared.state();
    let matching: Vec<&Task> = state
        .searchable(Instant::now())
        .filter(|t| request.matches(t))
        .collect();
    let results: Vec<Value> = matching
        .iter()
        .take(request.limit.unwrap_or(usize::MAX))
        .map(|t| {
            json!({
                "id": t.id,
                "properties": {
                    "external_ref": t.external_ref,
                    "idempotency_key": t.idempotency_key,
                },
                "body": t.body,
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"total": matching.len(), "results": results}),
    )
}

/// The body of `POST /v1/tasks/search`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SearchRequest {
    /// ORed; an empty list matches every task.
    filter_groups: Vec<FilterGroup>,
    /// At most this many `results` (`total` counts them all).
    #[serde(default)]
    limit: Option<usize>,
    /// Accepted and ignored: both properties are always answered.
    #[serde(default, rename = "properties")]
    _properties: Option<Vec<String>>,
}

/// ANDed filters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterGroup {
    filters: Vec<Filter>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Filter {
    property_name: String,
    operator: String,
    value: String,
}

impl SearchRequest {
    fn matches(&self, task: &Task) -> bool {
        self.filter_groups.is_empty()
            || self.filter_groups.iter().any(|group| {
                group.filters.iter().all(|filter| {
                    let property = match filter.property_name.as_str() {
                        "external_ref" => &task.external_ref,
                        _ => &task.idempotency_key,
                    };
                    property.as_deref() == Some(filter.value.as_str())
                })
            })
    }
}

fn parse_search(bytes: &[u8]) -> Result<SearchRequest, Refusal> {
    let request: SearchRequest = serde_json::from_slice(bytes)
        .map_err(|e| refusal(StatusCode::BAD_REQUEST, format!("malformed search: {e}")))?;
    for group in &request.filter_groups {
        if group.filters.is_empty() {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "malformed search: a filter group without filters",
            ));
        }
        for filter in &group.filters {
            if !matches!(
                filter.property_name.as_str(),
                "external_ref" | "idempotency_key"
            ) {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "malformed search: unknown property {:?}",
                        filter.property_name
                    ),
                ));
            }
            if filter.operator != "EQ" {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "malformed search: unsupported operator {:?} (only EQ)",
                        filter.operator
                    ),
                ));
            }
        }
    }
    if request.limit == Some(0) {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "malformed search: limit must be at least 1",
        ));
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searches_are_strict() {
        let good = br#"{"filterGroups": [{"filters": [
            {"propertyName": "external_ref", "operator": "EQ", "value": "r"}]}], "limit": 5}"#;
        assert!(parse_search(good).is_ok());
        assert!(parse_search(br#"{"filterGroups": []}"#).is_ok());
        for bad in [
            &b"{}"[..],
            b"[]",
            br#"{"filterGroups": [{"filters": []}]}"#,
            br#"{"filterGroups": [{"filters": [{"propertyName": "name", "operator": "EQ", "value": "r"}]}]}"#,
            br#"{"filterGroups": [{"filters": [{"propertyName": "external_ref", "operator": "GT", "value": "r"}]}]}"#,
            br#"{"filterGroups": [{"filters": [{"propertyName": "external_ref", "operator": "EQ", "value": 1}]}]}"#,
            br#"{"filterGroups": [], "sorts": []}"#,
        ] {
            assert!(
                parse_search(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn upserts_take_the_reference_from_the_path() {
        let (r, body) = parse_upsert("order%207", br#"{"v": 1}"#).unwrap();
        assert_eq!((r.as_str(), body), ("order 7", json!({"v": 1})));
        assert!(parse_upsert("a", br#"{"external_ref": "a"}"#).is_ok());
        assert!(parse_upsert("a", br#"{"external_ref": "b"}"#).is_err());
        assert!(parse_upsert("", b"{}").is_err());
        assert!(parse_upsert("a", b"[]").is_err());
    }
}
