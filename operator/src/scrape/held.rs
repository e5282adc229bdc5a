//! Requests a gateway holds: the demand no engine counts. Each control period the operator
//! reads every ready picker of a service (`ballast gateway --pool`, its `/metrics`) for
//! `ballast_gateway_held_requests` (summed over pickers) and
//! `ballast_gateway_oldest_hold_seconds` (the largest), and adds the held requests to the
//! fleet's capacity-waiting: requests waiting for capacity with no replica behind them.

use super::parser;
use super::{ScrapeError, Scraper, Target};
use crate::signals::Held;

/// The gauge of requests a gateway holds now.
pub const HELD_REQUESTS: &str = "ballast_gateway_held_requests";
/// The gauge of the longest hold's age, in seconds.
pub const OLDEST_HOLD: &str = "ballast_gateway_oldest_hold_seconds";

/// The two gauges of one picker's exposition (summed over its `pool` series); `None` when
/// it carries no usable held-requests gauge.
pub fn read(text: &[u8]) -> Option<(f64, f64)> {
    let limits = parser::Limits::default();
    let wanted = |name: &str| name == HELD_REQUESTS || name == OLDEST_HOLD;
    let e = parser::parse_selected(text, &limits, &wanted);
    let usable = |v: &f64| v.is_finite() && *v >= 0.0;
    let held: Vec<f64> = e.named(HELD_REQUESTS).map(|s| s.value).collect();
    if held.is_empty() || !held.iter().all(usable) {
        return None;
    }
    let oldest = e
        .named(OLDEST_HOLD)
        .map(|s| s.value)
        .filter(usable)
        .fold(0.0, f64::max);
    Some((held.iter().sum(), oldest))
}

impl Scraper {
    /// Reads what `pickers` hold, at most `concurrency` at once; `None` when there are
    /// none or none answered with the gauges (unknown, never 0).
    pub async fn held(&self, pickers: &[Target]) -> Option<Held> {
        let mut running = tokio::task::JoinSet::new();
        for target in pickers {
            let (scraper, target) = (self.clone(), target.clone());
            running.spawn(async move {
                let held = scraper.fetch_held(&target).await;
                (target.name, held)
            });
        }
        let mut total: Option<Held> = None;
        while let Some(done) = running.join_next().await {
            let Ok((name, Ok(Some((requests, oldest))))) = done else {
                continue;
            };
            let t = total.get_or_insert_with(Held::default);
            t.requests += requests;
            t.oldest_seconds = t.oldest_seconds.max(oldest);
            t.pickers += 1;
            t.by_picker.push((name, requests));
        }
        if let Some(t) = total.as_mut() {
            t.by_picker.sort_by(|a, b| a.0.cmp(&b.0));
        }
        total
    }

    async fn fetch_held(&self, target: &Target) -> Result<Option<(f64, f64)>, ScrapeError> {
        let mut body = Vec::new();
        self.fetch_body(target, None, &mut body).await?;
        Ok(read(&body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pickers_gauges_are_read_and_garbage_is_unknown() {
        let text = b"# TYPE ballast_gateway_held_requests gauge\nballast_gateway_held_requests{pool=\"chat\"} 3\n# TYPE ballast_gateway_oldest_hold_seconds gauge\nballast_gateway_oldest_hold_seconds{pool=\"chat\"} 1.5\nballast_gateway_endpoints 0\n";
        assert_eq!(read(text), Some((3.0, 1.5)));
        assert_eq!(
            read(b"ballast_gateway_endpoints 2\n"),
            None,
            "not a picker of this version"
        );
        assert_eq!(read(b"ballast_gateway_held_requests NaN\n"), None);
        assert_eq!(read(b"ballast_gateway_held_requests -1\n"), None);
        assert_eq!(
            read(b"ballast_gateway_held_requests 0\n"),
            Some((0.0, 0.0)),
            "no age gauge: nothing held for long"
        );
    }
}
