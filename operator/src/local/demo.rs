//! `ballast local --demo`: a built-in load ramp through the router (rise, hold, fall) so
//! one command shows the fleet scaling up and back down.

use std::time::Duration;

use ballast_bench::BenchArgs;
use clap::Parser;

/// One phase: open-loop Poisson load at `rate` req/s for `seconds`.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    /// Requests per second.
    pub rate: f64,
    /// Length.
    pub seconds: u64,
}

/// Rise, hold, fall, then quiet long enough for the scale-down window.
pub const RAMP: [Phase; 7] = [
    Phase {
        rate: 1.0,
        seconds: 15,
    },
    Phase {
        rate: 4.0,
        seconds: 15,
    },
    Phase {
        rate: 10.0,
        seconds: 30,
    },
    Phase {
        rate: 10.0,
        seconds: 30,
    },
    Phase {
        rate: 4.0,
        seconds: 15,
    },
    Phase {
        rate: 1.0,
        seconds: 15,
    },
    Phase {
        rate: 0.2,
        seconds: 60,
    },
];

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    args: BenchArgs,
}

/// Drives `phases` against the router at `url` for `model` once `ready` says a replica
/// serves; logs each phase's outcome.
pub async fn drive(url: String, model: String, phases: &[Phase], ready: impl Fn() -> bool) {
    while !ready() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, p) in phases.iter().enumerate() {
        let argv = [
            "bench".to_string(),
            "--url".into(),
            url.clone(),
            "--model".into(),
            model.clone(),
            "--rate".into(),
            p.rate.to_string(),
            "--duration".into(),
            p.seconds.to_string(),
            "--input-len".into(),
            "64".into(),
            "--output-len".into(),
            "64".into(),
            "--ignore-eos".into(),
            "--no-progress".into(),
            "--seed".into(),
            i.to_string(),
            "--request-timeout".into(),
            "120".into(),
        ];
        let args = match Wrapper::try_parse_from(argv) {
            Ok(w) => w.args,
            Err(e) => {
                tracing::error!(target: "ballast::demo", error = %e, "bad demo phase");
                return;
            }
        };
        tracing::info!(target: "ballast::demo", phase = i + 1, rate = p.rate, seconds = p.seconds, "demo load phase");
        match ballast_bench::measure(args).await {
            Ok(r) => {
                let errors: Vec<String> = r
                    .errors
                    .iter()
                    .map(|e| format!("{} x{}", e.message, e.count))
                    .collect();
                tracing::info!(
                    target: "ballast::demo",
                    phase = i + 1,
                    ok = r.requests.ok,
                    rejected = r.requests.rejected,
                    failed = r.requests.failed,
                    errors = %errors.join("; "),
                    "demo phase done"
                )
            }
            Err(e) => {
                tracing::warn!(target: "ballast::demo", error = %e, "demo load stopped");
                tokio::time::sleep(Duration::from_secs(p.seconds)).await;
            }
        }
    }
    tracing::info!(target: "ballast::demo", "demo load finished");
}
