//! Builders the engine's unit tests, integration tests and benches share, so that a
//! change to what a request or a scheduler needs is made once: greedy requests that run to
//! their length, and a scheduler with the ledgers it shares with the front door. A model
//! is driven without a scheduler through [`crate::compute::model::Sequence`] (its own paged
//! KV cache), the same way in unit tests, integration tests, benches and examples. Not
//! part of the engine's API.

use std::sync::Arc;

use crate::compute::sampling::{SampleSpec, SamplingParams};
use crate::runtime::admission::{AdmissionLedger, AdmissionLimits};
use crate::runtime::scheduler::{EngineRequest, Scheduler, SchedulerConfig};
use crate::runtime::tenants::TenantLedger;
use crate::step::events::RequestId;

/// The end-of-sequence token of the test requests: outside the synthetic vocabularies'
/// prompt range, so only `max_tokens` ends them.
pub const EOS: u32 = 257;

/// A request of `prompt` that decodes greedily for exactly `max_tokens` (EOS ignored),
/// seeded by its id, with no tenant.
pub fn greedy_request(id: RequestId, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        id,
        prompt,
        sampling: SamplingParams {
            spec: SampleSpec {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
            },
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::default()
        },
        rng_seed: id,
        tenant: None,
        eos_token_ids: [EOS].into(),
    }
}

/// A scheduler of `cfg` with its own ledgers: the default admission limits, and a running
/// cap of `tenant_cap` per tenant.
pub fn scheduler(cfg: SchedulerConfig, tenant_cap: Option<u32>) -> Scheduler {
    Scheduler::new(
        cfg,
        Arc::new(TenantLedger::new(tenant_cap)),
        Arc::new(AdmissionLedger::new(AdmissionLimits::default())),
    )
}
