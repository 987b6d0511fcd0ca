//! Connection configuration: a SAS connection string or an Azure AD token credential, an optional endpoint
//! override (the emulator, sovereign clouds), request timeouts, and the HTTP client the crate runs on.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::{Secret, TokenCredential};
use azure_core::{HttpClient, Url};
use azure_messaging_servicebus::prelude::QueueClient;

use crate::error::ServiceBusError;
use crate::transport::{Auth, Transport};

/// The Azure AD scope of Service Bus's data plane in the public cloud (`*.servicebus.windows.net`). Microsoft,
/// *Authenticate and authorize an application with Microsoft Entra ID to access Azure Service Bus entities*:
/// "The resource name to request a token is `https://servicebus.azure.net`."
pub const SERVICE_BUS_SCOPE: &str = "https://servicebus.azure.net/.default";

/// The Azure AD scope of Service Bus in Azure China (`*.servicebus.chinacloudapi.cn`). Microsoft's page of that
/// cloud (docs.azure.cn, the same article): "The resource name to request a token is
/// `https://servicebus.chinacloudapi.cn`."
pub const SERVICE_BUS_SCOPE_CHINA: &str = "https://servicebus.chinacloudapi.cn/.default";

/// The Azure AD scope of Service Bus in Azure Government (`*.servicebus.usgovcloudapi.net`): the resource
/// identifier `https://servicebus.usgovcloudapi.net` of that cloud's Service Bus (the Azure SDKs' environment
/// tables give it so; Microsoft's REST reference names the cloud's host, "United States government:
/// namespaceName.servicebus.usgovcloudapi.net").
pub const SERVICE_BUS_SCOPE_US_GOVERNMENT: &str = "https://servicebus.usgovcloudapi.net/.default";

/// The DNS suffixes of Service Bus namespaces by cloud, with the Azure AD scope of each.
const CLOUDS: &[(&str, &str)] = &[
    (PUBLIC_SUFFIX, SERVICE_BUS_SCOPE),
    (
        "servicebus.usgovcloudapi.net",
        SERVICE_BUS_SCOPE_US_GOVERNMENT,
    ),
    ("servicebus.chinacloudapi.cn", SERVICE_BUS_SCOPE_CHINA),
];

/// The Azure AD scope for a namespace at `host`, from its cloud's DNS suffix: [`SERVICE_BUS_SCOPE`] for
/// `*.servicebus.windows.net`, [`SERVICE_BUS_SCOPE_US_GOVERNMENT`] for `*.servicebus.usgovcloudapi.net`,
/// [`SERVICE_BUS_SCOPE_CHINA`] for `*.servicebus.chinacloudapi.cn`; [`SERVICE_BUS_SCOPE`] for a loopback host
/// (`localhost`, `127.0.0.0/8`, `::1`: an emulator on this machine). `None` for any other host: its audience
/// is not known, and a token for another cloud's audience would be refused there (or be good somewhere it was
/// not meant for); set it with [`ServiceBusConfig::token_scope`].
pub fn scope_for_host(host: &str) -> Option<&'static str> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let loopback = host == "localhost"
        || host.ends_with(".localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Some(SERVICE_BUS_SCOPE);
    }
    CLOUDS
        .iter()
        .find(|(suffix, _)| {
            host.strip_suffix(suffix)
                .is_some_and(|name| name.ends_with('.') && name.len() > 1)
        })
        .map(|(_, scope)| *scope)
}

/// Environment variable with a SAS connection string ([`ServiceBusConfig::from_env`]).
pub const ENV_CONNECTION_STRING: &str = "SERVICEBUS_CONNECTION_STRING";
/// Environment variable with a namespace name for Azure AD ([`ServiceBusConfig::from_env`]).
pub const ENV_NAMESPACE: &str = "SERVICEBUS_NAMESPACE";
/// Environment variable with an endpoint override, e.g. the emulator's URL ([`ServiceBusConfig::from_env`]).
pub const ENV_ENDPOINT: &str = "SERVICEBUS_ENDPOINT";
/// Environment variable with the Azure AD token scope ([`ServiceBusConfig::token_scope`],
/// [`ServiceBusConfig::from_env`]).
pub const ENV_TOKEN_SCOPE: &str = "SERVICEBUS_TOKEN_SCOPE";

/// The DNS suffix the crate builds every URL with.
pub const PUBLIC_SUFFIX: &str = "servicebus.windows.net";

