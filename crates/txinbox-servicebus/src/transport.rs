//! The HTTP client handed to the crate: it points requests at the configured endpoint (the crate builds every
//! URL on `https://NS.servicebus.windows.net`), signs each with a SAS for the URL it then goes to (see
//! [`sas_token`]) or swaps in an Azure AD bearer token,
//! bounds every request in time (the crate sets no timeout), moves a received message's `BrokerProperties`
//! out of the crate's reach (see [`set_broker_properties_aside`]), and keeps the `Retry-After` of a settle's
//! or a send's error answer (see [`keep_retry_after`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::{AccessToken, Secret, TokenCredential};
use azure_core::error::ErrorKind;
use azure_core::headers::AUTHORIZATION;
use azure_core::{HttpClient, Request, Response, Url};

use crate::error::{ForeignHost, RequestTimedOut, ServiceRetryAfter};
use crate::wire;

/// How the transport authorizes requests.
pub(crate) enum Auth {
    /// Replace the crate's SAS, made for the public host, with one for the URL the request goes to.
    Sas {
        /// The rule's name.
        key_name: String,
        /// The rule's key, base64-encoded (as `azure_core::hmac::hmac_sha256` takes it: it decodes it back to
        /// the key string's bytes).
        signing_key: Secret,
    },
    /// Replace it with a bearer token.
    Bearer {
        credential: Arc<dyn TokenCredential>,
        /// The Azure AD scope the token is asked for: the namespace's cloud's.
        scope: String,
        cached: tokio::sync::Mutex<Option<AccessToken>>,
    },
}

impl Auth {
    /// A shared access rule: `key` is the rule's key as the portal shows it.
    pub(crate) fn sas(key_name: String, key: &Secret) -> Self {
        Auth::Sas {
            key_name,
            signing_key: Secret::new(azure_core::base64::encode(key.secret())),
        }
    }

    pub(crate) fn bearer(credential: Arc<dyn TokenCredential>, scope: String) -> Self {
        Auth::Bearer {
            credential,
            scope,
            cached: tokio::sync::Mutex::new(None),
        }
    }
}

/// Tokens are refreshed this long before they expire.
const TOKEN_REFRESH_MARGIN_SECS: i64 = 300;

pub(crate) struct Transport {
    inner: Arc<dyn HttpClient>,
    public_host: String,
    endpoint: Option<Url>,
    auth: Auth,
    request_timeout: Duration,
    receive_grace: Duration,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("public_host", &self.public_host)
            .field(
                "endpoint",
                &self.endpoint.as_ref().map(crate::config::shown_endpoint),
            )
            .field(
                "auth",
                &match self.auth {
                    Auth::Sas { .. } => "sas",
                    Auth::Bearer { .. } => "bearer",
                },
            )
            .finish_non_exhaustive()
    }
}

impl Transport {
    pub(crate) fn new(
        inner: Arc<dyn HttpClient>,
        public_host: String,
        endpoint: Option<Url>,
        auth: Auth,
        request_timeout: Duration,
        receive_grace: Duration,
    ) -> Self {
        Self {
            inner,
            public_host,
            endpoint,
            auth,
            request_timeout,
            receive_grace,
        }
    }

    /// The time a request may take: a long poll (`…/messages/head?timeout=N`) gets N seconds plus the grace.
    fn budget(&self, url: &Url) -> Duration {
        if url.path().to_ascii_lowercase().ends_with("/messages/head") {
            let wait = url
                .query_pairs()
                .find(|(k, _)| k.eq_ignore_ascii_case("timeout"))
                .and_then(|(_, v)| v.parse::<u64>().ok())
                // Without `timeout` the service picks its own wait (the emulator: 60 s).
                .unwrap_or(60);
            Duration::from_secs(wait) + self.receive_grace
        } else {
            self.request_timeout
        }
    }

    /// Whether `url` names the namespace: its public host over HTTPS (any scheme when an endpoint is set, which
    /// the URL is then rewritten to), or the configured endpoint's host and port. A lock URI is the service's
    /// `Location` header, used as it comes; a request to any other host would carry our credential there.
    fn is_namespace(&self, url: &Url) -> bool {
        let Some(host) = url.host_str() else {
            return false;
        };
        if host.eq_ignore_ascii_case(&self.public_host) {
            return self.endpoint.is_some() || url.scheme() == "https";
        }
        self.endpoint.as_ref().is_some_and(|e| {
            e.scheme() == url.scheme()
                && e.host_str().is_some_and(|h| h.eq_ignore_ascii_case(host))
                && e.port_or_known_default() == url.port_or_known_default()
        })
    }

