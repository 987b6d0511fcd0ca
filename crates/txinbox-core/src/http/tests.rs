//! The builder refuses a rule that cannot work; the settings say the same as the builder.

use std::collections::BTreeMap;

use super::*;
use crate::settings::{ConfirmSettings, HttpDestinationSettings};

fn err(b: HttpEffectBuilder) -> String {
    b.build().expect_err("a rule that cannot work").to_string()
}

#[test]
fn a_rule_that_cannot_work_is_refused_with_one_line_naming_it() {
    let url = "https://crm.example/v1/tasks";
    assert!(err(HttpEffect::post("crm.example/v1/tasks")).contains("call URL"));
    assert!(
        err(HttpEffect::post(url).confirm_url("https://crm.example/v1/tasks"))
            .contains("neither {key} nor {external_ref}")
    );
    assert!(err(
        HttpEffect::post(url).confirm_url("https://crm.example/v1/tasks?ref={externalref}")
    )
    .contains("{externalref}"));
    assert!(err(HttpEffect::post(url).reference("id")).contains("JSON pointer"));
    assert!(err(HttpEffect::post(url).confirm(
        Confirm::search("https://crm.example/v1/tasks?r={external_ref}").found_at("data/0/id")
    ))
    .contains("found_at"));
    assert!(err(HttpEffect::post(url)
        .confirm(Confirm::search("https://crm.example/v1/tasks?r={external_ref}").found_at("")))
    .contains("found_at"));
    assert!(err(HttpEffect::post(url).confirm(Confirm::search_post(
        "https://api.hubapi.com/crm/v3/objects/tasks/search",
        r#"{"filterGroups":[{"filters":[{"value":{external_ref}}]}]}"#
    )))
    .contains("not JSON"));
    assert!(err(HttpEffect::post(url)
        .key(Key::none())
        .confirm_url("https://crm.example/v1/tasks?idempotency_key={key}"))
    .contains("keeps no key"));
    assert!(err(HttpEffect::upsert("https://crm.example/v1/tasks")).contains("upsert URL"));
    assert!(err(
        HttpEffect::upsert("https://crm.example/v1/tasks/{external_ref}")
            .confirm_url("https://crm.example/v1/tasks/{external_ref}")
    )
    .contains("takes no confirmation"));
    assert!(err(HttpEffect::post(url).method("GET")).contains("sends a body"));
    // Pages read as answers where every answer needs a JSON reference and nothing is compensated: no change.
    assert!(err(HttpEffect::post(url).html_answers()).contains(
        "needs a reference from a JSON answer and has no compensation URL: it would change nothing"
    ));
    assert!(err(HttpEffect::post(url).key(Key::header("Bad Header"))).contains("Bad Header"));
    // A header's value is never shown.
    let e = err(HttpEffect::post(url).header("Authorization", "Bearer s3cret\n"));
    assert!(e.contains("Authorization") && !e.contains("s3cret"), "{e}");
    // A URL's user info and query values are never shown.
    let e = err(HttpEffect::post(url).confirm_url("https://user:pw@crm.example/t?api_key=s3cret"));
    assert!(!e.contains("s3cret") && !e.contains("pw"), "{e}");
    assert_eq!(e.lines().count(), 1);
}

#[test]
fn the_usual_shapes_build() {
    let url = "https://crm.example/v1/tasks";
    HttpEffect::post(url).build().unwrap();
    HttpEffect::post(url)
        .key(Key::header("PayPal-Request-Id"))
        .confirm(Confirm::search(
            "https://crm.example/v1/tasks?external_ref={external_ref}",
        ))
        .build()
        .unwrap();
    HttpEffect::post(url)
        .key(Key::body_field("idempotency_key"))
        .confirm(
            Confirm::search_post(
                "https://api.hubapi.com/crm/v3/objects/tasks/search",
                r#"{"filterGroups":[{"filters":[{"propertyName":"external_ref","operator":"EQ","value":"{external_ref}"}]}]}"#,
            )
            .count_at("/total")
            .found_at("/results/0/id"),
        )
        .build()
        .unwrap();
    HttpEffect::upsert(
        "https://x.my.salesforce.com/services/data/v60.0/sobjects/Task/Ext__c/{external_ref}",
    )
    .method("PATCH")
    .build()
    .unwrap();
}