/// How requests are authorized.
#[derive(Clone)]
#[non_exhaustive]
pub enum Credential {
    /// A shared access rule: every request is signed with a one-hour SAS for the URL it goes to.
    SharedAccessKey {
        /// Rule name (e.g. `RootManageSharedAccessKey`).
        key_name: String,
        /// The rule's key.
        key: Secret,
    },
    /// An Azure AD credential (managed identity, workload identity, service principal, CLI...): its bearer
    /// token replaces the crate's SAS header on every request, for the scope of the namespace's cloud
    /// ([`scope_for_host`]) or the one set with [`ServiceBusConfig::token_scope`].
    Token(Arc<dyn TokenCredential>),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::SharedAccessKey { key_name, .. } => f
                .debug_struct("SharedAccessKey")
                .field("key_name", key_name)
                .field("key", &"<redacted>")
                .finish(),
            Credential::Token(_) => f.write_str("Token(<credential>)"),
        }
    }
}

/// How to reach a Service Bus namespace. Its `Debug` shows no key, and of an endpoint override only its scheme,
/// host and port (its user info, path, query and fragment `***`).
///
/// ```
/// use std::time::Duration;
/// use txinbox_servicebus::ServiceBusConfig;
///
/// let config = ServiceBusConfig::from_connection_string(
///     "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=c2VjcmV0",
/// )?
/// .request_timeout(Duration::from_secs(15));
/// assert_eq!(config.namespace(), "contoso");
/// assert!(!format!("{config:?}").contains("c2VjcmV0"), "the key is never printed");
/// # Ok::<(), txinbox_servicebus::ServiceBusError>(())
/// ```
#[derive(Clone)]
pub struct ServiceBusConfig {
    namespace: String,
    endpoint: Option<Url>,
    entity_path: Option<String>,
    credential: Credential,
    token_scope: Option<String>,
    request_timeout: Duration,
    connect_timeout: Duration,
    receive_grace: Duration,
    http_client: Option<Arc<dyn HttpClient>>,
}

impl fmt::Debug for ServiceBusConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceBusConfig")
            .field(
                "namespace",
                &format_args!("{}", shown_namespace(&self.namespace)),
            )
            .field("endpoint", &self.endpoint.as_ref().map(shown_endpoint))
            .field("entity_path", &self.entity_path)
            .field("credential", &self.credential)
            .field("token_scope", &self.token_scope)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("http_client", &self.http_client.is_some())
            .finish()
    }
}

impl ServiceBusConfig {
    /// A namespace (the `contoso` of `contoso.servicebus.windows.net`, or that whole host name, as the Terraform
    /// sample's `namespace_fqdn` output gives it) with a credential. The host name of a namespace in Azure
    /// Government (`contoso.servicebus.usgovcloudapi.net`) or Azure China (`contoso.servicebus.chinacloudapi.cn`)
    /// is taken as that namespace, reached at that host (its [`endpoint`](Self::endpoint)), with an Azure AD
    /// credential's token for that cloud ([`scope_for_host`]).
    pub fn new(namespace: impl Into<String>, credential: Credential) -> Self {
        let namespace: String = namespace.into();
        let mut endpoint = None;
        let mut name = namespace.clone();
        for (suffix, _) in CLOUDS {
            let Some(label) = namespace
                .to_ascii_lowercase()
                .strip_suffix(suffix)
                .filter(|l| l.ends_with('.'))
                .map(|l| l.trim_end_matches('.').to_owned())
            else {
                continue;
            };
            if *suffix != PUBLIC_SUFFIX {
                endpoint = Url::parse(&format!("https://{label}.{suffix}/")).ok();
            }
            name = label;
            break;
        }
        Self {
            namespace: name,
            endpoint,
            entity_path: None,
            credential,
            token_scope: None,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            receive_grace: Duration::from_secs(10),
            http_client: None,
        }
    }

    /// A namespace with a shared access rule.
    pub fn shared_access_key(
        namespace: impl Into<String>,
        key_name: impl Into<String>,
        key: impl Into<String>,
    ) -> Self {
        Self::new(
            namespace,
            Credential::SharedAccessKey {
                key_name: key_name.into(),
                key: Secret::new(key.into()),
            },
        )
    }

    /// A namespace with an Azure AD token credential (any `azure_core` 0.21 `TokenCredential`, e.g. from
    /// `azure_identity` 0.21).
    pub fn token_credential(
        namespace: impl Into<String>,
        credential: Arc<dyn TokenCredential>,
    ) -> Self {
        Self::new(namespace, Credential::Token(credential))
    }

