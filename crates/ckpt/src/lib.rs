//! `ftrec-ckpt` (in construction).
