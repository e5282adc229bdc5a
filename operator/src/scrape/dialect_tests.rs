//! The combination rules on small hand-made expositions; whole real-format expositions are
//! in `operator/tests/it/scrape_fixtures.rs`.

use super::*;
use crate::scrape::parser::parse;

fn ballast(text: &str) -> ReplicaSample {
    adapt(Dialect::Ballast, &parse(text))
}

#[test]
fn kv_usage_is_the_max_over_ranks_and_counts_are_summed() {
    let s = ballast(
        "ballast_kv_cache_usage_ratio{engine=\"0\"} 0.2\n\
         ballast_kv_cache_usage_ratio{engine=\"1\"} 0.9\n\
         ballast_num_requests_running{engine=\"0\"} 3\n\
         ballast_num_requests_running{engine=\"1\"} 4\n",
    );
    assert_eq!(s.kv_usage, Some(0.9));
    assert_eq!(s.running, Some(7.0));
    assert_eq!(s.waiting_capacity, None);
}

#[test]
fn out_of_range_values_make_the_field_none() {
    let s = ballast(
        "ballast_kv_cache_usage_ratio{engine=\"0\"} 0.2\n\
         ballast_kv_cache_usage_ratio{engine=\"1\"} 1.5\n\
         ballast_num_requests_running{engine=\"0\"} 3\n\
         ballast_num_requests_running{engine=\"1\"} -1\n\
         ballast_admission_rejections_total{engine=\"0\",reason=\"x\"} -4\n\
         ballast_num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 2\n",
    );
    assert_eq!(s.kv_usage, None);
    assert_eq!(s.running, None);
    assert_eq!(s.rejections_total, None);
    assert_eq!(s.waiting_capacity, Some(2.0));
    assert!(is_usable(&s));
}

#[test]
fn each_rank_has_its_own_load() {
    let s = ballast(
        "ballast_kv_cache_usage_ratio{engine=\"0\"} 0.2\n\
         ballast_kv_cache_usage_ratio{engine=\"1\"} 0.9\n\
         ballast_num_requests_running{engine=\"0\"} 3\n\
         ballast_num_requests_running{engine=\"1\"} 4\n\
         ballast_num_requests_waiting_by_reason{engine=\"1\",reason=\"capacity\"} 2\n\
         ballast_num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 0\n",
    );
    let r = |running, waiting_capacity, kv_usage| RankLoad {
        running,
        waiting_capacity,
        waiting_deferred: 0.0,
        kv_usage,
    };
    assert_eq!(s.ranks, [r(3.0, 0.0, 0.2), r(4.0, 2.0, 0.9)]);
}

#[test]
fn ranks_that_cannot_be_told_apart_are_no_ranks() {
    for (why, text) in [
        (
            "a gap",
            "ballast_num_requests_running{engine=\"0\"} 3\n\
             ballast_num_requests_running{engine=\"2\"} 4\n",
        ),
        (
            "a rank one gauge lacks",
            "ballast_num_requests_running{engine=\"0\"} 3\n\
             ballast_num_requests_running{engine=\"1\"} 4\n\
             ballast_kv_cache_usage_ratio{engine=\"0\"} 0.2\n",
        ),
        (
            "an unranked series",
            "ballast_num_requests_running{engine=\"0\"} 3\n\
             ballast_num_requests_running 4\n",
        ),
        (
            "a ratio out of range",
            "ballast_num_requests_running{engine=\"0\"} 3\n\
             ballast_kv_cache_usage_ratio{engine=\"0\"} 1.2\n",
        ),
        (
            "a negative count",
            "ballast_num_requests_running{engine=\"0\"} -3\n",
        ),
    ] {
        assert_eq!(ballast(text).ranks, [], "{why}");
    }
    let sglang = adapt(
        Dialect::Sglang,
        &parse(
            "sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 3\n\
             sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"1\"} 3\n\
             sglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"2\"} 5\n\
             sglang:num_queue_reqs{tp_rank=\"0\"} 1\n",
        ),
    );
    assert_eq!(sglang.running, Some(8.0));
    assert_eq!(sglang.ranks, [], "a queue gauge without dp_rank");
}