    /// A namespace with `azure_identity`'s `DefaultAzureCredential` (environment, workload identity, managed
    /// identity, Azure CLI, in that order). The identity needs the *Azure Service Bus Data Receiver* role (and
    /// *Data Sender* to forward dead letters or publish).
    #[cfg(feature = "azure-identity")]
    pub fn default_azure_credential(namespace: impl Into<String>) -> Result<Self, ServiceBusError> {
        let credential =
            azure_identity::create_default_credential().map_err(|e| ServiceBusError::Config {
                detail: format!("no Azure AD credential: {e}"),
            })?;
        Ok(Self::token_credential(namespace, credential))
    }

    /// Parses a connection string: `Endpoint=sb://NS.servicebus.windows.net/;SharedAccessKeyName=N;
    /// SharedAccessKey=K[;EntityPath=Q]`. An endpoint host outside `servicebus.windows.net` (a sovereign
    /// cloud, a local emulator) becomes the [`endpoint`](Self::endpoint) the requests go to, over `http` when
    /// `UseDevelopmentEmulator=true` or the scheme is `http`. A `SharedAccessSignature=` (a pre-signed token)
    /// is not supported.
    pub fn from_connection_string(s: &str) -> Result<Self, ServiceBusError> {
        let bad = |detail: &str| ServiceBusError::Config {
            detail: format!("connection string: {detail}"),
        };
        let (mut endpoint, mut key_name, mut key, mut entity, mut dev) =
            (None, None, None, None, false);
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("every part must be Name=Value"))?;
            match k.trim().to_ascii_lowercase().as_str() {
                "endpoint" => endpoint = Some(v.trim().to_owned()),
                "sharedaccesskeyname" => key_name = Some(v.trim().to_owned()),
                "sharedaccesskey" => key = Some(v.trim().to_owned()),
                "entitypath" => entity = Some(v.trim().to_owned()),
                "usedevelopmentemulator" => dev = v.trim().eq_ignore_ascii_case("true"),
                "sharedaccesssignature" => {
                    return Err(bad(
                        "SharedAccessSignature is not supported; use a key or Azure AD",
                    ))
                }
                _ => {}
            }
        }
        let endpoint = endpoint.ok_or_else(|| bad("Endpoint is missing"))?;
        let url = Url::parse(&endpoint).map_err(|_| bad("Endpoint is not a URL"))?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("Endpoint has no host"))?
            .to_ascii_lowercase();
        let namespace = host.split('.').next().unwrap_or(&host).to_owned();
        let key_name = key_name.ok_or_else(|| bad("SharedAccessKeyName is missing"))?;
        let key = key.ok_or_else(|| bad("SharedAccessKey is missing"))?;
        let mut config = Self::shared_access_key(namespace, key_name, key);
        config.entity_path = entity.filter(|e| !e.is_empty());
        if host != format!("{}.{PUBLIC_SUFFIX}", config.namespace) {
            let scheme = if dev || url.scheme() == "http" {
                "http"
            } else {
                "https"
            };
            let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
            let target = Url::parse(&format!("{scheme}://{host}{port}/"))
                .map_err(|_| bad("Endpoint host is invalid"))?;
            config.endpoint = Some(target);
        }
        Ok(config)
    }

    /// From the environment: `SERVICEBUS_CONNECTION_STRING` (SAS), else `SERVICEBUS_NAMESPACE` with
    /// `azure_identity`'s default credential chain (managed identity, workload identity, environment, CLI);
    /// `SERVICEBUS_ENDPOINT` (e.g. the emulator's URL) overrides where requests go; `SERVICEBUS_TOKEN_SCOPE`
    /// sets the Azure AD token's scope ([`token_scope`](Self::token_scope)).
    pub fn from_env() -> Result<Self, ServiceBusError> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let mut config = if let Some(cs) = get(ENV_CONNECTION_STRING) {
            Self::from_connection_string(&cs)?
        } else if let Some(ns) = get(ENV_NAMESPACE) {
            Self::namespace_with_default_credential(ns)?
        } else {
            return Err(ServiceBusError::Config {
                detail: format!("set {ENV_CONNECTION_STRING} (SAS) or {ENV_NAMESPACE} (Azure AD)"),
            });
        };
        if let Some(scope) = get(ENV_TOKEN_SCOPE) {
            config = config.token_scope(scope);
        }
        match get(ENV_ENDPOINT) {
            Some(e) => {
                Ok(
                    config.endpoint(Url::parse(&e).map_err(|_| ServiceBusError::Config {
                        detail: format!("{ENV_ENDPOINT} is not a URL"),
                    })?),
                )
            }
            None => Ok(config),
        }
    }

    #[cfg(feature = "azure-identity")]
    fn namespace_with_default_credential(ns: String) -> Result<Self, ServiceBusError> {
        Self::default_azure_credential(ns)
    }

    #[cfg(not(feature = "azure-identity"))]
    fn namespace_with_default_credential(_ns: String) -> Result<Self, ServiceBusError> {
        Err(ServiceBusError::Config {
            detail: format!(
                "{ENV_NAMESPACE} needs the `azure-identity` feature; or set {ENV_CONNECTION_STRING}"
            ),
        })
    }

    /// Sends every request to `endpoint` (e.g. `http://127.0.0.1:5380` for the emulator, or
    /// `https://NS.servicebus.usgovcloudapi.net`) instead of `https://NS.servicebus.windows.net`. With a shared
    /// access key, each request's SAS names the URL it goes to (the resource accessed, as the service checks it).
    pub fn endpoint(mut self, endpoint: Url) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// The Azure AD scope an Azure AD credential's token is asked for (e.g.
    /// `https://servicebus.usgovcloudapi.net/.default`), instead of the one of the namespace's cloud
    /// ([`scope_for_host`]); required when the endpoint's host is in no cloud the adapter knows (a custom DNS
    /// name in front of the namespace). Unused with a shared access key.
    pub fn token_scope(mut self, scope: impl Into<String>) -> Self {
        self.token_scope = Some(scope.into());
        self
    }

    /// Timeout of a request other than a long-poll receive (default 30 s; the crate sets none).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// Timeout of establishing a connection (default 10 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long past its `timeout=` a long-poll receive may take before it is abandoned (default 10 s).
    pub fn receive_grace(mut self, d: Duration) -> Self {
        self.receive_grace = d;
        self
    }

    /// Runs requests on this HTTP client instead of a rustls `reqwest` client built here (which follows no
    /// redirect, and keeps response header values that are not ASCII: give this one the same policy). Endpoint rewriting, request signing, bearer tokens and
    /// timeouts still apply on top of it.
    pub fn http_client(mut self, client: Arc<dyn HttpClient>) -> Self {
        self.http_client = Some(client);
        self
    }

    /// The namespace name.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The `EntityPath` of the connection string, if it had one.
    pub fn entity_path(&self) -> Option<&str> {
        self.entity_path.as_deref()
    }

    /// The Azure AD scope of the token: the one set, else the one of the cloud of the host the requests go to
    /// (the endpoint's, else `{namespace}.servicebus.windows.net`). A host of no known cloud is refused: a
    /// token for the public cloud's audience is not what its service accepts.
    fn scope(&self) -> Result<String, ServiceBusError> {
        if let Some(scope) = self.token_scope.as_deref().map(str::trim) {
            if scope.is_empty() || scope.contains(char::is_whitespace) {
                return Err(ServiceBusError::Config {
                    detail: "the Azure AD token scope is empty or holds spaces".into(),
                });
            }
            return Ok(scope.to_owned());
        }
        let Some(endpoint) = &self.endpoint else {
            return Ok(SERVICE_BUS_SCOPE.to_owned());
        };
        let host = endpoint.host_str().unwrap_or_default();
        scope_for_host(host)
            .map(str::to_owned)
            .ok_or_else(|| ServiceBusError::Config {
                detail: format!(
                "no Azure AD scope is known for the endpoint {} (not *.servicebus.windows.net, \
                 *.servicebus.usgovcloudapi.net or *.servicebus.chinacloudapi.cn): set \
                 ServiceBusConfig::token_scope (or {ENV_TOKEN_SCOPE}) to its cloud's, e.g. \
                 {SERVICE_BUS_SCOPE_US_GOVERNMENT}",
                shown_endpoint(endpoint)
            ),
            })
    }

    /// Builds the client.
    pub fn connect(self) -> Result<ServiceBusClient, ServiceBusError> {
        if self.namespace.is_empty()
            || !self
                .namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(ServiceBusError::Config {
                detail: format!(
                    "namespace {} must be letters, digits and '-'",
                    shown_namespace(&self.namespace)
                ),
            });
        }
        // Before any request: a host of no known cloud is refused here, not at the first token.
        let scope = match &self.credential {
            Credential::Token(_) => Some(self.scope()?),
            Credential::SharedAccessKey { .. } => None,
        };
        let inner = match self.http_client {
            Some(c) => c,
            None => {
                let client = reqwest::Client::builder()
                    .connect_timeout(self.connect_timeout)
                    // A backstop over the whole exchange, body included; the per-request budget is enforced by
                    // the transport (long polls are allowed their `timeout` plus the grace).
                    .timeout(Duration::from_secs(60) + self.receive_grace + self.request_timeout)
                    .pool_idle_timeout(Duration::from_secs(30))
                    // No redirect is followed: Service Bus answers none (Microsoft lists 200, 201, 204, 400,
                    // 401, 403, 404, 410, 500), and a followed one would report what another request got (a
                    // 303 to a complete or a 302 to a renewal becomes a GET, whose 200 reads as done) and
                    // bypass the transport's namespace-only check. A 3xx is an error of its status.
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| ServiceBusError::Config {
                        detail: format!("cannot build the HTTP client: {e}"),
                    })?;
                Arc::new(crate::transport::ReqwestClient(client)) as Arc<dyn HttpClient>
            }
        };
        let (auth, key_name, key) = match self.credential {
            Credential::SharedAccessKey { key_name, key } => {
                (Auth::sas(key_name.clone(), &key), key_name, key)
            }
            // The crate signs every request anyway; its SAS (with a throwaway key) is replaced by the bearer.
            Credential::Token(c) => (
                Auth::bearer(c, scope.unwrap_or_else(|| SERVICE_BUS_SCOPE.to_owned())),
                "txinbox-azure-ad".to_owned(),
                Secret::new("unused-the-bearer-token-replaces-this-signature"),
            ),
        };
        let transport = Transport::new(
            inner,
            format!("{}.{PUBLIC_SUFFIX}", self.namespace),
            self.endpoint,
            auth,
            self.request_timeout,
            self.receive_grace,
        );
        Ok(ServiceBusClient {
            inner: Arc::new(ClientInner {
                namespace: self.namespace,
                http: Arc::new(transport),
                key_name,
                key,
                entity_path: self.entity_path,
            }),
        })
    }
}

