//! `set_gemm_threads` works before the first product and refuses a different count after it.
//! (Its own test binary: the first product of a process fixes the count for good.)

use ftrec_core::{Optimizer, OptimizerKind};
use ftrec_model::{gemm, set_gemm_threads, Dlrm, DlrmConfig, ModelError, Workspace};

#[test]
fn the_first_product_fixes_the_gemm_thread_count() {
    assert!(!gemm::gemm_threads_fixed());
    assert_eq!(set_gemm_threads(2), Ok(2));
    assert_eq!(set_gemm_threads(1), Ok(1));
    assert_eq!(set_gemm_threads(9), Ok(gemm::MAX_GEMM_THREADS));
    assert_eq!(set_gemm_threads(1), Ok(1));
    let cfg = DlrmConfig {
        dense_in: 2,
        bottom: vec![4, 2],
        top: vec![3, 1],
        tables: 1,
        dim: 2,
    };
    let model = Dlrm::new(cfg, 1, &Optimizer::new(OptimizerKind::Sgd, 0.1)).unwrap();
    let mut ws = Workspace::new(1).unwrap();
    model
        .forward_backward(&mut ws, &[0.5, 0.5], &[0.1, 0.2], &[1.0])
        .unwrap();
    assert!(gemm::gemm_threads_fixed());
    assert_eq!(gemm::gemm_threads(), 1);
    assert_eq!(set_gemm_threads(1), Ok(1));
    assert!(matches!(
        set_gemm_threads(2),
        Err(ModelError::GemmThreadsFixed {
            requested: 2,
            current: 1
        })
    ));
}
