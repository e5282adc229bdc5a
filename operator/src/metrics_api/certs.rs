//! The serving certificate the operator keeps itself (`--metrics-api-cert-secret`): a CA
//! and a serving certificate for the metrics-API Service's DNS names, in a Secret of the
//! operator's namespace, the CA put into each APIService's `caBundle`, both renewed
//! before they expire.
//!
//! Every operator replica runs [`keep`]: it reads the Secret, makes a new pair when there
//! is none, when it names other hosts or when it expires within [`RENEW_WITHIN`] (a new CA
//! only when the CA itself expires within [`CA_RENEW_WITHIN`]; until then the `caBundle`
//! carries the old CA too), writes it back with the `resourceVersion` it read (so two
//! replicas never both win), and serves whatever the Secret holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::tls::{ServingCert, pair_from_pem};

/// The serving certificate is renewed when it expires within this.
pub const RENEW_WITHIN: Duration = Duration::from_secs(30 * 24 * 3600);
/// The CA is renewed when it expires within this.
pub const CA_RENEW_WITHIN: Duration = Duration::from_secs(365 * 24 * 3600);
/// A serving certificate is valid this long.
const SERVING_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// A CA is valid this long.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How often the Secret is checked (and the APIServices' `caBundle`).
const CHECK_EVERY: Duration = Duration::from_secs(600);

/// Where the operator keeps its certificate and whom it tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The Secret's namespace (the operator's own).
    pub namespace: String,
    /// The Secret's name.
    pub secret: String,
    /// DNS names of the serving certificate: the metrics-API Service's.
    pub dns_names: Vec<String>,
    /// APIServices whose `caBundle` gets the CA.
    pub apiservices: Vec<String>,
}

/// The Secret's contents (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pem {
    /// The CA certificate.
    pub ca_crt: String,
    /// The CA key.
    pub ca_key: String,
    /// The serving certificate.
    pub tls_crt: String,
    /// The serving key.
    pub tls_key: String,
    /// Older CAs still trusted in the `caBundle` (after a CA renewal).
    pub previous_cas: String,
}

impl Pem {
    /// The pair a Secret holds (keys `ca.crt`, `ca.key`, `tls.crt`, `tls.key`, and
    /// `previous-ca.crt` if any), `None` when a key is missing or not text.
    pub fn from_secret(s: &Secret) -> Option<Pem> {
        let data = s.data.as_ref()?;
        let text = |k: &str| {
            data.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        Some(Pem {
            ca_crt: text("ca.crt")?,
            ca_key: text("ca.key")?,
            tls_crt: text("tls.crt")?,
            tls_key: text("tls.key")?,
            previous_cas: text("previous-ca.crt").unwrap_or_default(),
        })
    }

    /// The Secret data that holds it, under the keys [`Pem::from_secret`] reads.
    pub fn data(&self) -> BTreeMap<String, ByteString> {
        [
            ("ca.crt", &self.ca_crt),
            ("ca.key", &self.ca_key),
            ("tls.crt", &self.tls_crt),
            ("tls.key", &self.tls_key),
            ("previous-ca.crt", &self.previous_cas),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }

    /// The `caBundle`: the CA and any older one still trusted.
    pub fn ca_bundle(&self) -> String {
        format!("{}{}", self.ca_crt, self.previous_cas)
    }
}

/// What a pair needs at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing.
    Keep,
    /// A new serving certificate from the same CA.
    Serving,
    /// A new CA and serving certificate.
    All,
}

/// When `pem` (one certificate) expires, and its DNS names.
fn facts(pem: &str) -> Option<(SystemTime, Vec<String>)> {
    let block = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).ok();
    let der: rustls::pki_types::CertificateDer<'static> = block?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let not_after = SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(cert.validity().not_after.timestamp()).ok()?);
    let names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some((not_after, names))
}

/// What `pem` needs at `now` to serve `dns_names`.
pub fn renewal(pem: Option<&Pem>, dns_names: &[String], now: SystemTime) -> Renewal {
    let Some(pem) = pem else {
        return Renewal::All;
    };
    let expires_within =
        |at: SystemTime, d: Duration| at.duration_since(now).map_or(true, |left| left < d);
    let Some((ca_until, _)) = facts(&pem.ca_crt) else {
        return Renewal::All;
    };
    if expires_within(ca_until, CA_RENEW_WITHIN) || pair_from_pem(&pem.ca_crt, &pem.ca_key).is_err()
    {
        return Renewal::All;
    }
    match facts(&pem.tls_crt) {
        Some((until, names))
            if !expires_within(until, RENEW_WITHIN)
                && dns_names.iter().all(|n| names.contains(n))
                && pair_from_pem(&pem.tls_crt, &pem.tls_key).is_ok() =>
        {
            Renewal::Keep
        }
        _ => Renewal::Serving,
    }
}

