//! The compute and publish layers of the metrics pipeline.
//!
//! The step loop records ([`crate::step::events`]); the output router computes, per step, an
//! [`IterationStats`] (TTFT and ITL samples, finished requests, token counts) from each
//! request's [`timeline::RequestTimeline`]; then every [`StatLogger`] gets the same
//! [`StepStats`] view: one feed, many loggers. Three loggers exist: the Prometheus registry
//! ([`PrometheusLogger`]), the periodic human log line ([`LogLineLogger`]) and the control
//! API's [`board::ControlBoard`].

pub mod board;
pub mod flops;
mod log_line;
mod logger;
mod prometheus;
pub mod timeline;
pub mod window;

pub use log_line::LogLineLogger;
pub use logger::{IterationStats, StatLogger, StepStats};
pub use prometheus::PrometheusLogger;

use std::sync::Arc;
use std::time::Instant;

use crate::config::EngineConfig;
use crate::telemetry::metrics::EngineMetrics;
use board::{BoardLogger, ControlBoard};
use flops::FlopsModel;

/// The stat loggers of an engine, as [`crate::Engine`] starts them: the control board, the
/// Prometheus registry, and the log line unless `--disable-log-stats`. Public so the
/// record-path benchmark feeds the very set the engine runs.
pub fn engine_loggers(
    config: &EngineConfig,
    metrics: &Arc<EngineMetrics>,
    board: &Arc<ControlBoard>,
    now: Instant,
) -> Vec<Box<dyn StatLogger>> {
    let st = &config.stats;
    let mut loggers: Vec<Box<dyn StatLogger>> = vec![
        Box::new(BoardLogger(Arc::clone(board))),
        Box::new(PrometheusLogger::new(
            Arc::clone(metrics),
            FlopsModel::new(&config.model, 4),
            config.scheduler.max_num_seqs,
            st.log_interval,
            !st.disable_log_stats,
        )),
    ];
    if !st.disable_log_stats {
        loggers.push(Box::new(LogLineLogger::new(
            config.data_parallel_size,
            st.aggregate_engine_logging,
            now,
        )));
    }
    loggers
}