#[test]
fn nothing_of_the_dialect_is_not_usable() {
    assert!(!is_usable(&ballast(
        "vllm:num_requests_running{engine=\"0\"} 3\n"
    )));
    assert!(!is_usable(&adapt(
        Dialect::Vllm,
        &parse("ballast_num_requests_running 1\n")
    )));
}

#[test]
fn buckets_are_summed_by_le_and_checked() {
    let two = "h_bucket{engine=\"0\",le=\"0.1\"} 1\nh_bucket{engine=\"0\",le=\"+Inf\"} 2\n\
               h_bucket{engine=\"1\",le=\"0.1\"} 3\nh_bucket{engine=\"1\",le=\"+Inf\"} 5\n";
    let e = parse(two);
    assert_eq!(
        buckets(e.named("h_bucket")),
        vec![(0.1, 4.0), (f64::INFINITY, 7.0)]
    );
    // "1" and "1.0" are the same bound; order in the text does not matter.
    let e = parse("h_bucket{le=\"+Inf\"} 2\nh_bucket{le=\"1.0\"} 1\n");
    assert_eq!(
        buckets(e.named("h_bucket")),
        vec![(1.0, 1.0), (f64::INFINITY, 2.0)]
    );
    for bad in [
        "h_bucket{le=\"0.1\"} 1\n",                          // no +Inf
        "h_bucket{le=\"0.1\"} 3\nh_bucket{le=\"+Inf\"} 2\n", // decreasing
        "h_bucket{le=\"x\"} 3\nh_bucket{le=\"+Inf\"} 4\n",   // le not a number
        "h_bucket{le=\"NaN\"} 3\nh_bucket{le=\"+Inf\"} 4\n", // le NaN
        "h_bucket 3\n",                                      // no le
        "h_bucket{le=\"+Inf\"} -1\n",                        // negative
        "h_bucket{le=\"1\"} 1\nh_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 1\n", // same bound twice
        "h_bucket{e=\"0\",le=\"1\"} 1\nh_bucket{e=\"0\",le=\"+Inf\"} 1\n\
         h_bucket{e=\"1\",le=\"2\"} 1\nh_bucket{e=\"1\",le=\"+Inf\"} 1\n", // different bounds
    ] {
        let e = parse(bad);
        assert!(buckets(e.named("h_bucket")).is_empty(), "{bad}");
    }
}

#[test]
fn dp_tokens_need_dense_numeric_ranks() {
    let ok = ballast(
        "ballast_dp_tokens_total{engine=\"1\",kind=\"scheduled\"} 20\n\
         ballast_dp_tokens_total{engine=\"0\",kind=\"scheduled\"} 10\n\
         ballast_dp_tokens_total{engine=\"0\",kind=\"imbalance\"} 99\n",
    );
    assert_eq!(ok.dp_tokens, vec![10.0, 20.0]);
    for bad in [
        "ballast_dp_tokens_total{engine=\"0\",kind=\"scheduled\"} 1\n\
         ballast_dp_tokens_total{engine=\"2\",kind=\"scheduled\"} 1\n",
        "ballast_dp_tokens_total{engine=\"x\",kind=\"scheduled\"} 1\n",
        "ballast_dp_tokens_total{engine=\"+0\",kind=\"scheduled\"} 1\n",
        "ballast_dp_tokens_total{engine=\"999999\",kind=\"scheduled\"} 1\n",
        "ballast_dp_tokens_total{kind=\"scheduled\"} 1\n",
        "ballast_dp_tokens_total{engine=\"0\",kind=\"scheduled\"} -1\n",
    ] {
        assert!(ballast(bad).dp_tokens.is_empty(), "{bad}");
    }
}

#[test]
fn vllm_falls_back_to_legacy_names() {
    let s = adapt(
        Dialect::Vllm,
        &parse(
            "vllm:num_requests_waiting{engine=\"0\"} 5\n\
             vllm:gpu_cache_usage_perc{engine=\"0\"} 0.5\n",
        ),
    );
    assert_eq!(s.waiting_capacity, Some(5.0));
    assert_eq!(s.waiting_deferred, None);
    assert_eq!(s.kv_usage, Some(0.5));
    // The newer names win when both are present.
    let s = adapt(
        Dialect::Vllm,
        &parse(
            "vllm:num_requests_waiting{engine=\"0\"} 5\n\
             vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 3\n\
             vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"deferred\"} 2\n\
             vllm:gpu_cache_usage_perc{engine=\"0\"} 0.5\n\
             vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n",
        ),
    );
    assert_eq!(
        (s.waiting_capacity, s.waiting_deferred),
        (Some(3.0), Some(2.0))
    );
    assert_eq!(s.kv_usage, Some(0.25));
}

