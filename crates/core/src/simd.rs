//! Kernels compiled for the CPU they run on, with the same results everywhere.
//!
//! The workspace is built for the x86-64 baseline (SSE2), so a plain loop over `f32`s uses
//! 4-lane vectors even on a CPU with AVX-512. [`simd_kernel!`](crate::simd_kernel) defines a
//! function whose body is compiled three times, for AVX-512F, for AVX2 and for the baseline, and
//! picks one at run time from the CPU's features (the check is a cached load).
//!
//! The copies give the same bits: Rust never fuses a multiply and an add into an FMA, never
//! reorders floating-point operations and never uses approximate instructions unless the code
//! asks for them, so wider vectors change how many lanes run at once, not what any lane
//! computes. A body that needs a fused multiply-add must call `mul_add`, which is exact on
//! every copy.

/// Define a function whose body is compiled for AVX-512F, AVX2 and the baseline, chosen at run
/// time (see the [module docs](crate::simd)). Arguments must be plain `name: Type` pairs; the
/// function is `#[inline(never)]`, so profiles name it.
///
/// ```
/// ftrec_core::simd_kernel! {
///     /// `y += a * x`.
///     pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
///         for (y, x) in y.iter_mut().zip(x) {
///             *y += a * x;
///         }
///     }
/// }
/// let mut y = vec![1.0f32; 40];
/// axpy(2.0, &vec![0.5; 40], &mut y);
/// assert!(y.iter().all(|&v| v == 2.0));
/// ```
#[macro_export]
macro_rules! simd_kernel {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[inline(never)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn v4($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn v3($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if ::std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { v4($($arg),*) };
                }
                if ::std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    return unsafe { v3($($arg),*) };
                }
            }
            imp($($arg),*)
        }
    };
}

#[cfg(test)]
mod tests {
    crate::simd_kernel! {
        /// Lane-wise products and a sum in a fixed order: the order the baseline copy uses.
        fn mixed(a: &[f32], b: &[f32], out: &mut [f32]) -> f32 {
            let mut s = 0.0f32;
            for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
                *o = x * y + 1.0 / (x.abs() + 0.5);
                s += *o;
            }
            s
        }
    }

    #[test]
    fn every_copy_gives_the_bits_of_plain_code() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let mut out = vec![0.0f32; 1000];
        let s = mixed(&a, &b, &mut out);
        let mut want_s = 0.0f32;
        for i in 0..1000 {
            let o = std::hint::black_box(a[i] * b[i]) + 1.0 / (a[i].abs() + 0.5);
            assert_eq!(out[i].to_bits(), o.to_bits(), "lane {i}");
            want_s += o;
        }
        assert_eq!(s.to_bits(), want_s.to_bits());
    }
}
