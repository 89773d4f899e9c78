//! `ftrec-ec` (in construction).