/// An endpoint override as an error or `Debug` shows it: its scheme, host and port, which are all the requests
/// take from it; its user info, and a path, query or fragment, `***` (credentials, or a connection string's
/// `;SharedAccessKey=KEY` read as its path: `sb://emu:5380/***`).
pub(crate) fn shown_endpoint(url: &Url) -> String {
    let mut out = format!("{}://", url.scheme());
    if !url.username().is_empty() || url.password().is_some() {
        out.push_str("***@");
    }
    out.push_str(url.host_str().unwrap_or_default());
    if let Some(port) = url.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push('/');
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        out.push_str("***");
    }
    out
}

/// A namespace as an error or `Debug` shows it: quoted when it reads as a host name (a typo: `crm_prod`), never
/// when it holds what no host name does (`=`, `;`, `+`, `/`): a connection string or a key given in its place
/// (`SERVICEBUS_NAMESPACE` set to what `SERVICEBUS_CONNECTION_STRING` takes).
fn shown_namespace(namespace: &str) -> String {
    if namespace
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        format!("{namespace:?}")
    } else {
        "(not shown: it holds characters of a key or a connection string)".into()
    }
}

struct ClientInner {
    namespace: String,
    http: Arc<dyn HttpClient>,
    key_name: String,
    key: Secret,
    entity_path: Option<String>,
}

