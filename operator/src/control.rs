//! Client of the engine control API (compiled from the engine's .proto by build.rs), and
//! the one pool of clients both runtimes set DP weights through.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Generated protobuf types and the gRPC client.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("ballast.control.v1");
}

pub use proto::engine_control_client::EngineControlClient;

use proto::SetDpWeightsRequest;

/// Connect and call timeout of an engine's control API: a hung replica delays a control
/// period by this much at most (calls are concurrent).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// One control-API client per replica, each on a lazily connected channel made on first
/// use and kept while the replica lives, with [`CONTROL_TIMEOUT`] on connecting and on
/// every call, each call carrying the service's control token ([`ControlTokens`]). An
/// `https://` address is dialled over TLS, trusting only [`ControlTrust`].
#[derive(Default)]
pub struct ControlClients {
    /// By replica: the address the channel was made for, and the client.
    clients: BTreeMap<String, (String, EngineControlClient<Channel>)>,
    tokens: ControlTokens,
    trust: Option<ControlTrust>,
}

/// What the operator trusts when an engine's control API serves TLS: the CA certificates
/// (PEM) that sign engines' certificates, and the name those carry (pods are dialled by
/// IP, so the name is checked instead of the address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlTrust {
    /// PEM certificates of the CAs.
    pub ca_pem: String,
    /// The DNS name engines' certificates must carry.
    pub server_name: String,
}

/// A fresh control token: 32 random bytes from the system's generator, as 64 hex digits.
pub fn fresh_token() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random generator works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bearer tokens the operator sends on control calls: the current one first, then,
/// while a rotation is young, the one before it (an engine whose mounted token file the
/// kubelet has not updated yet still knows only that). Empty: calls carry no token.
/// `Debug` never shows a token.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ControlTokens(Vec<String>);

impl ControlTokens {
    /// Tokens to try in order, the current one first.
    pub fn new(tokens: Vec<String>) -> Self {
        Self(tokens.into_iter().filter(|t| !t.is_empty()).collect())
    }

    /// The tokens of a token file's text: one a line, blank lines skipped.
    pub fn parse(text: &str) -> Self {
        Self::new(text.lines().map(|l| l.trim().to_string()).collect())
    }

    /// Whether calls carry no token.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `authorization` values to try, in order (one `None` when there is no token).
    fn headers(&self) -> Vec<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>> {
        if self.0.is_empty() {
            return vec![None];
        }
        self.0
            .iter()
            .filter_map(|t| format!("Bearer {t}").parse().ok())
            .map(Some)
            .collect()
    }
}

impl std::fmt::Debug for ControlTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ControlTokens({} tokens, redacted)", self.0.len())
    }
}

impl ControlClients {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tokens later calls carry.
    pub fn set_tokens(&mut self, tokens: ControlTokens) {
        self.tokens = tokens;
    }

    /// What later TLS connections trust (`None`: `https://` addresses cannot be called).
    /// A change closes every channel, so no connection outlives the trust it was made on.
    pub fn set_trust(&mut self, trust: Option<ControlTrust>) {
        if self.trust != trust {
            self.clients.clear();
            self.trust = trust;
        }
    }

