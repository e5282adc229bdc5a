//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several operator
//! replicas exactly one scrapes, decides and writes.
//!
//! The holder renews the lease every third of its duration. A candidate takes the lease
//! only when it is free or its holder has not renewed it for a whole duration. Every write
//! carries the `resourceVersion` it read, so two candidates racing for an expired lease
//! cannot both win: the API server refuses the second with a conflict. A holder that
//! cannot renew before its own lease would expire steps down (the caller stops acting and
//! exits, and the restarted process comes back as a candidate).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

/// A candidate for one lease.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This candidate holds the lease now (acquired or renewed).
    Leader,
    /// Someone else holds it.
    Held {
        /// The holder.
        by: String,
    },
}

/// Whether a lease held by someone else can be taken at `now`: no holder, or its last
/// renewal is a whole lease duration old.
pub fn is_free(spec: &LeaseSpec, now: Timestamp) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return true;
    }
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    renewed.0 + SignedDuration::from_secs(seconds) < now
}

impl Elector {
    /// A candidate `identity` for the lease `name` in `api`'s namespace, held for
    /// `duration` after each renewal.
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// How often the holder renews.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    fn spec(&self, now: Timestamp, acquired: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Acquires, renews or observes the lease once.
    pub async fn try_acquire(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leader),
                // Another candidate created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Held {
                    by: "another candidate".into(),
                }),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let (acquired, transitions) = if holder == self.identity {
            (
                spec.acquire_time.map_or(now, |t| t.0),
                spec.lease_transitions.unwrap_or(0),
            )
        } else if is_free(&spec, now) {
            (now, spec.lease_transitions.unwrap_or(0) + 1)
        } else {
            return Ok(Attempt::Held { by: holder });
        };
        lease.spec = Some(self.spec(now, acquired, transitions));
        // `replace` sends the resourceVersion just read: a concurrent writer makes it 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Leader),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Held {
                by: "another candidate (conflict)".into(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Waits until this candidate holds the lease, trying every `retry`.
    pub async fn acquire(&self, retry: Duration) {
        loop {
            match self.try_acquire().await {
                Ok(Attempt::Leader) => return,
                Ok(Attempt::Held { by }) => {
                    tracing::debug!(target: "ballast::operator", holder = %by, "standing by");
                }
                Err(e) => {
                    tracing::warn!(target: "ballast::operator", error = %e, "cannot read the leader lease");
                }
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews the lease until it cannot: returns when another candidate holds it, or when
    /// no renewal succeeded for a whole lease duration (the holder must then stop acting).
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_every()).await;
            match self.try_acquire().await {
                Ok(Attempt::Leader) => last_ok = tokio::time::Instant::now(),
                Ok(Attempt::Held { by }) => {
                    tracing::error!(target: "ballast::operator", holder = %by, "lost the leader lease");
                    return;
                }
                Err(e) => {
                    tracing::warn!(target: "ballast::operator", error = %e, "cannot renew the leader lease");
                    // Step down before the lease can expire and a standby take over, so two
                    // leaders never act at once.
                    if last_ok.elapsed() + self.renew_every() >= self.duration {
                        tracing::error!(target: "ballast::operator", "leader lease not renewed in time; stepping down");
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_free_when_unheld_or_expired() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let held = |renewed: i64| LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..LeaseSpec::default()
        };
        assert!(is_free(&LeaseSpec::default(), t0));
        assert!(!is_free(&held(990), t0), "renewed 10 s ago, 15 s lease");
        assert!(is_free(&held(980), t0), "20 s ago: expired");
        let empty_holder = LeaseSpec {
            holder_identity: Some(String::new()),
            ..held(999)
        };
        assert!(is_free(&empty_holder, t0), "released");
    }
}
