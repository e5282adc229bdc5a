//! An analytic model of the work in one step, for MFU and bandwidth utilisation in PromQL
//! (`rate(ballast_estimated_flops_per_gpu_total[1m]) / peak`).
//!
//! Per step: every computed token goes through the QKV/output projections and the
//! feed-forward (2 FLOPs per weight); each sampled row through the output head; attention
//! costs 4 FLOPs per (query, key) pair per head dimension (QKᵀ and PV). Weights are read
//! once per step; each sequence's K/V context is read once per layer; each new token's
//! K/V is written once.

use crate::compute::model::ModelSpec;

/// Work of one step on one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepWork {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes read from device memory.
    pub read_bytes: u64,
    /// Bytes written to device memory.
    pub write_bytes: u64,
}

/// Precomputed per-model costs.
#[derive(Debug, Clone, Copy)]
pub struct FlopsModel {
    layer_matmul_params: u64,
    num_layers: u64,
    head_params: u64,
    attn_per_pair: u64,
    weight_bytes: u64,
    kv_bytes_per_token: u64,
    bytes_per_element: u64,
}

impl FlopsModel {
    /// Costs of `spec` with `bytes_per_element`-byte weights and cache (4 for f32).
    pub fn new(spec: &ModelSpec, bytes_per_element: u64) -> Self {
        let h = spec.hidden_size as u64;
        let layer = h * spec.q_size() as u64 * 2
            + h * spec.kv_size() as u64 * 2
            + 3 * h * spec.intermediate_size as u64;
        Self {
            layer_matmul_params: layer,
            num_layers: spec.num_layers as u64,
            head_params: spec.vocab_size as u64 * h,
            attn_per_pair: 4 * (spec.num_heads * spec.head_dim) as u64 * spec.num_layers as u64,
            weight_bytes: spec.num_params() as u64 * bytes_per_element,
            kv_bytes_per_token: 2
                * spec.num_layers as u64
                * spec.kv_size() as u64
                * bytes_per_element,
            bytes_per_element,
        }
    }

    /// Work of a step computing `tokens` tokens, sampling `sampled` rows, with
    /// `attention_pairs` causal pairs and `context_tokens` tokens of K/V read in total.
    pub fn step(
        &self,
        tokens: u64,
        sampled: u64,
        attention_pairs: u64,
        context_tokens: u64,
    ) -> StepWork {
        if tokens == 0 {
            return StepWork::default();
        }
        let flops = 2 * tokens * self.layer_matmul_params * self.num_layers
            + 2 * sampled * self.head_params
            + attention_pairs * self.attn_per_pair;
        // Activations are small next to weights and KV and are left out.
        let read_bytes = self.weight_bytes + context_tokens * self.kv_bytes_per_token;
        let write_bytes = tokens * self.kv_bytes_per_token + sampled * self.bytes_per_element;
        StepWork {
            flops,
            read_bytes,
            write_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_tiny_step() {
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let m = FlopsModel::new(&spec, 4);
        // tiny: hidden 64, q 64, kv 32, ffn 176, 2 layers, vocab 258, 4 heads × 16.
        let layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176;
        let w = m.step(3, 1, 6, 3);
        assert_eq!(w.flops, 2 * 3 * layer * 2 + 2 * 258 * 64 + 6 * 4 * 64 * 2);
        let kv_per_token = 2 * 2 * 32 * 4;
        assert_eq!(
            w.read_bytes,
            spec.num_params() as u64 * 4 + 3 * kv_per_token
        );
        assert_eq!(w.write_bytes, 3 * kv_per_token + 4);
        assert_eq!(
            m.step(0, 0, 0, 0),
            StepWork::default(),
            "an idle rank does no work"
        );
    }
}