    /// Forgets the clients of replicas for which `live` is false (their channels close).
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.clients.retain(|replica, _| live(replica));
    }

    /// Replicas with a client, in name order.
    pub fn replicas(&self) -> Vec<&str> {
        self.clients.keys().map(String::as_str).collect()
    }

    /// The client of `replica` at `address` (`http://host:port`, or `https://` for TLS):
    /// the pool's, or a new one when it has none for that address. An error when the
    /// address is not a URI, or is `https://` with nothing to trust.
    fn client(
        &mut self,
        replica: &str,
        address: &str,
    ) -> Result<EngineControlClient<Channel>, String> {
        if let Some((at, c)) = self.clients.get(replica)
            && at == address
        {
            return Ok(c.clone());
        }
        let mut endpoint = Endpoint::from_shared(address.to_string())
            .map_err(|_| format!("not a control API address: {address}"))?;
        if address.starts_with("https://") {
            let trust = self.trust.as_ref().ok_or_else(|| {
                format!("{address} serves TLS but the operator has no CA to trust for it")
            })?;
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&trust.ca_pem))
                .domain_name(trust.server_name.clone());
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("cannot set up TLS for {address}: {e}"))?;
        }
        let client = EngineControlClient::new(
            endpoint
                .connect_timeout(CONTROL_TIMEOUT)
                .timeout(CONTROL_TIMEOUT)
                .connect_lazy(),
        );
        self.clients
            .insert(replica.to_string(), (address.to_string(), client.clone()));
        Ok(client)
    }

    /// Sets each `(replica, address, weights)` concurrently, each call bounded by
    /// [`CONTROL_TIMEOUT`]. Returns, in the same order, each replica with its weights and
    /// what became of the call.
    pub async fn set_dp_weights(
        &mut self,
        calls: Vec<(String, String, Vec<f64>)>,
    ) -> Vec<(String, Vec<f64>, Result<(), CallError>)> {
        let mut pending = Vec::new();
        for (replica, address, weights) in calls {
            let mut client = match self.client(&replica, &address) {
                Ok(c) => c,
                Err(why) => {
                    pending.push(futures::future::Either::Left(std::future::ready((
                        replica,
                        weights,
                        Err(CallError::failed(why)),
                    ))));
                    continue;
                }
            };
            let headers = self.tokens.headers();
            pending.push(futures::future::Either::Right(async move {
                let mut result = Err(CallError::failed("no control token could be sent"));
                // The current token, then the one before it if the engine refused that
                // (its mounted file may not have the new one yet).
                for auth in headers {
                    let mut req = tonic::Request::new(SetDpWeightsRequest {
                        weights: weights.clone(),
                    });
                    if let Some(auth) = auth {
                        req.metadata_mut().insert("authorization", auth);
                    }
                    let call = client.set_dp_weights(req);
                    result = match tokio::time::timeout(CONTROL_TIMEOUT, call).await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => {
                            Err(CallError {
                                refused: true,
                                message: format!("refused: {}", status.message()),
                            })
                        }
                        Ok(Err(status)) => Err(CallError::failed(status.message())),
                        Err(_) => Err(CallError::failed(format!(
                            "no answer within {CONTROL_TIMEOUT:?}"
                        ))),
                    };
                    if !result.as_ref().is_err_and(|e| e.refused) {
                        break;
                    }
                }
                (replica, weights, result)
            }));
        }
        futures::future::join_all(pending).await
    }
}

/// Why a control call did not do what it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The engine refused every token the operator has (`UNAUTHENTICATED`).
    pub refused: bool,
    /// Why, for the log (never a token).
    pub message: String,
}

impl CallError {
    fn failed(message: impl Into<String>) -> Self {
        Self {
            refused: false,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The `result` label of `ballast_operator_control_calls_total` for a call's outcome:
/// `ok`, `unauthenticated` (the engine refused the token) or `error`.
pub fn result_label(result: &Result<(), CallError>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(e) if e.refused => "unauthenticated",
        Err(_) => "error",
    }
}

/// The control API address of a host (an IP, IPv6 in brackets) and port.
pub fn address(host: &str, port: i32) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// [`address`] for an engine whose control API serves TLS.
pub fn tls_address(host: &str, port: i32) -> String {
    address(host, port).replacen("http://", "https://", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_bracket_ipv6() {
        assert_eq!(address("10.0.0.7", 9000), "http://10.0.0.7:9000");
        assert_eq!(address("fd00::5", 9000), "http://[fd00::5]:9000");
        assert_eq!(address("127.0.0.1", 41000), "http://127.0.0.1:41000");
    }

    #[tokio::test]
    async fn a_replica_that_does_not_answer_costs_one_timeout_and_keeps_its_client() {
        // A port that accepts nothing: the connect fails fast (refused) or times out.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let mut pool = ControlClients::new();
        let t0 = std::time::Instant::now();
        let out = pool
            .set_dp_weights(vec![
                (
                    "a".into(),
                    address("127.0.0.1", i32::from(port)),
                    vec![0.5, 0.5],
                ),
                ("b".into(), "not a uri".into(), vec![1.0]),
            ])
            .await;
        assert!(t0.elapsed() < CONTROL_TIMEOUT + Duration::from_secs(1));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].0, "a");
        assert!(out[0].2.is_err(), "{out:?}");
        assert!(
            out[1].2.as_ref().unwrap_err().message.contains("not a uri"),
            "{out:?}"
        );
        assert_eq!(result_label(&out[0].2), "error");
        assert_eq!(pool.replicas(), ["a"]);
        pool.retain(|r| r != "a");
        assert!(pool.replicas().is_empty());
    }
}
