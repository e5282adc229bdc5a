//! The vocabulary of one engine step, shared by every room below the front door.
//!
//! - [`events`]: what a step records about each request and the scheduler (events with
//!   their `Instant`, finish reasons, snapshots, counters).
//!
//! Uses nothing else in the crate, so the scheduler, the backends and the telemetry can all
//! speak it without depending on each other.

pub mod events;
