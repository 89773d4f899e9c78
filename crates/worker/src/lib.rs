//! `ftrec-worker` (in construction).
