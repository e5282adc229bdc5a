//! The pure decision core.
