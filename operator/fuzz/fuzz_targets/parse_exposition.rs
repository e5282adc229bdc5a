//! Arbitrary bytes through the parser and every dialect adapter: no panic, and nothing
//! out of range comes out.

#![no_main]

use ballast_operator::scrape::dialect::{adapt, reads};
use ballast_operator::scrape::parser::{Limits, parse, parse_selected, parse_with};
use ballast_operator::signals::Dialect;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let small = Limits {
        max_line_bytes: 256,
        max_labels: 4,
        max_samples: 16,
    };
    // What a scrape does, on the raw bytes: for the names it keeps, exactly the full
    // parse of the lossy text (lines here are far below the default line limit).
    let full = parse(&text);
    for dialect in [Dialect::Ballast, Dialect::Vllm, Dialect::Sglang] {
        let keep = |n: &str| reads(dialect, n);
        let selected = parse_selected(data, &Limits::default(), &keep);
        let want: Vec<_> = full.samples.iter().filter(|s| keep(s.name)).collect();
        assert_eq!(selected.samples.iter().collect::<Vec<_>>(), want);
        assert_eq!(adapt(dialect, &selected), adapt(dialect, &full));
    }
    for exposition in [full, parse_with(&text, &small)] {
        for s in &exposition.samples {
            assert!(s.value.is_finite());
            assert!(s.labels.windows(2).all(|w| w[0].0 < w[1].0));
        }
        for dialect in [Dialect::Ballast, Dialect::Vllm, Dialect::Sglang] {
            let s = adapt(dialect, &exposition);
            if let Some(kv) = s.kv_usage {
                assert!((0.0..=1.0).contains(&kv));
            }
            for count in [s.running, s.waiting_capacity, s.waiting_deferred]
                .into_iter()
                .flatten()
                .chain(s.rejections_total.iter().flat_map(|r| r.values().copied()))
            {
                assert!(count >= 0.0);
            }
            assert!(
                s.ttft_buckets
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
            );
            assert!(s.ttft_buckets.last().is_none_or(|b| b.0 == f64::INFINITY));
            assert!(s.dp_tokens.iter().all(|t| *t >= 0.0));
        }
    }
});
