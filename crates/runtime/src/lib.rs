//! Primitives that own their executable pages, the primitive cache, and the graph executor.
