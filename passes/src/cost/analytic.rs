//! Analytic op costs (placeholder; filled in below).
