//! The pool: the endpoints requests may go to, what the gateway knows of each (its last
//! scrape, what the gateway itself has in flight there, recent 429s), and the pick.
//!
//! The endpoint set is replaced whole whenever its source changes (the `--endpoints` list
//! once, the pods of a selector as they change); an endpoint that stays keeps its state,
//! so requests in flight across a change are still counted where they went.
//!
//! The pick is the endpoint with the lowest [score](crate::score), ties (scores within a
//! quarter of a request) broken round robin.
//! A request counts from its pick until its response ends or its stream closes
//! ([`InFlight`]). The pool is *saturated* when every endpoint a request may go to is
//! ([`Scoring::saturated`]); [`Pool::changed`] wakes requests held for that to end.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ballast_operator::scrape::aggregate::series_increase;
use ballast_operator::signals::{CounterSeries, ReplicaSample};
use tokio::sync::{Notify, watch};

use crate::prefix::SentBlocks;
use crate::score::{Load, RankSnapshot, Scoring, Snapshot};

/// Scores closer than this are a tie, broken round robin: idle engines whose KV usage
/// differs by a few cached blocks share the requests instead of the one with the fewest
/// getting every request sent one after another.
const TIE: f64 = 0.25;

/// Prompt blocks remembered per endpoint by default (`--prefix-cache-blocks`): about a
/// quarter of a million tokens, the prefix cache of a mid-sized GPU replica.
pub const DEFAULT_PREFIX_BLOCKS: usize = 16_384;

/// Consecutive scrapes that could not reach an endpoint (connection refused or dropped
/// before a response) after which it is *unreachable*: not picked while another endpoint
/// the request may go to is reachable.
pub const UNREACHABLE_AFTER: u32 = 2;

/// How long a 429 keeps counting: the recent-429 rate decays with this time constant.
pub const REJECTION_MEMORY: Duration = Duration::from_secs(1);

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

/// A count that decays exponentially with [`REJECTION_MEMORY`]: `value / τ` estimates the
/// recent rate of what is added to it.
#[derive(Debug, Clone, Copy, Default)]
struct Decaying {
    value: f64,
    at: Option<Instant>,
}

impl Decaying {
    fn at(&self, now: Instant) -> f64 {
        match self.at {
            Some(t) => {
                let dt = now.saturating_duration_since(t).as_secs_f64();
                self.value * (-dt / REJECTION_MEMORY.as_secs_f64()).exp()
            }
            None => 0.0,
        }
    }

    fn add(&mut self, now: Instant, n: f64) {
        self.value = self.at(now) + n;
        self.at = Some(now);
    }

    fn rate(&self, now: Instant) -> f64 {
        self.at(now) / REJECTION_MEMORY.as_secs_f64()
    }
}

/// Requests the gateway sent somewhere and those of them that finished, ever.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    sent: u64,
    done: u64,
}

impl Counts {
    /// Requests added since `seen`: sent since, less finished since, at least 0. Never
    /// below: a request that finished after the scrape began may have finished before the
    /// engine wrote its numbers, and counting it down again would pile requests onto the
    /// endpoint whose scrape happened to miss it.
    fn since(&self, seen: &Counts) -> i64 {
        let sent = self.sent.saturating_sub(seen.sent);
        let done = self.done.saturating_sub(seen.done);
        (sent as i64 - done as i64).max(0)
    }
}

/// The gateway's own counts for an endpoint or a rank, against the scrapes.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// Now.
    now: Counts,
    /// When the scrape in progress began.
    mark: Counts,
    /// When the last usable scrape began: what its numbers may show.
    seen: Counts,
}

impl Tally {
    fn since_scrape(&self) -> i64 {
        self.now.since(&self.seen)
    }
}

/// What the scrapes and responses of one endpoint said.
#[derive(Debug, Default)]
struct Observed {
    /// The last usable scrape's load, and when it was read.
    load: Option<(Load, Instant)>,
    /// The gateway's requests to the endpoint.
    tally: Tally,
    /// Each DP rank's load at the last usable scrape and the gateway's requests to it
    /// (empty: no ranks).
    ranks: Vec<(Load, Tally)>,
    /// The engine's admission-rejection counter at the last scrape that carried it.
    rejections: Option<CounterSeries>,
    /// Rejections the engine counted, recently.
    engine_429: Decaying,
    /// 429 responses the gateway passed back, recently.
    seen_429: Decaying,
}

