//! Helpers shared by the integration tests: an emulator with a SAS key, and a plain HTTP client
//! that signs requests the way Microsoft documents [doc SAS].

#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sha2::Sha256;
use txinbox_sb_emulator::{Emulator, EmulatorBuilder, EmulatorHandle};

pub const NAMESPACE: &str = "your-namespace";
pub const KEY_NAME: &str = "RootManageSharedAccessKey";
pub const KEY: &str = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";

/// An emulator with the test SAS rule.
pub async fn start() -> EmulatorHandle {
    start_with(Emulator::builder()).await
}

pub async fn start_with(builder: EmulatorBuilder) -> EmulatorHandle {
    builder
        .namespace(NAMESPACE)
        .sas_key(KEY_NAME, KEY)
        .start("127.0.0.1:0")
        .await
        .expect("emulator starts")
}

pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// `SharedAccessSignature sr=…&sig=…&se=…&skn=…`, signed over the URL-encoded resource [doc SAS].
pub fn sas_token(resource: &str, key_name: &str, key: &str, expiry: i64) -> String {
    let sr = utf8_percent_encode(resource, NON_ALPHANUMERIC).to_string();
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(format!("{sr}\n{expiry}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let sig = utf8_percent_encode(&sig, NON_ALPHANUMERIC).to_string();
    format!("SharedAccessSignature sr={sr}&sig={sig}&se={expiry}&skn={key_name}")
}

/// The public URL a client would sign for `path_and_query`.
pub fn public_url(path_and_query: &str) -> String {
    format!("https://{NAMESPACE}.servicebus.windows.net{path_and_query}")
}

/// A plain HTTP response, read fully.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `BrokerProperties` header as JSON.
    pub fn broker_properties(&self) -> Value {
        let raw = self
            .header("brokerproperties")
            .expect("BrokerProperties header");
        serde_json::from_str(raw).expect("BrokerProperties is JSON")
    }

    /// The path of the absolute lock URI in `Location`.
    pub fn lock_path(&self) -> String {
        let location = self.header("location").expect("Location header");
        let prefix = format!("https://{NAMESPACE}.servicebus.windows.net");
        location
            .strip_prefix(&prefix)
            .unwrap_or_else(|| {
                panic!("Location {location} is an absolute URL on the namespace host")
            })
            .to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {}", self.body))
    }
}

/// A client that signs every data-plane request with the test key.
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    pub fn new(emulator: &EmulatorHandle) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(90))
                .build()
                .expect("client builds"),
            base: emulator.base_url(),
        }
    }

    /// A request with a fresh SAS token over the full public URL, as the crate signs.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let token = sas_token(
            &public_url(path_and_query),
            KEY_NAME,
            KEY,
            now_unix() + 3600,
        );
        self.call_with_auth(method, path_and_query, Some(&token), headers, body)
            .await
    }

    pub async fn call_with_auth(
        &self,
        method: Method,
        path_and_query: &str,
        authorization: Option<&str>,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        self.try_call(method, path_and_query, authorization, headers, body)
            .await
            .expect("request succeeds at the HTTP level")
    }

    pub async fn try_call(
        &self,
        method: Method,
        path_and_query: &str,
        authorization: Option<&str>,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, reqwest::Error> {
        let mut request = self
            .http
            .request(method, format!("{}{path_and_query}", self.base))
            .body(body.to_string());
        if let Some(authorization) = authorization {
            request = request.header("Authorization", authorization);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.text().await?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// `POST /{queue}/messages` with a BrokerProperties header.
    pub async fn send(&self, queue: &str, body: &str, broker_properties: &str) -> Reply {
        self.call(
            Method::POST,
            &format!("/{queue}/messages"),
            &[
                ("BrokerProperties", broker_properties),
                ("Content-Type", "text/plain"),
            ],
            body,
        )
        .await
    }

    /// `POST /{queue}/messages/head?timeout=N`.
    pub async fn peek_lock(&self, queue: &str, timeout: u32) -> Reply {
        self.call(
            Method::POST,
            &format!("/{queue}/messages/head?timeout={timeout}"),
            &[],
            "",
        )
        .await
    }

    /// `GET /$emulator/queues/{queue}`.
    pub async fn state(&self, queue: &str) -> Value {
        self.admin(Method::GET, &format!("/$emulator/queues/{queue}"), "")
            .await
            .json()
    }

    /// A control-API call (no authentication).
    pub async fn admin(&self, method: Method, path: &str, body: &str) -> Reply {
        self.call_with_auth(
            method,
            path,
            None,
            &[("Content-Type", "application/json")],
            body,
        )
        .await
    }

    /// `PUT /$emulator/queues/{queue}`.
    pub async fn create_queue(&self, queue: &str, properties: &str) -> Reply {
        let reply = self
            .admin(
                Method::PUT,
                &format!("/$emulator/queues/{queue}"),
                properties,
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        reply
    }
}