#[test]
fn the_settings_say_what_the_builder_says() {
    let env = |v: &str| (v == "CRM_TOKEN").then(|| "t0ken".to_owned());
    let mut s = HttpDestinationSettings {
        url: "https://crm.example/v1/tasks".into(),
        key: Some("header:Idempotency-Key".into()),
        key_kept_seconds: Some(3600),
        headers: BTreeMap::from([("Authorization".into(), "env:CRM_TOKEN".into())]),
        answers: BTreeMap::from([
            ("409".into(), "in_progress".into()),
            ("5xx".into(), "uncertain".into()),
        ]),
        confirm: Some(ConfirmSettings {
            url: "https://crm.example/v1/tasks?external_ref={external_ref}".into(),
            rule: Some("search".into()),
            found_at: Some("/data/0/id".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = HttpEffect::from_settings("crm", &s, env).unwrap();
    assert_eq!(e.key.kept_for, std::time::Duration::from_secs(3600));
    assert_eq!(e.answers.get(503), Answer::Uncertain);
    assert_eq!(e.answers.get(409), Answer::InProgress);
    assert!(!e.html_answers);

    let line = |s: &HttpDestinationSettings| {
        HttpEffect::from_settings("crm", s, env)
            .expect_err("refused")
            .to_string()
    };
    s.headers.insert("X-Other".into(), "env:MISSING".into());
    assert_eq!(
        line(&s),
        "effects destination \"crm\": header X-Other: the environment variable MISSING is not set"
    );
    s.headers.remove("X-Other");
    s.answers.insert("4xx".into(), "maybe".into());
    assert!(line(&s).contains("answers.4xx"));
    s.answers.remove("4xx");
    s.key = Some("query:k".into());
    assert!(line(&s).contains("key \"query:k\""));
    s.key = Some("none".into());
    s.confirm.as_mut().unwrap().url = "https://crm.example/v1/tasks".into();
    assert!(
        line(&s).contains("neither {key} nor {external_ref}"),
        "{}",
        line(&s)
    );
    s.confirm.as_mut().unwrap().url = "https://crm.example/v1/tasks?r={external_ref}".into();
    s.confirm.as_mut().unwrap().rule = Some("lookup".into());
    s.confirm.as_mut().unwrap().count_at = Some("/total".into());
    assert!(line(&s).contains("count_at"));
    s.confirm.as_mut().unwrap().count_at = None;
    s.confirm.as_mut().unwrap().found_at = Some("id".into());
    assert!(line(&s).contains("found_at"));
    s.confirm = None;
    s.key = None;
    s.key_kept_seconds = None;
    s.html_answers = true;
    assert!(line(&s).contains("would change nothing"), "{}", line(&s));
    s.reference_optional = true;
    assert!(
        HttpEffect::from_settings("crm", &s, env)
            .unwrap()
            .html_answers
    );
    s.url = String::new();
    assert!(line(&s).contains("url is required"));
}

#[test]
fn a_reference_is_found_in_a_payload_only_as_a_whole_token() {
    let p = br#"{"amount":120,"ref":"12","note":"see ab-7 and x12y"}"#;
    assert!(carries_token(p, b"12"), "a whole string value");
    assert!(carries_token(p, b"ab-7"), "a token inside text");
    assert!(!carries_token(p, b"se"), "the start of a longer word");
    assert!(!carries_token(p, b"mount"), "the end of a longer word");
    assert!(
        !carries_token(br#"{"amount":120}"#, b"12"),
        "inside a number"
    );
    assert!(!carries_token(br#"{"n":"x12y"}"#, b"12"), "inside a word");
    assert!(
        carries_token(br#"{"n":"-7"}"#, b"-7"),
        "a reference that starts with punctuation"
    );
    assert!(
        carries_token(br#"{"n":"a-7"}"#, b"-7"),
        "punctuation is its own boundary"
    );
    assert!(!carries_token(b"", b"12"));
    assert!(
        !carries_token(p, b""),
        "an empty reference is never carried"
    );
}

#[test]
fn debug_of_the_effect_its_builder_and_its_confirmation_masks_secrets() {
    let confirm = Confirm::lookup(
        "https://u:s3cretconfirmpw@crm.example/v1/tasks/{key}?api_key=s3cretconfirm",
    );
    let builder = HttpEffect::post("https://u:s3cretpw@crm.example/v1/tasks?api_key=s3cretkey")
        .confirm(confirm.clone())
        .header("Authorization", "Bearer s3cretbearer")
        .compensate_url("https://crm.example/v1/tasks/{reference}?api_key=s3cretcompensate");
    let effect = builder.clone().build().unwrap();
    for shown in [
        format!("{confirm:?}"),
        format!("{builder:?}"),
        format!("{effect:?}"),
    ] {
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("crm.example/v1/***"), "{shown}");
    }
    assert!(format!("{builder:?}").contains("Authorization"));
}

// `{reference}` is the destination's reference of a done effect: only a compensation knows it. In a call URL,
// an upsert URL or a confirmation it was filled with nothing (`GET /v1/tasks/?r=...`, a lookup of the
// collection, whose 404 reads as "not found": a call again), or left as is in a confirmation body.
#[test]
fn only_a_compensation_names_the_reference() {
    let url = "https://crm.example/v1/tasks";
    assert!(err(HttpEffect::post(
        "https://crm.example/v1/tasks/{reference}/notes"
    ))
    .contains("{reference}"));
    assert!(err(HttpEffect::upsert(
        "https://crm.example/v1/tasks/{external_ref}/{reference}"
    ))
    .contains("{reference}"));
    assert!(err(HttpEffect::post(url)
        .confirm_url("https://crm.example/v1/tasks/{reference}?external_ref={external_ref}"))
    .contains("{reference}"));
    assert!(err(HttpEffect::post(url).confirm(Confirm::search_post(
        "https://crm.example/v1/tasks/search",
        r#"{"ref":"{external_ref}","id":"{reference}"}"#
    )))
    .contains("{reference}"));
    HttpEffect::post(url)
        .compensate_url("https://crm.example/v1/tasks/{reference}")
        .build()
        .unwrap();
}

// A status out of HTTP's range (`.answer(4, ..)` meant for the 4xx class, `.answer(4090, ..)`) or a class that
// is none (`.answer_class(42, ..)`) matched no answer, and the rule was silently never applied.
#[test]
fn an_answer_for_a_status_http_has_not_is_refused() {
    let url = "https://crm.example/v1/tasks";
    for e in [
        err(HttpEffect::post(url).answer(4, Answer::Uncertain)),
        err(HttpEffect::post(url).answer(4090, Answer::Uncertain)),
        err(HttpEffect::post(url).answer_class(42, Answer::Uncertain)),
    ] {
        assert!(e.contains("100 to 599") || e.contains("1xx to 5xx"), "{e}");
    }
    HttpEffect::post(url)
        .answer(599, Answer::Uncertain)
        .answer_class(4, Answer::Uncertain)
        .build()
        .unwrap();
}

// An unknown placeholder in a confirmation's POST-search body (`{externalref}`) passed when the URL or the body
// named a known one elsewhere: it was sent as it is, the search found nothing ("not found": a call again). Every
// template the builder takes refuses an unknown `{name}`; a JSON body's own braces are no placeholders. A header
// value is sent as it is: a placeholder there is refused, naming the header, never showing its value.
#[test]
fn an_unknown_placeholder_is_refused_in_every_template() {
    let url = "https://crm.example/v1/tasks";
    let search = "https://crm.example/v1/tasks/search";
    for (body, typo) in [
        (
            r#"{"ref":"{external_ref}","other":"{externalref}"}"#,
            "{externalref}",
        ),
        (
            r#"{"filters":[{"value":"{externalRef}"}],"key":"{key}"}"#,
            "{externalRef}",
        ),
        (
            r#"{"q":"ref:{external-ref}","k":"{key}"}"#,
            "{external-ref}",
        ),
    ] {
        let e = HttpEffect::post(url)
            .confirm(Confirm::search_post(search, body))
            .build()
            .expect_err(body);
        assert!(
            matches!(&e, HttpConfigError::Placeholder { what: "confirmation body", placeholder } if placeholder == typo),
            "{body}: {e:?}"
        );
    }
    // The URL names {external_ref}; the body's typo is still refused.
    let e = err(HttpEffect::post(url).confirm(Confirm::search_post(
        "https://crm.example/v1/tasks/search?by={external_ref}",
        r#"{"ref":"{externalref}"}"#,
    )));
    assert!(e.contains("{externalref}"), "{e}");
    for bad in [
        "https://crm.example/v1/tasks/{refernce}",
        "https://crm.example/v1/tasks/{reference}?k={kye}",
    ] {
        let e = err(HttpEffect::post(url).compensate_url(bad));
        assert!(e.contains("compensation URL") && e.contains('{'), "{e}");
    }
    for value in ["{key}", "Bearer {token}", "ref-{external_ref}"] {
        let e = HttpEffect::post(url)
            .header("X-Secretish", value)
            .build()
            .expect_err(value);
        assert!(
            matches!(&e, HttpConfigError::Header { name, .. } if name == "X-Secretish"),
            "{e:?}"
        );
        let shown = e.to_string();
        assert!(
            !shown.contains(value) && shown.contains("X-Secretish"),
            "{shown}"
        );
    }
    // JSON's own braces, a GraphQL query's, and a brace written as an escape are no placeholders.
    for body in [
        r#"{"filterGroups":[{"filters":[{"propertyName":"external_ref","operator":"EQ","value":"{external_ref}"}]}]}"#,
        r#"{"query":{"filter":{"reference_id":{"exact":"{external_ref}"}}},"x":{}}"#,
        r#"{"query":"{ tasks(ref: \"{external_ref}\") { id } }"}"#,
        r#"{"ref":"{external_ref}","literal":"\u007bname}"}"#,
    ] {
        HttpEffect::post(url)
            .confirm(Confirm::search_post(search, body))
            .build()
            .unwrap_or_else(|e| panic!("{body}: {e}"));
    }
    HttpEffect::post(url)
        .header("Authorization", "Bearer abc{def")
        .header("X-Json", r#"{"a":1}"#)
        .build()
        .unwrap();
}