/// What the gateway knows of one endpoint.
#[derive(Debug)]
pub struct EndpointState {
    /// The endpoint.
    pub endpoint: Endpoint,
    in_flight: AtomicU64,
    observed: Mutex<Observed>,
    /// The prompt blocks the gateway sent here (to each rank).
    blocks: Mutex<SentBlocks>,
    /// Scrapes in a row that could not reach the endpoint.
    unreached: AtomicU32,
}

impl EndpointState {
    fn new(endpoint: Endpoint, prefix_blocks: usize) -> EndpointState {
        EndpointState {
            endpoint,
            in_flight: AtomicU64::new(0),
            observed: Mutex::default(),
            blocks: Mutex::new(SentBlocks::new(prefix_blocks)),
            unreached: AtomicU32::new(0),
        }
    }

    /// A scrape could not reach the endpoint: refused, or dropped before a response.
    pub fn unreached(&self) {
        self.unreached.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the endpoint answered one of its last [`UNREACHABLE_AFTER`] scrapes (a
    /// slow or failing `/metrics` that answers is reachable: it is only stale).
    pub fn reachable(&self) -> bool {
        self.unreached.load(Ordering::Relaxed) < UNREACHABLE_AFTER
    }

    fn blocks(&self) -> std::sync::MutexGuard<'_, SentBlocks> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prompt blocks remembered here.
    pub fn prefix_blocks(&self) -> usize {
        self.blocks().len()
    }

    fn observed(&self) -> std::sync::MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests the gateway has sent here that have not finished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A scrape starts: requests sent or finished from now on, its numbers may not show.
    pub fn scrape_began(&self) {
        let mut o = self.observed();
        o.tally.mark = o.tally.now;
        for (_, t) in &mut o.ranks {
            t.mark = t.now;
        }
    }

    /// A usable scrape, begun at the last [`EndpointState::scrape_began`], read at `now`.
    pub fn observe(&self, now: Instant, sample: &ReplicaSample) {
        let load = Load {
            capacity_waiting: sample.waiting_capacity.unwrap_or(0.0),
            deferred_waiting: sample.waiting_deferred.unwrap_or(0.0),
            running: sample.running.unwrap_or(0.0),
            kv_usage: sample.kv_usage.unwrap_or(0.0),
        };
        self.unreached.store(0, Ordering::Relaxed);
        let mut o = self.observed();
        o.load = Some((load, now));
        o.tally.seen = o.tally.mark;
        let same_ranks = o.ranks.len() == sample.ranks.len();
        if !same_ranks {
            // The engine's ranks changed (or are first seen): nothing sent is pending.
            o.ranks = vec![(Load::default(), Tally::default()); sample.ranks.len()];
        }
        for ((l, t), r) in o.ranks.iter_mut().zip(&sample.ranks) {
            *l = Load {
                capacity_waiting: r.waiting_capacity,
                deferred_waiting: r.waiting_deferred,
                running: r.running,
                kv_usage: r.kv_usage,
            };
            t.seen = t.mark;
        }
        if let Some(cur) = &sample.rejections_total {
            if let Some(prev) = &o.rejections {
                let n = series_increase(prev, cur);
                o.engine_429.add(now, n);
            }
            o.rejections = Some(cur.clone());
        }
    }

    /// A request sent here, to `rank` if one was picked.
    fn count_sent(&self, rank: Option<usize>) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.tally(rank, |c| c.sent += 1);
    }

    /// A request sent here (to `rank`) finished.
    fn count_done(&self, rank: Option<usize>) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.tally(rank, |c| c.done += 1);
    }

    /// Applies `f` to the endpoint's counts and to `rank`'s, if it still has that rank.
    fn tally(&self, rank: Option<usize>, f: impl Fn(&mut Counts)) {
        let mut o = self.observed();
        f(&mut o.tally.now);
        if let Some((_, t)) = rank.and_then(|r| o.ranks.get_mut(r)) {
            f(&mut t.now);
        }
    }

    /// A 429 from this endpoint passed back to a client at `now`.
    pub fn observe_429(&self, now: Instant) {
        self.observed().seen_429.add(now, 1.0);
    }

    /// The last scrape's load and when it was read.
    pub fn load(&self) -> Option<(Load, Instant)> {
        self.observed().load
    }