fn rcgen_error(e: rcgen::Error) -> String {
    format!("cannot make a certificate: {e}")
}

/// A new pair for `dns_names`: from `old`'s CA for [`Renewal::Serving`], from a new CA
/// for [`Renewal::All`] (the old CA, while still valid, stays in the bundle).
pub fn issue(
    old: Option<&Pem>,
    renewal: Renewal,
    dns_names: &[String],
    now: SystemTime,
) -> Result<Pem, String> {
    issue_from(
        old,
        renewal,
        dns_names,
        now,
        "ballast-operator metrics-API CA",
    )
}

/// [`issue`], a new CA being called `ca_name` (its common name).
pub fn issue_from(
    old: Option<&Pem>,
    renewal: Renewal,
    dns_names: &[String],
    now: SystemTime,
    ca_name: &str,
) -> Result<Pem, String> {
    let at = |d: Duration| -> time::OffsetDateTime {
        let secs = (now + d)
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    };
    let reuse = match (renewal, old) {
        (Renewal::Serving | Renewal::Keep, Some(old)) => Some(old),
        _ => None,
    };
    let (ca_crt, ca_key, previous_cas) = match reuse {
        Some(old) => (
            old.ca_crt.clone(),
            old.ca_key.clone(),
            old.previous_cas.clone(),
        ),
        None => {
            let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
            let mut params =
                rcgen::CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, ca_name);
            params.key_usages = vec![
                rcgen::KeyUsagePurpose::KeyCertSign,
                rcgen::KeyUsagePurpose::CrlSign,
                rcgen::KeyUsagePurpose::DigitalSignature,
            ];
            params.not_before = at(Duration::ZERO) - time::Duration::hours(1);
            params.not_after = at(CA_LIFETIME);
            let cert = params.self_signed(&key).map_err(rcgen_error)?;
            // The CA being replaced stays trusted until it expires.
            let previous = old
                .filter(|o| facts(&o.ca_crt).is_some_and(|(until, _)| until > now))
                .map(|o| o.ca_crt.clone())
                .unwrap_or_default();
            (cert.pem(), key.serialize_pem(), previous)
        }
    };
    let ca_key_pair = rcgen::KeyPair::from_pem(&ca_key).map_err(rcgen_error)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_crt, ca_key_pair).map_err(rcgen_error)?;
    let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
    let mut params = rcgen::CertificateParams::new(dns_names.to_vec()).map_err(rcgen_error)?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = at(Duration::ZERO) - time::Duration::hours(1);
    params.not_after = at(SERVING_LIFETIME);
    let cert = params.signed_by(&key, &issuer).map_err(rcgen_error)?;
    Ok(Pem {
        ca_crt,
        ca_key,
        tls_crt: cert.pem(),
        tls_key: key.serialize_pem(),
        previous_cas,
    })
}

/// One check: the Secret (made or renewed if it must be), the served pair, the
/// APIServices' `caBundle`. Returns the pair in the Secret.
pub async fn ensure(
    client: &Client,
    settings: &Settings,
    serving: &ServingCert,
) -> Result<Pem, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let name = &settings.secret;
    let current = secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot read Secret {}/{name}: {e}", settings.namespace))?;
    let pem_now = current.as_ref().and_then(Pem::from_secret);
    let now = SystemTime::now();
    let pem = match renewal(pem_now.as_ref(), &settings.dns_names, now) {
        Renewal::Keep => pem_now.expect("Keep needs a pair"),
        r => {
            let pem = issue(pem_now.as_ref(), r, &settings.dns_names, now)?;
            let mut secret = current.clone().unwrap_or_default();
            secret.metadata.name = Some(name.clone());
            secret.metadata.namespace = Some(settings.namespace.clone());
            secret
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(
                    crate::labels::MANAGED_BY.into(),
                    crate::labels::OPERATOR.into(),
                );
            secret.type_ = Some("kubernetes.io/tls".into());
            secret.data = Some(pem.data());
            // Create, or replace the version read: a replica that lost the race re-reads.
            let written = match current {
                None => secrets.create(&PostParams::default(), &secret).await,
                Some(_) => secrets.replace(name, &PostParams::default(), &secret).await,
            };
            match written {
                Ok(_) => {
                    tracing::info!(target: "ballast::metrics_api", secret = %name, renewal = ?r, "wrote the metrics APIs' certificate");
                    pem
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let s = secrets
                        .get(name)
                        .await
                        .map_err(|e| format!("cannot read Secret {name}: {e}"))?;
                    Pem::from_secret(&s)
                        .ok_or_else(|| format!("Secret {name} lacks the certificate keys"))?
                }
                Err(e) => {
                    return Err(format!(
                        "cannot write Secret {}/{name}: {e}",
                        settings.namespace
                    ));
                }
            }
        }
    };
    let pair =
        pair_from_pem(&pem.tls_crt, &pem.tls_key).map_err(|e| format!("Secret {name}: {e}"))?;
    serving.replace(pair);
    let apiservices: Api<APIService> = Api::all(client.clone());
    let bundle = pem.ca_bundle();
    for a in &settings.apiservices {
        let have = apiservices
            .get_opt(a)
            .await
            .map_err(|e| format!("cannot read APIService {a}: {e}"))?;
        let Some(have) = have else {
            tracing::warn!(target: "ballast::metrics_api", apiservice = %a, "no such APIService: its caBundle cannot be set");
            continue;
        };
        let current = have
            .spec
            .and_then(|s| s.ca_bundle)
            .map(|b| b.0)
            .unwrap_or_default();
        if current != bundle.as_bytes() {
            let patch =
                serde_json::json!({"spec": {"caBundle": ByteString(bundle.as_bytes().to_vec())}});
            apiservices
                .patch(a, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("cannot set the caBundle of APIService {a}: {e}"))?;
            tracing::info!(target: "ballast::metrics_api", apiservice = %a, "caBundle set");
        }
    }
    Ok(pem)
}