    fn rewrite(&self, url: &mut Url) -> azure_core::Result<()> {
        let Some(endpoint) = &self.endpoint else {
            return Ok(());
        };
        if !url
            .host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case(&self.public_host))
        {
            return Ok(());
        }
        let fail = || {
            azure_core::Error::message(ErrorKind::Other, "cannot point the request at the endpoint")
        };
        url.set_scheme(endpoint.scheme()).map_err(|_| fail())?;
        url.set_host(endpoint.host_str()).map_err(|_| fail())?;
        url.set_port(endpoint.port()).map_err(|_| fail())?;
        Ok(())
    }

    async fn bearer(&self) -> azure_core::Result<Option<String>> {
        let Auth::Bearer {
            credential,
            scope,
            cached,
        } = &self.auth
        else {
            return Ok(None);
        };
        let mut cached = cached.lock().await;
        let now = chrono::Utc::now().timestamp();
        let fresh = cached
            .as_ref()
            .is_some_and(|t| t.expires_on.unix_timestamp() - TOKEN_REFRESH_MARGIN_SECS > now);
        if !fresh {
            // Within the request's own budget: a token endpoint that does not answer would otherwise hold
            // every request (renewals, settlements, receives) behind this lock for ever.
            let token = tokio::time::timeout(
                self.request_timeout,
                credential.get_token(&[scope.as_str()]),
            )
            .await
            .map_err(|_| {
                azure_core::Error::full(
                    ErrorKind::Credential,
                    RequestTimedOut(self.request_timeout),
                    "the Azure AD token for Service Bus did not come in time",
                )
            })?
            .map_err(|e| {
                azure_core::Error::full(
                    ErrorKind::Credential,
                    e,
                    "cannot get an Azure AD token for Service Bus",
                )
            })?;
            *cached = Some(token);
        }
        Ok(cached
            .as_ref()
            .map(|t| format!("Bearer {}", t.token.secret())))
    }
}

#[async_trait::async_trait]
impl HttpClient for Transport {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        let mut request = request.clone();
        let budget = self.budget(request.url());
        let keeps_retry_after = is_lock_uri(request.url())
            || (*request.method() == azure_core::Method::Post && is_send_uri(request.url()));
        if !self.is_namespace(request.url()) {
            let url = request.url();
            let host = format!(
                "{}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or_default(),
                url.port().map(|p| format!(":{p}")).unwrap_or_default()
            );
            return Err(azure_core::Error::new(
                ErrorKind::Other,
                ForeignHost { host },
            ));
        }
        self.rewrite(request.url_mut())?;
        ascii_broker_properties(&mut request);
        if let Auth::Sas {
            key_name,
            signing_key,
        } = &self.auth
        {
            let sas = sas_token(request.url(), key_name, signing_key, chrono::Utc::now())?;
            request.insert_header(AUTHORIZATION, sas);
        }
        if let Some(bearer) = self.bearer().await? {
            // Headers are keyed by lower-case name, so this replaces the crate's SAS.
            request.insert_header(AUTHORIZATION, bearer);
        }
        match tokio::time::timeout(budget, self.inner.execute_request(&request)).await {
            Ok(r) => {
                let r = r.map(set_broker_properties_aside);
                if keeps_retry_after {
                    r.and_then(keep_retry_after)
                } else {
                    r
                }
            }
            Err(_) => Err(azure_core::Error::new(
                ErrorKind::Io,
                RequestTimedOut(budget),
            )),
        }
    }
}

/// Writes a request's `BrokerProperties` in visible ASCII: every non-ASCII character of the JSON (the crate
/// serializes a Label, CorrelationId, SessionId, MessageId... as raw UTF-8) becomes its `\uXXXX` escape, a
/// surrogate pair outside the Basic Multilingual Plane. RFC 8259, section 7: the string grammar's escape
/// `%x75 4HEXDIG ) ; uXXXX U+XXXX`, and "To escape an extended character that is not in the Basic Multilingual
/// Plane, the character is represented as a 12-character sequence, encoding the UTF-16 surrogate pair." The
/// JSON means the same, so the service reads the same values; raw UTF-8 in a header is what RFC 7230, section
/// 3.2.4 tells senders not to write ("Newly defined header fields SHOULD limit their field values to US-ASCII
/// octets. A recipient SHOULD treat other octets in field content (obs-text) as opaque data."): a recipient may
/// read those bytes as ISO-8859-1 and store `réunion` as `rÃ©union`. Non-ASCII only occurs inside JSON strings
/// (the structure and its whitespace are ASCII), so escaping it character by character keeps the document valid.
fn ascii_broker_properties(request: &mut Request) {
    let name = azure_core::headers::HeaderName::from_static("brokerproperties");
    let Some(value) = request.headers().get_optional_str(&name) else {
        return;
    };
    if value.is_ascii() {
        return;
    }
    let escaped = json_ascii(value);
    request.insert_header(name, escaped);
}

