//! The pool: the endpoints requests may go to, what the gateway has in flight on each,
//! and the pick.
//!
//! The endpoint set is replaced whole whenever its source changes (the `--endpoints` list
//! once, the pods of a selector as they change); an endpoint that stays keeps its state,
//! so requests in flight across a change are still counted where they went.
//!
//! The pick is the endpoint with the fewest requests the gateway itself has in flight
//! there, ties broken round robin. A request counts from its pick until its response
//! ends or its stream closes ([`InFlight`]), so a burst spreads even before any engine
//! reports it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// One endpoint of the pool: where requests go, and its name for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// `ip:port` as Envoy receives it in `x-gateway-destination-endpoint`.
    pub addr: SocketAddr,
    /// The pod's name, or the address when there is no pod.
    pub name: String,
}

impl Endpoint {
    /// An endpoint named by its address (`--endpoints`).
    pub fn at(addr: SocketAddr) -> Endpoint {
        Endpoint {
            addr,
            name: addr.to_string(),
        }
    }
}

/// What the gateway knows of one endpoint.
#[derive(Debug)]
pub struct EndpointState {
    /// The endpoint.
    pub endpoint: Endpoint,
    in_flight: AtomicU64,
}

impl EndpointState {
    /// Requests the gateway has sent here that have not finished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Why a pick went where it did: the `reason` label of the picks counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickReason {
    /// The endpoint with the fewest requests in flight from the gateway.
    LeastInFlight,
    /// As [`PickReason::LeastInFlight`], among the endpoints of the request's subset hint.
    Subset,
}

impl PickReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PickReason::LeastInFlight => "least_in_flight",
            PickReason::Subset => "subset",
        }
    }
}

/// Why no endpoint was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPick {
    /// The pool has no endpoint at all.
    Empty,
    /// The request's subset hint names no endpoint of the pool.
    NotInSubset,
}

/// A request counted in flight on its endpoint until this is dropped.
#[derive(Debug)]
pub struct InFlight {
    state: Arc<EndpointState>,
    /// Why it went there.
    pub reason: PickReason,
}

impl InFlight {
    /// The endpoint the request goes to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.state.endpoint
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The endpoints and the picker.
#[derive(Debug, Default)]
pub struct Pool {
    endpoints: RwLock<Vec<Arc<EndpointState>>>,
    /// Where the round-robin tie break starts next.
    next: AtomicUsize,
}

impl Pool {
    /// An empty pool.
    pub fn new() -> Pool {
        Pool::default()
    }

    /// Replaces the endpoint set; endpoints in both keep their state. Duplicates count once.
    pub fn set(&self, mut endpoints: Vec<Endpoint>) {
        endpoints.sort();
        endpoints.dedup_by(|a, b| a.addr == b.addr);
        let mut current = self.endpoints.write().unwrap_or_else(|e| e.into_inner());
        let mut old: HashMap<SocketAddr, Arc<EndpointState>> =
            current.drain(..).map(|s| (s.endpoint.addr, s)).collect();
        *current = endpoints
            .into_iter()
            .map(|e| match old.remove(&e.addr) {
                Some(s) if s.endpoint == e => s,
                // Same address, a new pod behind it: what was in flight was the old pod's.
                _ => Arc::new(EndpointState {
                    endpoint: e,
                    in_flight: AtomicU64::new(0),
                }),
            })
            .collect();
    }

    /// The endpoints now.
    pub fn endpoints(&self) -> Vec<Arc<EndpointState>> {
        self.endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many endpoints there are.
    pub fn len(&self) -> usize {
        self.endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether the pool has no endpoint.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Picks an endpoint, among `subset` when the request carries a hint, and counts the
    /// request in flight there.
    pub fn pick(&self, subset: Option<&[SocketAddr]>) -> Result<InFlight, NoPick> {
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        if endpoints.is_empty() {
            return Err(NoPick::Empty);
        }
        let allowed = |s: &EndpointState| subset.is_none_or(|set| set.contains(&s.endpoint.addr));
        let n = endpoints.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let best = (0..n)
            .map(|i| &endpoints[(start + i) % n])
            .filter(|s| allowed(s))
            .min_by_key(|s| s.in_flight())
            .ok_or(NoPick::NotInSubset)?;
        best.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(InFlight {
            state: Arc::clone(best),
            reason: if subset.is_some() {
                PickReason::Subset
            } else {
                PickReason::LeastInFlight
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn pool(ports: &[u16]) -> Pool {
        let p = Pool::new();
        p.set(ports.iter().map(|&port| Endpoint::at(addr(port))).collect());
        p
    }

    #[test]
    fn an_empty_pool_picks_nothing() {
        assert_eq!(Pool::new().pick(None).unwrap_err(), NoPick::Empty);
    }

    #[test]
    fn picks_spread_over_the_pool_while_requests_are_in_flight() {
        let p = pool(&[1, 2, 3]);
        let held: Vec<InFlight> = (0..6).map(|_| p.pick(None).unwrap()).collect();
        for s in p.endpoints() {
            assert_eq!(s.in_flight(), 2, "{:?}", s.endpoint);
        }
        drop(held);
        assert!(p.endpoints().iter().all(|s| s.in_flight() == 0));
    }

    #[test]
    fn the_least_loaded_endpoint_wins() {
        let p = pool(&[1, 2]);
        let _a = p.pick(None).unwrap();
        let _b = p.pick(None).unwrap();
        let c = p.pick(None).unwrap();
        // Two in flight where `c` went, one on the other: the next pick goes to the other,
        // whichever the round robin starts at.
        let busy = c.endpoint().addr;
        for _ in 0..4 {
            let d = p.pick(None).unwrap();
            assert_ne!(d.endpoint().addr, busy);
        }
    }

    #[test]
    fn a_subset_hint_restricts_the_pick() {
        let p = pool(&[1, 2, 3]);
        for _ in 0..5 {
            let f = p.pick(Some(&[addr(3)])).unwrap();
            assert_eq!((f.endpoint().addr, f.reason), (addr(3), PickReason::Subset));
            std::mem::forget(f);
        }
        assert_eq!(p.pick(Some(&[addr(9)])).unwrap_err(), NoPick::NotInSubset);
        assert_eq!(p.pick(Some(&[])).unwrap_err(), NoPick::NotInSubset);
    }

    #[test]
    fn endpoints_that_stay_keep_their_count() {
        let p = pool(&[1, 2]);
        let held = p.pick(Some(&[addr(2)])).unwrap();
        p.set(vec![
            Endpoint::at(addr(2)),
            Endpoint::at(addr(3)),
            Endpoint::at(addr(3)),
        ]);
        assert_eq!(p.len(), 2);
        let counts: Vec<(SocketAddr, u64)> = p
            .endpoints()
            .iter()
            .map(|s| (s.endpoint.addr, s.in_flight()))
            .collect();
        assert_eq!(counts, vec![(addr(2), 1), (addr(3), 0)]);
        drop(held);
        assert_eq!(p.endpoints()[0].in_flight(), 0);
        // A request that finishes after its endpoint left touches nothing in the pool.
        let gone = p.pick(Some(&[addr(3)])).unwrap();
        p.set(vec![]);
        drop(gone);
        assert!(p.is_empty());
    }
}
