//! Lowers primitive keys to shape-specialized x86-64 machine code through Cranelift.