/// `text` with every non-ASCII character written `\uXXXX` (UTF-16 code units, so two escapes outside the
/// Basic Multilingual Plane).
pub(crate) fn json_ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// The rustls `reqwest` client the adapter builds, run as `azure_core`'s own `reqwest` backend runs it, except
/// for the response headers: `azure_core` 0.21 drops, with a warning, every header whose value is not visible
/// ASCII, so a custom property another producer sent as raw UTF-8 (`site: "Zürich"`), or a `BrokerProperties`
/// holding raw UTF-8, vanished from the received message without a trace (its MessageId with it). RFC 7230,
/// section 3.2.4: "A recipient SHOULD treat other octets in field content (obs-text) as opaque data." Here a
/// value is kept whatever its bytes: read as UTF-8 when it is, else as ISO-8859-1 ("Historically, HTTP has
/// allowed field content with text in the ISO-8859-1 charset"), one character per byte, so nothing is dropped.
pub(crate) struct ReqwestClient(pub(crate) reqwest::Client);

impl fmt::Debug for ReqwestClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReqwestClient")
    }
}

#[async_trait::async_trait]
impl HttpClient for ReqwestClient {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        use futures::TryStreamExt;
        let method = reqwest::Method::from_bytes(request.method().as_ref().as_bytes())
            .map_err(|e| azure_core::Error::new(ErrorKind::DataConversion, e))?;
        let mut req = self.0.request(method, request.url().clone());
        for (name, value) in request.headers().iter() {
            req = req.header(name.as_str(), value.as_str());
        }
        let req = match request.body().clone() {
            azure_core::Body::Bytes(bytes) => req.body(bytes),
            azure_core::Body::SeekableStream(stream) => {
                req.body(reqwest::Body::wrap_stream(stream))
            }
        }
        .build()
        .map_err(|e| azure_core::Error::full(ErrorKind::Other, e, "cannot build the request"))?;
        let rsp = self
            .0
            .execute(req)
            .await
            .map_err(|e| azure_core::Error::full(ErrorKind::Io, e, "the request failed"))?;
        let status = azure_core::StatusCode::try_from(rsp.status().as_u16()).map_err(|_| {
            azure_core::Error::message(ErrorKind::DataConversion, "an HTTP status out of range")
        })?;
        let mut headers = azure_core::headers::Headers::new();
        for (name, value) in rsp.headers() {
            headers.insert(name.as_str().to_owned(), header_text(value.as_bytes()));
        }
        let body = Box::pin(rsp.bytes_stream().map_err(|e| {
            azure_core::Error::full(ErrorKind::Io, e, "the answer's body could not be read")
        }));
        Ok(Response::new(status, headers, body))
    }
}

/// A header value as text: UTF-8 when its bytes are, else ISO-8859-1 (each byte the character of its code).
pub(crate) fn header_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// How long a SAS is valid, as the crate makes them (one hour).
const SAS_LIFETIME_SECS: i64 = 3600;

/// A SAS for a request to `url`, valid for [`SAS_LIFETIME_SECS`] from `now`: `sr` is the URL, form-urlencoded
/// (upper-case hex, as the crate encodes it), `sig` the HMAC-SHA256, with the key string's bytes, of `sr`, a
/// newline and the expiry. Microsoft, *Service Bus access control with Shared Access Signatures*: "This token
/// consists of the resource URI being accessed, and an expiry signed with the configured key." The crate signs
/// `https://NS.servicebus.windows.net/…`, which is not the resource a sovereign cloud's namespace (or any
/// endpoint override) is accessed at, so the token is made again once the URL is the one the request goes to.
fn sas_token(
    url: &Url,
    key_name: &str,
    signing_key: &Secret,
    now: chrono::DateTime<chrono::Utc>,
) -> azure_core::Result<String> {
    let sr = form_urlencode(url.as_str());
    let se = now.timestamp() + SAS_LIFETIME_SECS;
    let sig = azure_core::hmac::hmac_sha256(&format!("{sr}\n{se}"), signing_key)?;
    Ok(format!(
        "SharedAccessSignature sr={sr}&sig={}&se={se}&skn={key_name}",
        form_urlencode(&sig)
    ))
}

