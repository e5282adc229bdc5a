//! Ballast bench: a load generator for any OpenAI-compatible server
//! (Ballast, vLLM, SGLang, OpenAI).
//!
//! It sends `/v1/completions` requests whose prompts are token ids (so input
//! lengths are exact on any server) or `/v1/chat/completions` requests with
//! word prompts (lengths approximate: roughly one token per word, plus the
//! chat template), in a closed loop (`--concurrency`) or an open loop of
//! Poisson arrivals (`--rate`), and reports throughput and latency
//! percentiles (TTFT, TPOT, ITL, end-to-end). All randomness comes from
//! `--seed`, so runs are reproducible.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ballast_bench::BenchError> {
//! use clap::Parser;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     bench: ballast_bench::BenchArgs,
//! }
//!
//! // The program picks the TLS crypto provider once (the `ballast` binary does in main).
//! let _ = rustls::crypto::ring::default_provider().install_default();
//! let cli = Cli::parse_from(["bench", "--model", "m", "--rate", "4", "--duration", "60", "--stream"]);
//! let report = ballast_bench::run(cli.bench).await?;
//! println!("{:.2} req/s", report.req_per_s);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod args;
mod client;
mod error;
mod lengths;
mod progress;
mod report;
mod runner;
mod sse;
mod stats;
mod workload;

use std::sync::Arc;

pub use args::{BenchArgs, Endpoint};
pub use error::BenchError;
pub use report::{ErrorSample, Report, RequestCounts};
pub use stats::Summary;

use args::Config;
use client::Target;
use progress::Progress;
use runner::{Shared, Stop, Tally};
use workload::Workload;

/// Runs the benchmark, printing a progress bar on stderr (only when stderr is
/// a terminal) and the final table on stdout; writes JSON if `--json` given.
///
/// Failed or rejected requests do not make this fail; they are counted in the
/// report. Errors are for bad flags, an unreachable server, an undiscoverable
/// model, or an unwritable `--json` file.
pub async fn run(args: BenchArgs) -> Result<Report, BenchError> {
    let json = args.json.clone();
    let report = measure(args).await?;
    println!("{}", report.render_table());
    if let Some(path) = &json {
        let write_err = |source| BenchError::WriteJson {
            path: path.clone(),
            source,
        };
        let json = serde_json::to_string_pretty(&report).map_err(|e| write_err(e.into()))?;
        std::fs::write(path, json + "\n").map_err(write_err)?;
    }
    Ok(report)
}

/// Runs the benchmark and returns the report without printing or writing anything
/// (the progress bar still follows `--no-progress`): for callers that drive load as
/// part of something else, such as `ballast local --demo`.
pub async fn measure(args: BenchArgs) -> Result<Report, BenchError> {
    let config = Config::from_args(args)?;
    let client = client::build_client(&config)?;
    // Probe before starting the clock: a typo in --url should be an error,
    // not a report full of connection failures.
    let discovered = client::probe(&client, &config.base_url, config.model.is_none()).await?;
    let model = config.model.clone().or(discovered).unwrap_or_default();

    let tally = Arc::new(Tally::default());
    let stop = Stop {
        max_requests: config.max_requests,
        duration: config.duration,
    };
    let shared = Shared {
        target: Arc::new(Target::new(
            client,
            client::build_fresh_client(&config)?,
            &config,
            model.clone(),
        )),
        workload: Arc::new(Workload::new(&config)),
        tally: tally.clone(),
    };
    let progress = Progress::start(config.progress, tally, stop);
    let records = runner::drive(config.load, stop, config.seed, shared).await;
    progress.finish();
    Ok(Report::build(&config, &model, &records))
}
