//! `ftrec-data` (in construction).
