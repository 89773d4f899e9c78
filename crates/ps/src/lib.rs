//! `ftrec-ps` (in construction).
