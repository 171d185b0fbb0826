//! The reference interpreter: straightforward loops with f64 accumulation, the oracle for every kernel test.