    /// Everything the score reads, at `now`.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let o = self.observed();
        Snapshot {
            load: o.load.map(|(l, at)| (l, now.saturating_duration_since(at))),
            ranks: o
                .ranks
                .iter()
                .map(|(load, t)| RankSnapshot {
                    load: *load,
                    since_scrape: t.since_scrape(),
                    prefix: 0.0,
                })
                .collect(),
            in_flight: self.in_flight(),
            since_scrape: o.tally.since_scrape(),
            rejections_per_second: o.engine_429.rate(now).max(o.seen_429.rate(now)),
            prefix: 0.0,
        }
    }

    /// Fills in the prefix match of a request with prompt blocks `prompt` on `snap`: per
    /// rank when `ranked`, else for the endpoint.
    fn match_prefix(&self, snap: &mut Snapshot, prompt: &[u64], ranked: bool) {
        if prompt.is_empty() {
            return;
        }
        let blocks = self.blocks();
        if ranked {
            for (i, r) in snap.ranks.iter_mut().enumerate() {
                r.prefix = blocks.matched(prompt, Some(i));
            }
        } else {
            snap.prefix = blocks.matched(prompt, None);
        }
    }
}

/// Why a pick went where it did: the `reason` label of the picks counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickReason {
    /// The lowest score, on fresh data.
    Score,
    /// The lowest score, where the endpoint's data was stale or missing: it was scored on
    /// the gateway's own in-flight count.
    InFlight,
    /// As either, where part of the request's prompt had been sent before (the prefix
    /// match counted).
    Prefix,
    /// As any of these, among the endpoints of the request's subset hint.
    Subset,
    /// The pool was saturated: the request was sent on after waiting in the gateway's
    /// queue, or without waiting when the queue was full.
    Saturated,
    /// Every endpoint the request may go to was unreachable; it went to the best of them
    /// anyway (the data plane answers if it cannot connect either).
    Unreachable,
}

impl PickReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PickReason::Score => "score",
            PickReason::InFlight => "in_flight",
            PickReason::Prefix => "prefix",
            PickReason::Subset => "subset",
            PickReason::Saturated => "saturated",
            PickReason::Unreachable => "unreachable",
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
    changed: Arc<Notify>,
    /// Why it went there.
    pub reason: PickReason,
    /// The DP rank it goes to, when the endpoint's ranks are scored.
    pub rank: Option<usize>,
    /// The prompt's prefix match there (on the rank), 0..1.
    pub prefix: f64,
}

impl InFlight {
    /// The endpoint the request goes to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.state.endpoint
    }

    /// What the gateway knows of it.
    pub fn state(&self) -> &EndpointState {
        &self.state
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.count_done(self.rank);
        self.changed.notify_waiters();
    }
}

/// The endpoints and the picker.
#[derive(Debug)]
pub struct Pool {
    endpoints: RwLock<Vec<Arc<EndpointState>>>,
    /// Where the round-robin tie break starts next.
    next: AtomicUsize,
    scoring: Scoring,
    /// Prompt blocks remembered per endpoint.
    prefix_blocks: usize,
    changed: Arc<Notify>,
    members: watch::Sender<u64>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new(Scoring::default(), DEFAULT_PREFIX_BLOCKS)
    }
}

impl Pool {
    /// An empty pool scoring with `scoring`, remembering about `prefix_blocks` prompt
    /// blocks per endpoint (0: no prefix affinity).
    pub fn new(scoring: Scoring, prefix_blocks: usize) -> Pool {
        Pool {
            endpoints: RwLock::default(),
            next: AtomicUsize::new(0),
            scoring,
            prefix_blocks,
            changed: Arc::default(),
            members: watch::Sender::new(0),
        }
    }

    /// How endpoints are scored.
    pub fn scoring(&self) -> &Scoring {
        &self.scoring
    }

    /// Woken (`notify_waiters`) whenever an endpoint's load may have fallen: a scrape
    /// read, a request finished, the endpoint set changed.
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Tell those waiting on [`Pool::changed`] that loads were read.
    pub fn loads_changed(&self) {
        self.changed.notify_waiters();
    }

    /// A receiver that sees every change of the endpoint set.
    pub fn members(&self) -> watch::Receiver<u64> {
        self.members.subscribe()
    }