/// Keeps the certificate: [`ensure`] now, then every 10 minutes (every 10 s after a
/// failure), logging what fails.
pub fn keep(client: Client, settings: Settings, serving: Arc<ServingCert>) {
    tokio::spawn(async move {
        loop {
            let wait = match ensure(&client, &settings, &serving).await {
                Ok(_) => CHECK_EVERY,
                Err(e) => {
                    tracing::warn!(target: "ballast::metrics_api", error = %e, "the metrics APIs' certificate");
                    Duration::from_secs(10)
                }
            };
            tokio::time::sleep(wait).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["ballast-metrics-api.ballast-system.svc".into()]
    }

    #[test]
    fn a_new_pair_serves_its_names_and_chains_to_its_ca() {
        let now = SystemTime::now();
        let pem = issue(None, Renewal::All, &names(), now).unwrap();
        assert_eq!(renewal(Some(&pem), &names(), now), Renewal::Keep);
        assert!(pair_from_pem(&pem.tls_crt, &pem.tls_key).is_ok());
        let (_, san) = facts(&pem.tls_crt).unwrap();
        assert_eq!(san, names());
        // It verifies against the CA as a server certificate for that name.
        let mut roots = rustls::RootCertStore::empty();
        let ca: rustls::pki_types::CertificateDer =
            rustls::pki_types::pem::PemObject::from_pem_slice(pem.ca_crt.as_bytes()).unwrap();
        roots.add(ca).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf: rustls::pki_types::CertificateDer =
            rustls::pki_types::pem::PemObject::from_pem_slice(pem.tls_crt.as_bytes()).unwrap();
        rustls::client::danger::ServerCertVerifier::verify_server_cert(
            verifier.as_ref(),
            &leaf,
            &[],
            &rustls::pki_types::ServerName::try_from("ballast-metrics-api.ballast-system.svc")
                .unwrap(),
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .unwrap();
    }

    #[test]
    fn renewal_before_expiry_keeps_the_ca_and_other_names_need_a_new_pair() {
        let now = SystemTime::now();
        let pem = issue(None, Renewal::All, &names(), now).unwrap();
        // 340 days on, the serving certificate has less than 30 days left: a new one from
        // the same CA, so the caBundle does not change.
        let later = now + Duration::from_secs(340 * 24 * 3600);
        assert_eq!(renewal(Some(&pem), &names(), later), Renewal::Serving);
        let renewed = issue(Some(&pem), Renewal::Serving, &names(), later).unwrap();
        assert_eq!(renewed.ca_crt, pem.ca_crt);
        assert_ne!(renewed.tls_crt, pem.tls_crt);
        assert_eq!(renewal(Some(&renewed), &names(), later), Renewal::Keep);
        // Another Service name: a new serving certificate.
        let other = vec!["other.ns.svc".to_string()];
        assert_eq!(renewal(Some(&pem), &other, now), Renewal::Serving);
        // Nine and a half years on, the CA itself: a new CA, the old one still in the bundle.
        let late = now + Duration::from_secs(3470 * 24 * 3600);
        assert_eq!(renewal(Some(&pem), &names(), late), Renewal::All);
        let fresh = issue(Some(&pem), Renewal::All, &names(), late).unwrap();
        assert_ne!(fresh.ca_crt, pem.ca_crt);
        assert_eq!(fresh.ca_bundle(), format!("{}{}", fresh.ca_crt, pem.ca_crt));
        // Garbage in the Secret: all new.
        let broken = Pem {
            ca_key: "nope".into(),
            ..pem.clone()
        };
        assert_eq!(renewal(Some(&broken), &names(), now), Renewal::All);
        assert_eq!(renewal(None, &names(), now), Renewal::All);
    }
}
