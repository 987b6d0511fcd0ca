//! A call answered 2xx whose body reports an error: what the effect reads from it.

use tokio::io::AsyncWriteExt;

use super::wire_tests::effect;
use super::*;
use crate::effects::EffectState;

/// A destination on loopback answering every request `status` with the JSON `body`.
async fn answering(status: &'static str, body: &'static str) -> String {
    let (url, _) = super::wire_tests::destination(move |_, mut conn| async move {
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.write_all(reply.as_bytes()).await;
    })
    .await;
    url
}

// GraphQL answers a failed mutation 200 (Dgraph: "All responses, including errors, always return HTTP 200 OK status
// codes"; the spec: "If an error was raised during the execution that prevented a valid response, the data entry in
// the response should be null"), and Slack's Web API answers 200 `{"ok": false, "error": ...}` ("Callers should
// always check the value of the ok params in the response"; its `internal_error`: "It's possible some aspect of the
// operation succeeded before the error was raised"). At a destination whose 2xx may carry no reference
// (`reference_optional`), or an upsert (done with its path), such an answer was read as done. It says neither that
// the destination acted nor that it did not: uncertain, reconciled.
#[tokio::test]
async fn a_2xx_that_reports_an_error_without_its_reference_is_not_done() {
    for body in [
        r#"{"data":null,"errors":[{"message":"Cannot create task: upstream timeout","path":["createTask"]}]}"#,
        r#"{"ok":false,"error":"internal_error"}"#,
    ] {
        let url = answering("200 OK", body).await;
        for (what, builder) in [
            (
                "optional reference",
                HttpEffect::post(format!("{url}/graphql"))
                    .reference("/data/createTask/id")
                    .reference_optional(),
            ),
            (
                "upsert",
                HttpEffect::upsert(format!("{url}/v1/tasks/{{external_ref}}")),
            ),
        ] {
            let x = builder.build().unwrap();
            match x.execute(&effect()).await {
                Execution::Uncertain { error } => {
                    let error = error.to_string();
                    assert!(error.contains("answered 200"), "{what}: {error}");
                }
                other => panic!("{what}, {body}: read as {other:?}"),
            }
        }
    }
    // The reference beside an error (GraphQL's partial result: the object was created) is done; an empty
    // `errors` or a null `error` is no error.
    for (body, reference) in [
        (
            r#"{"data":{"createTask":{"id":"t-7"}},"errors":[{"message":"owner not resolved"}]}"#,
            Some("t-7"),
        ),
        (r#"{"data":{"createTask":null},"errors":[]}"#, None),
        (r#"{"ok":true,"error":null}"#, None),
    ] {
        let url = answering("200 OK", body).await;
        let x = HttpEffect::post(format!("{url}/graphql"))
            .reference("/data/createTask/id")
            .reference_optional()
            .build()
            .unwrap();
        match x.execute(&effect()).await {
            Execution::Done { reference: r } => assert_eq!(r.as_deref(), reference, "{body}"),
            other => panic!("{body}: read as {other:?}"),
        }
    }
}

// The same answer to a compensation's DELETE (a GraphQL `deleteTask` mutation's endpoint refusing it, Slack's
// `chat.delete` answering `{"ok": false, "error": "cant_delete_message"}`) was read as undone: the effect was marked
// compensated while the destination still held what it did. It is refused now, the answer kept as evidence; a 2xx
// without an error (a 204, an empty `errors`) and a 404 (already gone) still undo.
#[tokio::test]
async fn a_compensation_answered_2xx_with_an_error_is_not_undone() {
    let mut done = effect();
    done.claimed_from = EffectState::Done;
    done.reference = Some("t-7".into());
    for body in [
        r#"{"data":{"deleteTask":null},"errors":[{"message":"Not authorized to delete task t-7"}]}"#,
        r#"{"ok":false,"error":"cant_delete_message"}"#,
    ] {
        let url = answering("200 OK", body).await;
        let x = HttpEffect::post(format!("{url}/v1/tasks"))
            .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
            .build()
            .unwrap();
        let error = x.compensate(&done).await.expect_err(body).to_string();
        assert!(error.contains("answered 200"), "{error}");
    }
    for (status, body) in [
        (
            "200 OK",
            r#"{"data":{"deleteTask":{"id":"t-7"}},"errors":[]}"#,
        ),
        ("204 No Content", ""),
        ("404 Not Found", r#"{"error":"no such task"}"#),
    ] {
        let url = answering(status, body).await;
        let x = HttpEffect::post(format!("{url}/v1/tasks"))
            .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
            .build()
            .unwrap();
        assert!(x.compensate(&done).await.is_ok(), "{status} {body}");
    }
}

// JSON-RPC 2.0 (the transport of the Model Context Protocol's tool calls, and of many service APIs) answers a
// failed call 200 with an `error` member and the request's own `id`: "error: This member is REQUIRED on error.
// This member MUST NOT exist if there was no error triggered during invocation", and "id: [...] It MUST be the same
// as the value of the id member in the Request Object". At the default reference (`/id`) that `id` was read as the
// destination's reference: the failed call was done. MCP reports a tool's own failure inside a successful result:
// "Tool execution errors (including input validation errors, API failures, and business logic errors) should be
// reported inside the result object with IsError set to true, rather than as a JsonRpcError" (the MCP C# SDK's
// `CallToolResult`), read as done too. Neither says the destination acted, nor that it did not (an internal error,
// a tool's API failure midway): uncertain, reconciled; a confirmation answered so is unknown.
#[tokio::test]
async fn a_json_rpc_error_is_not_done_by_its_request_id() {
    for body in [
        r#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"Internal error"},"id":"7"}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"CRM API error: 502"}],"isError":true}}"#,
    ] {
        let url = answering("200 OK", body).await;
        for (what, builder) in [
            (
                "the default reference",
                HttpEffect::post(format!("{url}/mcp")),
            ),
            (
                "an optional reference",
                HttpEffect::post(format!("{url}/mcp")).reference_optional(),
            ),
        ] {
            match builder.build().unwrap().execute(&effect()).await {
                Execution::Uncertain { error } => {
                    let error = error.to_string();
                    assert!(error.contains("answered 200"), "{what}: {error}");
                }
                other => panic!("{what}, {body}: read as {other:?}"),
            }
        }
        // A lookup answered so found nothing: unknown, neither found nor not found.
        let x = HttpEffect::post(format!("{url}/mcp"))
            .confirm(Confirm::lookup(format!("{url}/mcp?ref={{external_ref}}")))
            .build()
            .unwrap();
        let mut uncertain = effect();
        uncertain.claimed_from = EffectState::Uncertain;
        uncertain.maybe_happened = true;
        match x.confirm(&uncertain).await {
            Confirmation::Unknown { .. } => {}
            other => panic!("confirmation, {body}: read as {other:?}"),
        }
    }
    // A compensation answered so undid nothing.
    let mut done = effect();
    done.claimed_from = EffectState::Done;
    done.reference = Some("t-7".into());
    let url = answering(
        "200 OK",
        r#"{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","text":"cannot delete t-7"}],"isError":true}}"#,
    )
    .await;
    let x = HttpEffect::post(format!("{url}/mcp"))
        .compensate_url(format!("{url}/mcp/{{reference}}"))
        .build()
        .unwrap();
    let error = x.compensate(&done).await.expect_err("isError").to_string();
    assert!(error.contains("isError"), "{error}");
    // A JSON-RPC success (a `result`, `isError` false or absent) is done; `/id` is the request's id, so declare
    // where the result carries the destination's reference.
    for (body, reference) in [
        (
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":false,"structuredContent":{"taskId":"t-9"}}}"#,
            "t-9",
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"result":{"structuredContent":{"taskId":"t-8"}}}"#,
            "t-8",
        ),
    ] {
        let url = answering("200 OK", body).await;
        let x = HttpEffect::post(format!("{url}/mcp"))
            .reference("/result/structuredContent/taskId")
            .build()
            .unwrap();
        match x.execute(&effect()).await {
            Execution::Done { reference: r } => assert_eq!(r.as_deref(), Some(reference), "{body}"),
            other => panic!("{body}: read as {other:?}"),
        }
    }
}