    /// Replaces the endpoint set; endpoints in both keep their state. Duplicates count once.
    pub fn set(&self, mut endpoints: Vec<Endpoint>) {
        endpoints.sort();
        endpoints.dedup_by(|a, b| a.addr == b.addr);
        {
            let mut current = self.endpoints.write().unwrap_or_else(|e| e.into_inner());
            let mut old: HashMap<SocketAddr, Arc<EndpointState>> =
                current.drain(..).map(|s| (s.endpoint.addr, s)).collect();
            *current = endpoints
                .into_iter()
                .map(|e| match old.remove(&e.addr) {
                    Some(s) if s.endpoint == e => s,
                    // Same address, a new pod behind it: what was known was the old pod's.
                    _ => Arc::new(EndpointState::new(e, self.prefix_blocks)),
                })
                .collect();
        }
        self.members.send_modify(|v| *v += 1);
        self.changed.notify_waiters();
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

    /// How many endpoints are unreachable.
    pub fn unreachable(&self) -> usize {
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        endpoints.iter().filter(|s| !s.reachable()).count()
    }

    /// How many endpoints have no fresh data at `now`.
    pub fn stale(&self, now: Instant) -> usize {
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        endpoints
            .iter()
            .filter(|s| self.scoring.fresh(&s.snapshot(now)).is_none())
            .count()
    }

    /// Whether every endpoint a request may go to (all, or those of `subset`; the
    /// reachable ones, if any is) is saturated at `now`. An empty choice is not saturated:
    /// it has nothing to wait for.
    pub fn saturated(&self, subset: Option<&[SocketAddr]>, now: Instant) -> bool {
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        let reachable = endpoints
            .iter()
            .any(|s| allowed(subset, s) && s.reachable());
        let mut any = false;
        for s in endpoints
            .iter()
            .filter(|s| allowed(subset, s) && (s.reachable() || !reachable))
        {
            if !self.scoring.saturated(&s.snapshot(now)) {
                return false;
            }
            any = true;
        }
        any
    }

    /// Picks the endpoint with the lowest score at `now` for a request whose prompt has
    /// the block hashes `prompt` ([`crate::prefix::block_hashes`]; empty: load alone),
    /// among `subset` when the request carries a hint, counts the request in flight there
    /// and remembers its blocks there. `saturated`: the pool was, and the request waited
    /// or could not (the reason says so).
    pub fn pick(
        &self,
        subset: Option<&[SocketAddr]>,
        now: Instant,
        saturated: bool,
        prompt: &[u64],
    ) -> Result<InFlight, NoPick> {
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        if endpoints.is_empty() {
            return Err(NoPick::Empty);
        }
        let n = endpoints.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        // Unreachable endpoints only when every allowed one is.
        let reachable = endpoints
            .iter()
            .any(|s| allowed(subset, s) && s.reachable());
        let mut best: Option<(f64, &Arc<EndpointState>, Snapshot)> = None;
        for s in (0..n).map(|i| &endpoints[(start + i) % n]) {
            if !allowed(subset, s) || (reachable && !s.reachable()) {
                continue;
            }
            let mut snap = s.snapshot(now);
            let ranked = self.scoring.ranked(&snap);
            s.match_prefix(&mut snap, prompt, ranked);
            let score = self.scoring.score(&snap);
            if best.as_ref().is_none_or(|(b, _, _)| score < *b - TIE) {
                best = Some((score, s, snap));
            }
        }
        let (_, best, snap) = best.ok_or(NoPick::NotInSubset)?;
        let fresh = self.scoring.fresh(&snap).is_some();
        let rank = self.scoring.rank(&snap).map(|(r, _)| r);
        let prefix = rank.map_or(snap.prefix, |r| snap.ranks[r].prefix);
        best.count_sent(rank);
        if !prompt.is_empty() {
            best.blocks().sent(prompt, rank);
        }
        let reason = match (saturated, subset.is_some(), prefix > 0.0, fresh) {
            _ if !reachable => PickReason::Unreachable,
            (true, ..) => PickReason::Saturated,
            (false, true, ..) => PickReason::Subset,
            (false, false, true, _) => PickReason::Prefix,
            (false, false, false, true) => PickReason::Score,
            (false, false, false, false) => PickReason::InFlight,
        };
        Ok(InFlight {
            state: Arc::clone(best),
            changed: Arc::clone(&self.changed),
            reason,
            rank,
            prefix,
        })
    }
}

fn allowed(subset: Option<&[SocketAddr]>, s: &EndpointState) -> bool {
    subset.is_none_or(|set| set.contains(&s.endpoint.addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn pool(ports: &[u16]) -> Pool {
        let p = Pool::default();
        p.set(ports.iter().map(|&port| Endpoint::at(addr(port))).collect());
        p
    }

    #[test]
    fn an_empty_pool_picks_nothing() {
        assert_eq!(
            Pool::default()
                .pick(None, Instant::now(), false, &[])
                .unwrap_err(),
            NoPick::Empty
        );
    }

    #[test]
    fn picks_spread_over_the_pool_while_requests_are_in_flight() {
        let p = pool(&[1, 2, 3]);
        let held: Vec<InFlight> = (0..6)
            .map(|_| p.pick(None, Instant::now(), false, &[]).unwrap())
            .collect();
        for s in p.endpoints() {
            assert_eq!(s.in_flight(), 2, "{:?}", s.endpoint);
        }
        drop(held);
        assert!(p.endpoints().iter().all(|s| s.in_flight() == 0));
    }

    #[test]
    fn the_least_loaded_endpoint_wins() {
        let p = pool(&[1, 2]);
        let _a = p.pick(None, Instant::now(), false, &[]).unwrap();
        let _b = p.pick(None, Instant::now(), false, &[]).unwrap();
        let c = p.pick(None, Instant::now(), false, &[]).unwrap();
        // Two in flight where `c` went, one on the other: the next pick goes to the other,
        // whichever the round robin starts at.
        let busy = c.endpoint().addr;
        for _ in 0..4 {
            let d = p.pick(None, Instant::now(), false, &[]).unwrap();
            assert_ne!(d.endpoint().addr, busy);
        }
    }

    #[test]
    fn a_subset_hint_restricts_the_pick() {
        let p = pool(&[1, 2, 3]);
        for _ in 0..5 {
            let f = p
                .pick(Some(&[addr(3)]), Instant::now(), false, &[])
                .unwrap();
            assert_eq!((f.endpoint().addr, f.reason), (addr(3), PickReason::Subset));
            std::mem::forget(f);
        }
        assert_eq!(
            p.pick(Some(&[addr(9)]), Instant::now(), false, &[])
                .unwrap_err(),
            NoPick::NotInSubset
        );
        assert_eq!(
            p.pick(Some(&[]), Instant::now(), false, &[]).unwrap_err(),
            NoPick::NotInSubset
        );
    }

    #[test]
    fn endpoints_that_stay_keep_their_count() {
        let p = pool(&[1, 2]);
        let held = p
            .pick(Some(&[addr(2)]), Instant::now(), false, &[])
            .unwrap();
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
        let gone = p
            .pick(Some(&[addr(3)]), Instant::now(), false, &[])
            .unwrap();
        p.set(vec![]);
        drop(gone);
        assert!(p.is_empty());
    }

    fn sample(waiting: f64, deferred: f64, running: f64, kv: f64) -> ReplicaSample {
        ReplicaSample {
            waiting_capacity: Some(waiting),
            waiting_deferred: Some(deferred),
            running: Some(running),
            kv_usage: Some(kv),
            ..ReplicaSample::default()
        }
    }

    fn state(p: &Pool, port: u16) -> Arc<EndpointState> {
        p.endpoints()
            .into_iter()
            .find(|s| s.endpoint.addr == addr(port))
            .unwrap()
    }

    #[test]
    fn fresh_loads_steer_the_pick() {
        let p = pool(&[1, 2, 3]);
        let now = Instant::now();
        state(&p, 1).observe(now, &sample(3.0, 0.0, 4.0, 0.2));
        state(&p, 2).observe(now, &sample(0.0, 30.0, 1.0, 0.1));
        state(&p, 3).observe(now, &sample(0.0, 0.0, 2.0, 0.1));
        // 2 is the least loaded: its deferred requests are not load.
        let f = p.pick(None, now, false, &[]).unwrap();
        assert_eq!((f.endpoint().addr, f.reason), (addr(2), PickReason::Score));
        // Two more sent there since its scrape: 3 (score 2.4) now beats 2 (1.4 + 2).
        let _g = p.pick(None, now, false, &[]).unwrap();
        let h = p.pick(None, now, false, &[]).unwrap();
        assert_eq!(h.endpoint().addr, addr(3));
        // A new scrape of 2 starts: what was sent counts as the engine's own numbers again.
        let s2 = state(&p, 2);
        s2.scrape_began();
        s2.observe(now, &sample(0.0, 30.0, 1.0, 0.1));
        assert_eq!(
            p.pick(None, now, false, &[]).unwrap().endpoint().addr,
            addr(2)
        );
    }

    #[test]
    fn requests_that_finish_before_the_next_scrape_count_down() {
        let p = pool(&[1, 2]);
        let now = Instant::now();
        for (port, running) in [(1, 2.0), (2, 2.5)] {
            let s = state(&p, port);
            s.scrape_began();
            s.observe(now, &sample(0.0, 0.0, running, 0.0));
        }
        // Sent after the scrape: it counts on 1 until it finishes, then no more (and
        // never below zero), so 1 (2) stays below 2 (2.5).
        let one = p.pick(Some(&[addr(1)]), now, false, &[]).unwrap();
        assert_eq!(state(&p, 1).snapshot(now).since_scrape, 1);
        assert_eq!(
            p.pick(None, now, false, &[]).unwrap().endpoint().addr,
            addr(2)
        );
        drop(one);
        assert_eq!(state(&p, 1).snapshot(now).since_scrape, 0);
        for _ in 0..3 {
            let f = p.pick(None, now, false, &[]).unwrap();
            assert_eq!(f.endpoint().addr, addr(1));
            drop(f);
        }
        assert_eq!(state(&p, 1).snapshot(now).since_scrape, 0);
    }

    #[test]
    fn stale_endpoints_are_scored_on_in_flight_and_keep_getting_requests() {
        let p = pool(&[1, 2]);
        let t0 = Instant::now();
        state(&p, 1).observe(t0, &sample(0.0, 0.0, 6.0, 0.3));
        state(&p, 2).observe(t0, &sample(0.0, 0.0, 1.0, 0.1));
        assert_eq!(p.stale(t0), 0);
        let later = t0 + Duration::from_secs(5);
        assert_eq!(p.stale(later), 2);
        // Both stale: the in-flight count alone decides, so they alternate.
        let a = p.pick(None, later, false, &[]).unwrap();
        let b = p.pick(None, later, false, &[]).unwrap();
        assert_ne!(a.endpoint().addr, b.endpoint().addr);
        assert_eq!(a.reason, PickReason::InFlight);
    }

    #[test]
    fn the_pool_is_saturated_only_when_every_allowed_endpoint_is() {
        let p = pool(&[1, 2]);
        let now = Instant::now();
        assert!(!p.saturated(None, now), "no data is not saturation");
        state(&p, 1).observe(now, &sample(9.0, 0.0, 8.0, 0.5));
        assert!(!p.saturated(None, now));
        assert!(p.saturated(Some(&[addr(1)]), now));
        state(&p, 2).observe(now, &sample(0.0, 0.0, 8.0, 0.95));
        assert!(p.saturated(None, now));
        assert!(!p.saturated(Some(&[addr(7)]), now));
        assert!(
            !p.saturated(None, now + Duration::from_secs(1)),
            "stale data is not saturation"
        );
        let f = p.pick(None, now, true, &[]).unwrap();
        assert_eq!(f.reason, PickReason::Saturated);
    }

    #[test]
    fn recent_429s_push_an_endpoint_down_and_fade() {
        let p = pool(&[1, 2]);
        let t0 = Instant::now();
        for s in p.endpoints() {
            s.observe(t0, &sample(0.0, 0.0, 1.0, 0.0));
        }
        state(&p, 1).observe_429(t0);
        for _ in 0..4 {
            let f = p.pick(None, t0, false, &[]).unwrap();
            assert_eq!(f.endpoint().addr, addr(2));
        }
        // The engine's own counter counts too, per series, between two scrapes.
        let mut with = sample(0.0, 0.0, 1.0, 0.0);
        with.rejections_total = Some([("reason=\"queue\"".to_string(), 10.0)].into());
        let s2 = state(&p, 2);
        s2.observe(t0, &with);
        with.rejections_total = Some([("reason=\"queue\"".to_string(), 13.0)].into());
        s2.observe(t0, &with);
        assert!((s2.snapshot(t0).rejections_per_second - 3.0).abs() < 1e-9);
        let faded = s2
            .snapshot(t0 + Duration::from_secs(10))
            .rejections_per_second;
        assert!(faded < 0.001, "{faded}");
    }

    #[test]
    fn requests_that_share_a_prefix_follow_it_until_its_endpoint_is_busy() {
        let p = pool(&[1, 2, 3]);
        let now = Instant::now();
        for s in p.endpoints() {
            s.observe(now, &sample(0.0, 0.0, 1.0, 0.0));
        }
        let blocking = crate::prefix::Blocking::default();
        let system = "You answer questions about the tax code. ".repeat(20);
        let prompt = |user: &str| {
            crate::prefix::block_hashes(Some("m"), format!("{system}{user}").as_bytes(), blocking)
        };
        let first = p.pick(None, now, false, &prompt("Who pays?")).unwrap();
        assert_eq!((first.reason, first.prefix), (PickReason::Score, 0.0));
        let home = first.endpoint().addr;
        assert_eq!(
            state(&p, home.port()).prefix_blocks(),
            prompt("Who pays?").len()
        );
        drop(first);
        for user in ["When is it due?", "May I deduct my cat?", "What is a 1099?"] {
            let f = p.pick(None, now, false, &prompt(user)).unwrap();
            assert_eq!(
                (f.endpoint().addr, f.reason),
                (home, PickReason::Prefix),
                "{user}"
            );
            assert!(f.prefix > 0.8, "{}", f.prefix);
            drop(f);
        }
        // Another prefix is free to go elsewhere; and a busy home is left.
        let other = crate::prefix::block_hashes(Some("m"), &[b'z'; 640], blocking);
        assert_ne!(
            p.pick(None, now, false, &other).unwrap().endpoint().addr,
            home
        );
        state(&p, home.port()).observe(now, &sample(0.0, 0.0, 9.0, 0.0));
        let f = p.pick(None, now, false, &prompt("And now?")).unwrap();
        assert_ne!(f.endpoint().addr, home);
    }

    #[test]
    fn a_prefix_follows_the_rank_it_went_to() {
        let p = pool(&[1]);
        let now = Instant::now();
        let s = state(&p, 1);
        let two_ranks = |running: [f64; 2]| ReplicaSample {
            ranks: running
                .iter()
                .map(|&r| ballast_operator::signals::RankLoad {
                    running: r,
                    ..Default::default()
                })
                .collect(),
            ..sample(0.0, 0.0, running.iter().sum(), 0.0)
        };
        s.observe(now, &two_ranks([1.0, 0.0]));
        let prompt = crate::prefix::block_hashes(None, &[b'a'; 256], Default::default());
        let f = p.pick(None, now, false, &prompt).unwrap();
        assert_eq!(f.rank, Some(1));
        drop(f);
        // Rank 1 now a little busier than rank 0, but it holds the prefix.
        s.scrape_began();
        s.observe(now, &two_ranks([0.0, 2.0]));
        let f = p.pick(None, now, false, &prompt).unwrap();
        assert_eq!((f.rank, f.prefix), (Some(1), 1.0));
    }

    #[test]
    fn unreachable_endpoints_get_nothing_while_another_is_reachable() {
        let p = pool(&[1, 2]);
        let now = Instant::now();
        let gone = state(&p, 1);
        gone.unreached();
        assert!(gone.reachable(), "one failed scrape is not enough");
        gone.unreached();
        assert!(!gone.reachable());
        assert_eq!(p.unreachable(), 1);
        for _ in 0..4 {
            let f = p.pick(None, now, false, &[]).unwrap();
            assert_eq!(f.endpoint().addr, addr(2));
        }
        // Its subset has nothing else: it goes there, and says why.
        let f = p.pick(Some(&[addr(1)]), now, false, &[]).unwrap();
        assert_eq!(
            (f.endpoint().addr, f.reason),
            (addr(1), PickReason::Unreachable)
        );
        // The other saturated: the pool is, the unreachable one does not count.
        state(&p, 2).observe(now, &sample(9.0, 0.0, 4.0, 0.2));
        assert!(p.saturated(None, now));
        // Back: one answered scrape.
        gone.observe(now, &sample(0.0, 0.0, 0.0, 0.0));
        assert!(gone.reachable() && !p.saturated(None, now));
    }

    #[test]
    fn a_finished_request_wakes_those_waiting() {
        let p = Arc::new(pool(&[1]));
        let f = p.pick(None, Instant::now(), false, &[]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let notified = p.changed().notified();
            drop(f);
            tokio::time::timeout(Duration::from_secs(1), notified)
                .await
                .expect("woken");
        });
    }
}