/// A connected namespace: hands out the crate's `QueueClient`s on the adapter's HTTP transport.
#[derive(Clone)]
pub struct ServiceBusClient {
    inner: Arc<ClientInner>,
}

impl fmt::Debug for ServiceBusClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceBusClient")
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

impl ServiceBusClient {
    /// The namespace name.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The `EntityPath` of the connection string, if it had one.
    pub fn entity_path(&self) -> Option<&str> {
        self.inner.entity_path.as_deref()
    }

    /// The HTTP client every request goes through (endpoint rewrite, bearer token, timeouts).
    pub fn http_client(&self) -> Arc<dyn HttpClient> {
        self.inner.http.clone()
    }

    /// The crate's client for an entity path: a queue, `queue/$DeadLetterQueue`, or
    /// `topic/subscriptions/name` (receive only).
    pub fn queue_client(&self, path: &str) -> QueueClient {
        // `QueueClient::new` cannot fail (it only base64-encodes the key); keep the error path anyway.
        QueueClient::new(
            self.inner.http.clone(),
            self.inner.namespace.clone(),
            path.trim_matches('/').to_owned(),
            self.inner.key_name.clone(),
            self.inner.key.clone(),
        )
        .unwrap_or_else(unreachable_client)
    }
}

fn unreachable_client(e: azure_core::Error) -> QueueClient {
    // The crate's constructor has no failing path in 0.21; if a later version adds one, fail loudly.
    panic!("azure_messaging_servicebus QueueClient::new failed: {e}")
}

