//! `ftrec-model` (in construction).
