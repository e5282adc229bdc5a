//! What the scheduler hands a backend for one step: the flattened tokens of every
//! scheduled sequence, their KV slots and block tables, and the rows to sample.

/// One sequence's part of a batched step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSlice {
    /// Row of this sequence's first new token in the step's token arrays.
    pub query_start: u32,
    /// New tokens computed this step (a prefill chunk, or 1 for decode).
    pub query_len: u32,
    /// Tokens already in the KV cache before this step (computed earlier or prefix-cache hits).
    pub context_len: u32,
    /// Offset of this sequence's block table in [`StepMetadata::block_tables`].
    pub block_table_start: u32,
    /// Number of entries of its block table (covers `context_len + query_len` tokens).
    pub block_table_len: u32,
}

impl SeqSlice {
    /// Tokens whose keys the last new token attends to.
    pub fn total_len(&self) -> u32 {
        self.context_len + self.query_len
    }
}

/// Host description of one batched step: the flattened tokens of every scheduled sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepMetadata {
    /// Token id of every computed token, sequences one after another.
    pub token_ids: Vec<u32>,
    /// Absolute position of every computed token.
    pub positions: Vec<u32>,
    /// KV slot each computed token writes (block · block_size + offset).
    pub slot_mapping: Vec<u32>,
    /// The sequences, in row order.
    pub seqs: Vec<SeqSlice>,
    /// Concatenated block tables.
    pub block_tables: Vec<u32>,
    /// Rows whose logits are needed: the last token of each sequence that samples this step.
    pub logits_rows: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
}

impl StepMetadata {
    /// One sequence whose blocks are 0, 1, 2, …: computes `tokens` on top of `start` cached
    /// tokens and returns logits for the rows in `logits_rows` (indexes into `tokens`). For
    /// tests, benchmarks and examples that drive a model without a scheduler.
    pub fn single_sequence(
        tokens: &[u32],
        start: u32,
        block_size: u32,
        logits_rows: Vec<u32>,
    ) -> Self {
        let n = tokens.len() as u32;
        let end = start + n;
        let blocks = end.div_ceil(block_size);
        Self {
            token_ids: tokens.to_vec(),
            positions: (start..end).collect(),
            slot_mapping: (start..end).collect(),
            seqs: vec![SeqSlice {
                query_start: 0,
                query_len: n,
                context_len: start,
                block_table_start: 0,
                block_table_len: blocks,
            }],
            block_tables: (0..blocks).collect(),
            logits_rows,
            block_size,
        }
    }

    /// Number of token rows in the step.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The block table of sequence `i`.
    pub fn block_table(&self, seq: &SeqSlice) -> &[u32] {
        let start = seq.block_table_start as usize;
        &self.block_tables[start..start + seq.block_table_len as usize]
    }
}
