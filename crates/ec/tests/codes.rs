//! Property tests of both codes (style.md: encode -> erase <= r -> decode == original, bit for
//! bit; erase > r -> a clear error).

use ftrec_ec::{Code, CodeKind, EcError, SumCode, SumParityTracker};
use proptest::prelude::*;

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// `k` data rows of `width` arbitrary 32-bit words (NaN payloads, infinities, subnormals).
fn raw_rows(k: usize, width: usize) -> impl Strategy<Value = Vec<Vec<f32>>> {
    prop::collection::vec(
        prop::collection::vec(any::<u32>().prop_map(f32::from_bits), width),
        k,
    )
}

/// A stripe: data rows followed by parities encoded by `code`.
fn encode(code: &Code, data: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let width = data[0].len();
    let mut parity = vec![vec![0.0f32; width]; code.r()];
    {
        let ins: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
        let mut outs: Vec<&mut [f32]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        code.encode(&ins, &mut outs).unwrap();
    }
    let mut stripe = data.to_vec();
    stripe.extend(parity);
    stripe
}

/// (k, r, width, data rows).
fn gf_case() -> impl Strategy<Value = (usize, usize, Vec<Vec<f32>>)> {
    (1usize..=8, 1usize..=4, 0usize..=24)
        .prop_flat_map(|(k, r, width)| (Just(k), Just(r), raw_rows(k, width)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn gf256_rebuilds_any_r_erasures_bit_for_bit(
        (k, r, data) in gf_case(),
        seed in any::<u64>(),
        count in 0usize..=4,
    ) {
        let code = Code::new(CodeKind::Gf256, k, r).unwrap();
        let original = encode(&code, &data);
        // Choose min(count, r) distinct positions from the seed.
        let width = k + r;
        let mut order: Vec<usize> = (0..width).collect();
        let mut s = seed;
        for i in (1..width).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        let erased = &order[..count.min(r)];
        let mut stripe = original.clone();
        let mut present = vec![true; width];
        for &p in erased {
            present[p] = false;
            stripe[p] = vec![f32::from_bits(0x7FC0_0001); stripe[p].len()];
        }
        code.reconstruct(&mut stripe, &present).unwrap();
        prop_assert_eq!(bits(&stripe), bits(&original));
    }

    #[test]
    fn gf256_refuses_r_plus_one_erasures((k, r, data) in gf_case(), skip in 0usize..12) {
        let code = Code::new(CodeKind::Gf256, k, r).unwrap();
        let mut stripe = encode(&code, &data);
        let width = k + r;
        let mut present = vec![true; width];
        for i in 0..=r {
            present[(skip + i) % width] = false;
        }
        let before = bits(&stripe);
        let got = code.reconstruct(&mut stripe, &present);
        prop_assert_eq!(got, Err(EcError::TooManyErasures { lost: r + 1, tolerated: r }));
        prop_assert_eq!(bits(&stripe), before);
    }

    #[test]
    fn gf256_decoder_works_from_any_k_survivors(
        (k, r, data) in gf_case(),
        lost_mask in any::<u8>(),
        extra_mask in any::<u8>(),
    ) {
        let code = Code::new(CodeKind::Gf256, k, r).unwrap();
        let stripe = encode(&code, &data);
        let width = k + r;
        let wanted: Vec<usize> =
            (0..width).filter(|&p| lost_mask >> (p % 8) & 1 == 1).take(r).collect();
        prop_assume!(!wanted.is_empty());
        // Survivors listed in a scrambled order; some extra ones left out when possible.
        let mut available: Vec<usize> = (0..width).rev().filter(|p| !wanted.contains(p)).collect();
        let spare = available.len() - k;
        let mut dropped = 0;
        available.retain(|&p| {
            let drop = dropped < spare && extra_mask >> (p % 8) & 1 == 1;
            dropped += usize::from(drop);
            !drop
        });
        let dec = code.decoder(&available, &wanted).unwrap();
        prop_assert_eq!(dec.reads().len(), k);
        let ins: Vec<&[f32]> = dec.reads().iter().map(|&p| stripe[p].as_slice()).collect();
        let mut outs = vec![vec![0.0f32; stripe[0].len()]; wanted.len()];
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        dec.decode(&ins, &mut refs).unwrap();
        for (w, out) in wanted.iter().zip(&outs) {
            prop_assert_eq!(bits(std::slice::from_ref(out)), bits(std::slice::from_ref(&stripe[*w])));
        }
    }

    // ECRec §3.2.1 with an exact code: any sequence of difference propagations leaves the
    // parities equal, bit for bit, to a fresh encode of the current rows.
    #[test]
    fn gf256_delta_updates_equal_fresh_encode(
        (k, r, data) in gf_case(),
        updates in prop::collection::vec((any::<usize>(), any::<u64>(), any::<bool>()), 1..40),
    ) {
        let code = Code::new(CodeKind::Gf256, k, r).unwrap();
        let mut stripe = encode(&code, &data);
        let width = stripe[0].len();
        let mut delta = vec![0.0f32; width];
        for (pos, salt, two_step) in updates {
            let i = pos % k;
            let new: Vec<f32> = (0..width)
                .map(|w| f32::from_bits((salt.rotate_left(w as u32 * 7) as u32) ^ w as u32))
                .collect();
            let old = stripe[i].clone();
            for j in 0..r {
                let parity = &mut stripe[k + j];
                if two_step {
                    code.delta(&old, &new, &mut delta).unwrap();
                    code.apply_delta(i, j, &delta, parity).unwrap();
                } else {
                    code.update_parity(i, j, &old, &new, parity).unwrap();
                }
            }
            stripe[i] = new;
        }
        let fresh = encode(&code, &stripe[..k]);
        prop_assert_eq!(bits(&stripe), bits(&fresh));
    }

    // ECRec §3.2: re-encoding a lost parity is the same sequential sum as the encoder, so it
    // is bit-identical; a lost data row comes back within the rounding bound of the
    // subtraction decoder.
    #[test]
    fn sum_rebuilds_one_erasure(
        k in 1usize..=8,
        rows in prop::collection::vec(prop::collection::vec(-1.0e3f32..1.0e3, 6), 8),
        lost in 0usize..9,
    ) {
        let code = Code::new(CodeKind::Sum, k, 1).unwrap();
        let data: Vec<Vec<f32>> = rows[..k].to_vec();
        let original = encode(&code, &data);
        let lost = lost % (k + 1);
        let mut stripe = original.clone();
        let mut present = vec![true; k + 1];
        present[lost] = false;
        stripe[lost] = vec![0.0; 6];
        code.reconstruct(&mut stripe, &present).unwrap();
        if lost == k {
            prop_assert_eq!(bits(&stripe), bits(&original));
        } else {
            let tracker = SumParityTracker::new(SumCode::new(k, 1).unwrap(), data).unwrap();
            let snap = tracker.snapshot();
            prop_assert!(snap.within_bound);
            for w in 0..6 {
                let err = f64::from((stripe[lost][w] - original[lost][w]).abs());
                prop_assert!(err <= snap.bound, "err {} > bound {}", err, snap.bound);
            }
        }
        let mut two = original.clone();
        let mut present = vec![true; k + 1];
        present[0] = false;
        present[k] = false;
        prop_assert_eq!(
            code.reconstruct(&mut two, &present),
            Err(EcError::TooManyErasures { lost: 2, tolerated: 1 })
        );
    }

    // The sum code's drift under arbitrary update sequences stays within the documented,
    // rigorously accumulated bound.
    #[test]
    fn sum_drift_stays_within_the_bound(
        k in 1usize..=6,
        init in prop::collection::vec(prop::collection::vec(-10.0f32..10.0, 5), 6),
        updates in prop::collection::vec(
            (0usize..6, prop::collection::vec(-10.0f32..10.0, 5), 0u32..4),
            1..200,
        ),
    ) {
        let mut tracker =
            SumParityTracker::new(SumCode::new(k, 1).unwrap(), init[..k].to_vec()).unwrap();
        for (pos, row, scale) in updates {
            // Spread magnitudes over several binades so that roundings really happen.
            let f = [1.0e-3f32, 1.0, 37.0, 1.0e3][scale as usize];
            let row: Vec<f32> = row.iter().map(|v| v * f).collect();
            tracker.update(pos % k, &row).unwrap();
            let snap = tracker.snapshot();
            prop_assert!(snap.within_bound, "{:?}", snap);
        }
    }
}

#[test]
fn sum_code_refuses_r_above_one() {
    assert!(matches!(
        Code::new(CodeKind::Sum, 4, 2),
        Err(EcError::InvalidParameters(_))
    ));
}