/// `application/x-www-form-urlencoded` byte serialization (what `url::form_urlencoded::byte_serialize` makes):
/// ASCII letters, digits and `*-._` as they are, a space as `+`, every other byte `%XX` in upper-case hex.
fn form_urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Whether the request goes to a message's lock URI (`…/messages/{sequence number}/{lock token}`): a
/// complete, abandon or lock renewal, whose answer the crate checks itself.
fn is_lock_uri(url: &Url) -> bool {
    let mut segments = url.path().trim_end_matches('/').rsplit('/');
    let (_token, sequence, messages) = (segments.next(), segments.next(), segments.next());
    sequence.is_some_and(|s| s.parse::<u64>().is_ok())
        && messages.is_some_and(|m| m.eq_ignore_ascii_case("messages"))
}

/// Whether the request goes to an entity's send URI (`…/messages`), whose answer the crate checks itself.
fn is_send_uri(url: &Url) -> bool {
    url.path()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .is_some_and(|last| last.eq_ignore_ascii_case("messages"))
}

/// Turns an error answer on a lock URI (or a send's) that carries `Retry-After` into the error the crate would make of it
/// (an `HttpResponse` of its status), with the wait as its source ([`ServiceRetryAfter`]): the crate's status
/// check keeps only the status and drops the headers, so without this a throttled settle is retried after
/// the adapter's own backoff, not after the wait the service asked for.
fn keep_retry_after(response: Response) -> azure_core::Result<Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let Some(after) = response
        .headers()
        .get_optional_str(&azure_core::headers::RETRY_AFTER)
        .and_then(wire::retry_after_value)
    else {
        return Ok(response);
    };
    Err(azure_core::Error::new(
        ErrorKind::http_response(status, None),
        ServiceRetryAfter {
            status: u16::from(status),
            after,
        },
    ))
}