/// The dead-letter sub-queue of `queue`: `queue/$DeadLetterQueue`.
pub fn dead_letter_queue_path(queue: &str) -> String {
    format!("{}/$DeadLetterQueue", queue.trim_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_its_name_or_its_public_host_name() {
        for ns in ["contoso", "contoso.servicebus.windows.net"] {
            let c = ServiceBusConfig::shared_access_key(ns, "listen", "c2VjcmV0");
            assert_eq!(c.namespace(), "contoso", "{ns}");
        }
        // Not the public suffix on a label boundary: kept as given.
        let c =
            ServiceBusConfig::shared_access_key("xservicebus.windows.net", "listen", "c2VjcmV0");
        assert_eq!(c.namespace(), "xservicebus.windows.net");
    }

    #[test]
    fn public_connection_strings() {
        let c = ServiceBusConfig::from_connection_string(
            "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc=;EntityPath=orders",
        )
        .unwrap();
        assert_eq!(c.namespace(), "contoso");
        assert_eq!(c.entity_path(), Some("orders"));
        assert!(c.endpoint.is_none());
        match &c.credential {
            Credential::SharedAccessKey { key_name, key } => {
                assert_eq!(key_name, "RootManageSharedAccessKey");
                assert_eq!(key.secret(), "abc=");
            }
            other => panic!("{other:?}"),
        }
        assert!(!format!("{c:?}").contains("abc="));
    }

    #[test]
    fn other_hosts_become_the_endpoint() {
        let c = ServiceBusConfig::from_connection_string(
            "Endpoint=sb://gov.servicebus.usgovcloudapi.net/;SharedAccessKeyName=a;SharedAccessKey=b",
        )
        .unwrap();
        assert_eq!(c.namespace(), "gov");
        assert_eq!(
            c.endpoint.as_ref().map(Url::as_str),
            Some("https://gov.servicebus.usgovcloudapi.net/")
        );
        let c = ServiceBusConfig::from_connection_string(
            "Endpoint=sb://localhost:5380;SharedAccessKeyName=a;SharedAccessKey=b;UseDevelopmentEmulator=true",
        )
        .unwrap();
        assert_eq!(
            c.endpoint.as_ref().map(Url::as_str),
            Some("http://localhost:5380/")
        );
    }

    /// A connection string (or a key) given where the namespace goes (`SERVICEBUS_NAMESPACE` for
    /// `SERVICEBUS_CONNECTION_STRING`) is refused without being quoted, in the error and in `Debug`; a
    /// namespace mistyped as a host name is still quoted.
    #[test]
    fn a_connection_string_given_as_the_namespace_is_never_quoted() {
        for ns in [
            "Endpoint=sb://crm.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=SECRETxyz123",
            "SECRETxyz123+abc/def=",
        ] {
            let c = ServiceBusConfig::shared_access_key(ns, "listen", "c2VjcmV0");
            let shown = format!("{c:?}");
            assert!(!shown.contains("SECRETxyz123"), "{shown}");
            let e = c.connect().unwrap_err().to_string();
            assert!(!e.contains("SECRETxyz123"), "{e}");
            assert!(e.contains("namespace"), "{e}");
        }
        let c = ServiceBusConfig::shared_access_key("crm_prod", "listen", "c2VjcmV0");
        assert!(
            format!("{c:?}").contains("namespace: \"crm_prod\","),
            "{c:?}"
        );
        let e = c.connect().unwrap_err().to_string();
        assert!(e.contains("namespace \"crm_prod\" must be"), "{e}");
    }

    /// An endpoint override is a URL, and `SERVICEBUS_ENDPOINT` may be given what a connection string holds (an
    /// `sb://` URL followed by `;SharedAccessKey=KEY`, which parses as its path) or credentials in its user info
    /// or query: `Debug` shows only its scheme, host and port, the rest `***`.
    #[test]
    fn an_endpoint_holding_a_key_is_shown_without_it() {
        for endpoint in [
            "sb://emu.local:5380/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SECRETkey1=",
            "https://admin:SECRETpw2@emu.local:5380/?sig=SECRETsig3&se=1",
            "http://emu.local:5380/SECRETpath4#SECRETfrag5",
        ] {
            let c = ServiceBusConfig::shared_access_key("crm", "listen", "c2VjcmV0")
                .endpoint(Url::parse(endpoint).unwrap());
            let shown = format!("{c:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(shown.contains("emu.local:5380/"), "{shown}");
            let shown = format!("{:?}", c.connect().unwrap().inner.http);
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(shown.contains("emu.local:5380/"), "{shown}");
        }
        let c = ServiceBusConfig::shared_access_key("crm", "listen", "c2VjcmV0")
            .endpoint(Url::parse("http://127.0.0.1:5380").unwrap());
        assert!(
            format!("{c:?}").contains("endpoint: Some(\"http://127.0.0.1:5380/\")"),
            "{c:?}"
        );
    }

    /// Records the scopes a token is asked for.
    #[derive(Debug, Default)]
    struct Scopes(std::sync::Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl TokenCredential for Scopes {
        async fn get_token(
            &self,
            scopes: &[&str],
        ) -> azure_core::Result<azure_core::auth::AccessToken> {
            self.0
                .lock()
                .unwrap()
                .extend(scopes.iter().map(|s| s.to_string()));
            Ok(azure_core::auth::AccessToken::new(
                "entra-token",
                azure_core::date::parse_rfc3339("2099-01-01T00:00:00Z")?,
            ))
        }
        async fn clear_cache(&self) -> azure_core::Result<()> {
            Ok(())
        }
    }

    /// Records the URL of each request and answers 200.
    #[derive(Debug, Default)]
    struct Urls(std::sync::Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl HttpClient for Urls {
        async fn execute_request(
            &self,
            request: &azure_core::Request,
        ) -> azure_core::Result<azure_core::Response> {
            self.0.lock().unwrap().push(request.url().to_string());
            Ok(azure_core::Response::new(
                azure_core::StatusCode::Ok,
                azure_core::headers::Headers::new(),
                Box::pin(futures::stream::empty()),
            ))
        }
    }

    /// Sends one request through `config`'s client (to the lock URI the crate would build) and returns the
    /// scopes its token was asked for and the URL the request went to.
    async fn token_request(config: ServiceBusConfig, scopes: &Scopes) -> (Vec<String>, String) {
        let urls = Arc::new(Urls::default());
        let client = config.http_client(urls.clone()).connect().expect("connect");
        let url = format!(
            "https://{}.{PUBLIC_SUFFIX}/orders/messages/3/tok",
            client.namespace()
        );
        client
            .http_client()
            .execute_request(&azure_core::Request::new(
                Url::parse(&url).unwrap(),
                azure_core::Method::Delete,
            ))
            .await
            .expect("sent");
        let sent = urls.0.lock().unwrap().clone();
        let asked = std::mem::take(&mut *scopes.0.lock().unwrap());
        (asked, sent.into_iter().next().expect("a request"))
    }

    /// A token's audience is the namespace's cloud. Microsoft, *Authenticate and authorize an application with
    /// Microsoft Entra ID to access Azure Service Bus entities*: "The resource name to request a token is
    /// https://servicebus.azure.net." (global Azure), and on the Azure China page of the same article "The
    /// resource name to request a token is https://servicebus.chinacloudapi.cn."; Azure Government's Service Bus
    /// resource is `https://servicebus.usgovcloudapi.net` (the Azure SDKs' environment tables). A namespace on
    /// another cloud (its endpoint, or its host name given as the namespace) is asked a token for that cloud's
    /// scope, not the public cloud's.
    #[tokio::test]
    async fn an_azure_ad_token_is_asked_for_the_namespace_cloud() {
        let scopes = Arc::new(Scopes::default());
        let cred = || scopes.clone() as Arc<dyn TokenCredential>;
        let url = |u: &str| Url::parse(u).unwrap();
        for (config, scope, sent_to) in [
            (
                ServiceBusConfig::token_credential("contoso", cred()),
                "https://servicebus.azure.net/.default",
                "https://contoso.servicebus.windows.net/orders/messages/3/tok",
            ),
            (
                ServiceBusConfig::token_credential("gov", cred())
                    .endpoint(url("https://gov.servicebus.usgovcloudapi.net")),
                "https://servicebus.usgovcloudapi.net/.default",
                "https://gov.servicebus.usgovcloudapi.net/orders/messages/3/tok",
            ),
            (
                ServiceBusConfig::token_credential("gov.servicebus.usgovcloudapi.net", cred()),
                "https://servicebus.usgovcloudapi.net/.default",
                "https://gov.servicebus.usgovcloudapi.net/orders/messages/3/tok",
            ),
            (
                ServiceBusConfig::token_credential("cn", cred())
                    .endpoint(url("https://cn.servicebus.chinacloudapi.cn/")),
                "https://servicebus.chinacloudapi.cn/.default",
                "https://cn.servicebus.chinacloudapi.cn/orders/messages/3/tok",
            ),
            (
                ServiceBusConfig::token_credential("cn.servicebus.chinacloudapi.cn", cred()),
                "https://servicebus.chinacloudapi.cn/.default",
                "https://cn.servicebus.chinacloudapi.cn/orders/messages/3/tok",
            ),
        ] {
            let (asked, sent) = token_request(config, &scopes).await;
            assert_eq!(asked, [scope], "{sent}");
            assert_eq!(sent, sent_to);
        }
    }

    /// A host of no cloud the adapter knows (a custom DNS name in front of the namespace) gets no token for
    /// the public cloud's audience: `connect` refuses it, naming `token_scope`, until the scope is set; a local
    /// emulator (loopback) keeps the public scope; a shared access key needs none.
    #[tokio::test]
    async fn an_unknown_host_needs_its_token_scope_set() {
        let scopes = Arc::new(Scopes::default());
        let cred = || scopes.clone() as Arc<dyn TokenCredential>;
        let custom = Url::parse("https://bus.contoso.example/").unwrap();
        let e = ServiceBusConfig::token_credential("contoso", cred())
            .endpoint(custom.clone())
            .connect()
            .unwrap_err();
        let ServiceBusError::Config { detail } = &e;
        assert!(
            detail.contains("token_scope") && detail.contains("bus.contoso.example"),
            "{e}"
        );
        let config = ServiceBusConfig::token_credential("contoso", cred())
            .endpoint(custom)
            .token_scope("https://servicebus.usgovcloudapi.net/.default");
        let (asked, sent) = token_request(config, &scopes).await;
        assert_eq!(asked, ["https://servicebus.usgovcloudapi.net/.default"]);
        assert_eq!(sent, "https://bus.contoso.example/orders/messages/3/tok");
        for emulator in [
            "http://127.0.0.1:5380",
            "http://localhost:5380",
            "http://[::1]:5380",
        ] {
            let config = ServiceBusConfig::token_credential("contoso", cred())
                .endpoint(Url::parse(emulator).unwrap());
            let (asked, _) = token_request(config, &scopes).await;
            assert_eq!(asked, [SERVICE_BUS_SCOPE], "{emulator}");
        }
        let sas = ServiceBusConfig::shared_access_key("contoso", "listen", "c2VjcmV0")
            .endpoint(Url::parse("https://bus.contoso.example/").unwrap());
        assert!(sas.connect().is_ok());
        assert!(ServiceBusConfig::token_credential("contoso", cred())
            .token_scope(" ")
            .connect()
            .is_err());
    }

    #[test]
    fn scopes_follow_the_cloud_suffix_on_a_label_boundary() {
        for (host, scope) in [
            ("ns.servicebus.windows.net", Some(SERVICE_BUS_SCOPE)),
            ("NS.ServiceBus.Windows.Net.", Some(SERVICE_BUS_SCOPE)),
            (
                "ns.servicebus.usgovcloudapi.net",
                Some(SERVICE_BUS_SCOPE_US_GOVERNMENT),
            ),
            (
                "ns.servicebus.chinacloudapi.cn",
                Some(SERVICE_BUS_SCOPE_CHINA),
            ),
            ("127.0.0.1", Some(SERVICE_BUS_SCOPE)),
            ("servicebus.windows.net", None),
            ("evilservicebus.windows.net", None),
            ("ns.servicebus.windows.net.evil.example", None),
            ("ns.servicebus.cloudapi.de", None),
            ("10.0.0.4", None),
        ] {
            assert_eq!(scope_for_host(host), scope, "{host}");
        }
    }

    #[test]
    fn incomplete_connection_strings_are_refused_without_echoing_the_key() {
        for s in [
            "SharedAccessKeyName=a;SharedAccessKey=secret-1",
            "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey=secret-1",
            "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=a",
            "Endpoint=sb://x.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=secret-1",
            "garbage",
        ] {
            let e = ServiceBusConfig::from_connection_string(s).unwrap_err();
            assert!(!e.to_string().contains("secret-1"), "{e}");
        }
    }
}
