//! primjit: compile CNN primitives to machine code and run graphs of them within a byte budget.