/// Renames a response's `BrokerProperties` header to [`wire::RAW_BROKER_PROPERTIES`]. The crate parses
/// `BrokerProperties` into a struct of narrow, required fields (`EnqueuedSequenceNumber` as an `i32`,
/// `LockToken`, `State`, `TimeToLive` required) and fails the whole peek-lock when one does not fit, leaving
/// the message locked and counting a delivery each time until the broker dead-letters it. Microsoft types
/// `EnqueuedSequenceNumber` as a `long`: "For messages that have been auto-forwarded, this property reflects
/// the sequence number that had first been assigned to the message at its original point of submission." Out
/// of the crate's reach the header is read only by [`wire::received_message`], with optional, wide types; the
/// crate needs nothing from it to settle (the lock URI is `Location`).
fn set_broker_properties_aside(response: Response) -> Response {
    let has = response
        .headers()
        .iter()
        .any(|(n, _)| n.as_str().eq_ignore_ascii_case("brokerproperties"));
    if !has {
        return response;
    }
    let (status, headers, body) = response.deconstruct();
    let mut out = azure_core::headers::Headers::new();
    for (name, value) in headers.iter() {
        if name.as_str().eq_ignore_ascii_case("brokerproperties") {
            out.insert(wire::RAW_BROKER_PROPERTIES, value.clone());
        } else {
            out.insert(name.clone(), value.clone());
        }
    }
    Response::new(status, out, Box::pin(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Never;

    #[async_trait::async_trait]
    impl HttpClient for Never {
        async fn execute_request(&self, _: &Request) -> azure_core::Result<Response> {
            std::future::pending().await
        }
    }

    fn transport(endpoint: Option<&str>) -> Transport {
        Transport::new(
            Arc::new(Never),
            "ns.servicebus.windows.net".into(),
            endpoint.map(|e| Url::parse(e).unwrap()),
            Auth::sas("listen".into(), &Secret::new("c2VjcmV0")),
            Duration::from_millis(50),
            Duration::from_secs(10),
        )
    }

    #[test]
    fn long_polls_get_their_wait_plus_grace() {
        let t = transport(None);
        let u = Url::parse("https://ns.servicebus.windows.net/q/messages/head?timeout=20").unwrap();
        assert_eq!(t.budget(&u), Duration::from_secs(30));
        let u = Url::parse("https://ns.servicebus.windows.net/q/messages/3/tok").unwrap();
        assert_eq!(t.budget(&u), Duration::from_millis(50));
    }

    #[test]
    fn lock_uris_are_told_from_receives_and_sends() {
        let u = |p: &str| Url::parse(&format!("https://ns.servicebus.windows.net{p}")).unwrap();
        assert!(is_lock_uri(&u(
            "/q/messages/3/7da9cfd5-40d5-4bb1-8d64-ec5a52e1c547"
        )));
        assert!(is_lock_uri(&u(
            "/t/subscriptions/s/messages/3/tok?timeout=5"
        )));
        assert!(!is_lock_uri(&u("/q/messages/head?timeout=20")));
        assert!(!is_lock_uri(&u("/q/messages")));
        assert!(!is_lock_uri(&u("/q/messages/head/x")));
        assert!(is_send_uri(&u("/q/messages")));
        assert!(is_send_uri(&u("/t/messages/")));
        assert!(!is_send_uri(&u("/q/messages/head?timeout=20")));
        assert!(!is_send_uri(&u("/q/messages/3/tok")));
    }

    #[test]
    fn only_the_namespace_host_is_rewritten() {
        let t = transport(Some("http://127.0.0.1:5380"));
        let mut u = Url::parse("https://ns.servicebus.windows.net/q/messages/3/tok").unwrap();
        t.rewrite(&mut u).unwrap();
        assert_eq!(u.as_str(), "http://127.0.0.1:5380/q/messages/3/tok");
        let mut other = Url::parse("https://elsewhere.example/x").unwrap();
        t.rewrite(&mut other).unwrap();
        assert_eq!(other.as_str(), "https://elsewhere.example/x");
    }

    /// A credential whose token never comes (a workload identity endpoint that hangs).
    #[derive(Debug)]
    struct Hangs;

    #[async_trait::async_trait]
    impl TokenCredential for Hangs {
        async fn get_token(&self, _: &[&str]) -> azure_core::Result<AccessToken> {
            std::future::pending().await
        }
        async fn clear_cache(&self) -> azure_core::Result<()> {
            Ok(())
        }
    }

    /// The token is fetched within the request's budget: a hanging token endpoint fails the request (and
    /// releases the token's lock for the next one) instead of holding every request behind it.
    #[tokio::test]
    async fn a_token_that_never_comes_fails_the_request_in_its_budget() {
        let t = Transport::new(
            Arc::new(Never),
            "ns.servicebus.windows.net".into(),
            None,
            Auth::bearer(Arc::new(Hangs), crate::config::SERVICE_BUS_SCOPE.into()),
            Duration::from_millis(50),
            Duration::from_secs(10),
        );
        let req = Request::new(
            Url::parse("https://ns.servicebus.windows.net/q/messages/3/tok").unwrap(),
            azure_core::Method::Delete,
        );
        for _ in 0..2 {
            let e = t.execute_request(&req).await.unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Credential);
        }
    }

    /// Records each request's URL and `Authorization`, and answers 200.
    #[derive(Debug, Default)]
    struct Records(std::sync::Mutex<Vec<(String, Option<String>)>>);

    #[async_trait::async_trait]
    impl HttpClient for Records {
        async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
            let auth = request.headers().get_optional_string(&AUTHORIZATION);
            self.0
                .lock()
                .unwrap()
                .push((request.url().to_string(), auth));
            Ok(Response::new(
                azure_core::StatusCode::Ok,
                azure_core::headers::Headers::new(),
                Box::pin(futures::stream::empty()),
            ))
        }
    }

    #[derive(Debug)]
    struct Token;

    #[async_trait::async_trait]
    impl TokenCredential for Token {
        async fn get_token(&self, _: &[&str]) -> azure_core::Result<AccessToken> {
            Ok(AccessToken::new(
                "entra-token",
                azure_core::date::parse_rfc3339("2099-01-01T00:00:00Z")?,
            ))
        }
        async fn clear_cache(&self) -> azure_core::Result<()> {
            Ok(())
        }
    }

    /// A lock URI is the service's `Location` header, used as it comes: one naming another host (or plain
    /// HTTP) is never sent, so neither the Azure AD token (good for every namespace the identity may use) nor a
    /// SAS leaves for it. The namespace's host over HTTPS, and the configured endpoint, are sent to.
    #[tokio::test]
    async fn requests_go_to_the_namespace_only() {
        let records = Arc::new(Records::default());
        let bearer = |endpoint: Option<&str>| {
            Transport::new(
                records.clone(),
                "ns.servicebus.windows.net".into(),
                endpoint.map(|e| Url::parse(e).unwrap()),
                Auth::bearer(Arc::new(Token), crate::config::SERVICE_BUS_SCOPE.into()),
                Duration::from_secs(5),
                Duration::from_secs(10),
            )
        };
        let delete = |url: &str| Request::new(Url::parse(url).unwrap(), azure_core::Method::Delete);
        let t = bearer(None);
        t.execute_request(&delete(
            "https://ns.servicebus.windows.net/q/messages/3/tok",
        ))
        .await
        .expect("the namespace is sent to");
        for foreign in [
            "https://elsewhere.example/q/messages/3/tok",
            "https://ns.servicebus.windows.net.elsewhere.example/q/messages/3/tok",
            "http://ns.servicebus.windows.net/q/messages/3/tok",
        ] {
            let e = t.execute_request(&delete(foreign)).await.unwrap_err();
            assert!(
                e.downcast_ref::<ForeignHost>().is_some(),
                "{foreign}: {e:?}"
            );
        }
        let t = bearer(Some("http://127.0.0.1:5380"));
        t.execute_request(&delete(
            "https://ns.servicebus.windows.net/q/messages/3/tok",
        ))
        .await
        .expect("rewritten to the endpoint");
        t.execute_request(&delete("http://127.0.0.1:5380/q/messages/3/tok"))
            .await
            .expect("the endpoint itself is sent to");
        let e = t
            .execute_request(&delete("http://127.0.0.1:5381/q/messages/3/tok"))
            .await
            .unwrap_err();
        assert!(e.downcast_ref::<ForeignHost>().is_some(), "{e:?}");
        let sent = records.0.lock().unwrap().clone();
        assert_eq!(
            sent.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(),
            [
                "https://ns.servicebus.windows.net/q/messages/3/tok",
                "http://127.0.0.1:5380/q/messages/3/tok",
                "http://127.0.0.1:5380/q/messages/3/tok",
            ]
        );
        assert!(sent
            .iter()
            .all(|(_, a)| a.as_deref() == Some("Bearer entra-token")));
    }

    /// The value of `name` in a SAS token (`sr=…&sig=…&se=…&skn=…`), form-urldecoded.
    fn sas_field(token: &str, name: &str) -> String {
        let raw = token
            .trim_start_matches("SharedAccessSignature ")
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in the token"));
        let bytes = raw.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' => {
                    out.push(u8::from_str_radix(&raw[i + 1..i + 3], 16).unwrap());
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).unwrap()
    }

    /// A SAS names the resource the request goes to, not the public host the crate builds every URL with:
    /// a namespace in a sovereign cloud (its connection string's `Endpoint`, or an endpoint override) is sent
    /// a token signed for its own host. Microsoft, *Service Bus access control with Shared Access
    /// Signatures*: "This token consists of the resource URI being accessed, and an expiry signed with the
    /// configured key."; `sr` is the "URI of the resource being accessed".
    #[tokio::test]
    async fn a_sas_is_signed_for_the_host_the_request_goes_to() {
        let records = Arc::new(Records::default());
        let key = "c2VjcmV0LWtleQ==";
        let client = crate::ServiceBusConfig::from_connection_string(&format!(
            "Endpoint=sb://gov.servicebus.usgovcloudapi.net/;SharedAccessKeyName=listen;SharedAccessKey={key}"
        ))
        .unwrap()
        .http_client(records.clone())
        .connect()
        .unwrap();
        let mut receiver =
            crate::ServiceBusReceiver::new(&client, "orders", crate::ServiceBusOptions::default())
                .unwrap();
        // The double answers 200 without a lock URI: the receive fails, the request was sent.
        let _ = receiver.receive_one(Duration::from_secs(5)).await;
        let sent = records.0.lock().unwrap().clone();
        let (url, auth) = sent.first().expect("a request");
        assert_eq!(
            url,
            "https://gov.servicebus.usgovcloudapi.net/orders/messages/head?timeout=5"
        );
        let auth = auth.as_deref().expect("an Authorization header");
        assert_eq!(sas_field(auth, "sr"), *url);
        assert_eq!(sas_field(auth, "skn"), "listen");
        // HMAC-SHA256 with the key string's bytes over the URL-encoded resource, a newline and the expiry.
        let raw_sr = auth
            .split(['&', ' '])
            .find_map(|kv| kv.strip_prefix("sr="))
            .unwrap();
        let se = sas_field(auth, "se");
        let expected = azure_core::hmac::hmac_sha256(
            &format!("{raw_sr}\n{se}"),
            &azure_core::auth::Secret::new(azure_core::base64::encode(key)),
        )
        .unwrap();
        assert_eq!(sas_field(auth, "sig"), expected);
        let expiry = se.parse::<i64>().unwrap() - chrono::Utc::now().timestamp();
        assert!((3000..=3600).contains(&expiry), "expires in {expiry} s");
    }

    /// Records each request's `BrokerProperties` and answers 201 (a send's answer).
    #[derive(Debug, Default)]
    struct SentProperties(std::sync::Mutex<Vec<Option<String>>>);

    #[async_trait::async_trait]
    impl HttpClient for SentProperties {
        async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
            let name = azure_core::headers::HeaderName::from_static("brokerproperties");
            self.0
                .lock()
                .unwrap()
                .push(request.headers().get_optional_string(&name));
            Ok(Response::new(
                azure_core::StatusCode::Created,
                azure_core::headers::Headers::new(),
                Box::pin(futures::stream::empty()),
            ))
        }
    }

    /// A Label, MessageId or SessionId with non-ASCII characters goes out as JSON escapes, in visible ASCII
    /// (RFC 7230, 3.2.4: "Newly defined header fields SHOULD limit their field values to US-ASCII octets."),
    /// and reads back as the same values (RFC 8259, 7: `%x75 4HEXDIG ) ; uXXXX U+XXXX`, a surrogate pair
    /// outside the Basic Multilingual Plane): nothing for a recipient reading the bytes as ISO-8859-1 to mangle.
    #[tokio::test]
    async fn broker_properties_are_sent_in_ascii_and_mean_the_same() {
        let records = Arc::new(SentProperties::default());
        let client = crate::ServiceBusConfig::shared_access_key("ns", "send", "c2VjcmV0")
            .http_client(records.clone())
            .connect()
            .unwrap();
        let msg = txinbox_core::OutboxMessage {
            destination: "orders".into(),
            source: "crm".into(),
            message_id: "evt-zürich-日本".into(),
            event_type: "réunion.terminée 🎉".into(),
            group_id: Some("opp-ü".into()),
            body: b"{}".to_vec(),
            attributes: Default::default(),
        };
        crate::ServiceBusPublisher::new(client)
            .send(&msg)
            .await
            .expect("sent");
        let sent = records.0.lock().unwrap().clone();
        let raw = sent[0].clone().expect("a BrokerProperties header");
        assert!(
            raw.bytes().all(|b| (0x20..0x7f).contains(&b)),
            "not visible ASCII: {raw}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(parsed["MessageId"], "evt-zürich-日本");
        assert_eq!(parsed["Label"], "réunion.terminée 🎉");
        assert_eq!(parsed["SessionId"], "opp-ü");
        assert!(raw.contains("\\ud83c\\udf89"), "a surrogate pair: {raw}");
    }

    /// A response header that is not visible ASCII is kept: UTF-8 as UTF-8, other bytes one character each
    /// (ISO-8859-1), never dropped.
    #[test]
    fn header_values_are_read_whatever_their_bytes() {
        assert_eq!(header_text(b"\"High\""), "\"High\"");
        assert_eq!(header_text("\"Zürich 日本\"".as_bytes()), "\"Zürich 日本\"");
        assert_eq!(header_text(b"caf\xe9"), "café");
        assert_eq!(json_ascii("é日🎉\"x"), "\\u00e9\\u65e5\\ud83c\\udf89\"x");
    }

    #[tokio::test]
    async fn a_request_without_answer_times_out_as_io() {
        let t = transport(None);
        let req = Request::new(
            Url::parse("https://ns.servicebus.windows.net/q/messages/3/tok").unwrap(),
            azure_core::Method::Delete,
        );
        let e = t.execute_request(&req).await.unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Io);
        assert!(e.downcast_ref::<RequestTimedOut>().is_some());
    }
}