#[test]
fn sglang_folds_mirrored_schedulers_per_dp_rank() {
    // Two TP schedulers of rank 0 mirror each other; rank 1 is alone.
    let s = adapt(
        Dialect::Sglang,
        &parse(
            "sglang:num_queue_reqs{dp_rank=\"0\",tp_rank=\"0\"} 4\n\
             sglang:num_queue_reqs{dp_rank=\"0\",tp_rank=\"1\"} 4\n\
             sglang:num_queue_reqs{dp_rank=\"1\",tp_rank=\"2\"} 1\n\
             sglang:token_usage{dp_rank=\"0\",tp_rank=\"0\"} 0.3\n\
             sglang:token_usage{dp_rank=\"1\",tp_rank=\"2\"} 0.7\n\
             sglang:realtime_tokens_total{dp_rank=\"0\",mode=\"decode\",tp_rank=\"0\"} 10\n\
             sglang:realtime_tokens_total{dp_rank=\"0\",mode=\"decode\",tp_rank=\"1\"} 10\n\
             sglang:realtime_tokens_total{dp_rank=\"0\",mode=\"prefill_compute\",tp_rank=\"0\"} 5\n\
             sglang:realtime_tokens_total{dp_rank=\"0\",mode=\"prefill_cache\",tp_rank=\"0\"} 50\n\
             sglang:realtime_tokens_total{dp_rank=\"1\",mode=\"decode\",tp_rank=\"2\"} 30\n\
             sglang:dp_attention_token_imbalance_ratio_sum{dp_rank=\"0\"} 12\n\
             sglang:dp_attention_token_imbalance_ratio_count{dp_rank=\"0\"} 8\n",
        ),
    );
    assert_eq!(s.waiting_capacity, Some(5.0));
    assert_eq!(s.kv_usage, Some(0.7));
    assert_eq!(s.dp_tokens, vec![15.0, 30.0]);
    assert_eq!(s.dp_imbalance, Some((12.0, 8.0)));
    assert_eq!(s.rejections_total, None);
}

#[test]
fn sglang_token_usage_out_of_range_is_none() {
    let s = adapt(
        Dialect::Sglang,
        &parse("sglang:token_usage{dp_rank=\"0\"} 1.2\n"),
    );
    assert_eq!(s.kv_usage, None);
    let s = adapt(
        Dialect::Sglang,
        &parse("sglang:num_queue_reqs{dp_rank=\"a\"} 1\n"),
    );
    assert_eq!(s.waiting_capacity, None);
}

#[test]
fn the_rejection_counter_is_kept_per_series() {
    let s = ballast(
        "# TYPE ballast_admission_rejections_total counter\n\
         ballast_admission_rejections_total{engine=\"0\",reason=\"max_num_queued_reqs\"} 6\n\
         ballast_admission_rejections_total{engine=\"0\",reason=\"max_num_queued_tokens\"} 2\n",
    );
    let series = s.rejections_total.as_ref().unwrap();
    assert_eq!(
        series.iter().collect::<Vec<_>>(),
        [
            (
                &r#"engine="0",reason="max_num_queued_reqs""#.to_string(),
                &6.0
            ),
            (
                &r#"engine="0",reason="max_num_queued_tokens""#.to_string(),
                &2.0
            ),
        ]
    );
    assert_eq!(s.rejections_sum(), Some(8.0));
    // Declared but nothing counted yet (a labelled counter with no child): zero series,
    // which is a count of 0, not an absent counter.
    let declared = ballast(
        "# TYPE ballast_admission_rejections_total counter\nballast_num_requests_running 1\n",
    );
    assert_eq!(declared.rejections_total, Some(Default::default()));
    assert_eq!(
        ballast("ballast_num_requests_running 1\n").rejections_total,
        None
    );
}
