//! Evaluation metrics: exact AUC and log loss.
//!
//! Both take scores and labels as parallel slices and reject bad input with a named error
//! (never a panic, never a silently wrong number).

use crate::ModelError;

/// Probabilities are clamped to `[LOGLOSS_EPS, 1 - LOGLOSS_EPS]` before the log.
pub const LOGLOSS_EPS: f64 = 1e-7;

fn check_lengths(scores: usize, labels: usize) -> Result<(), ModelError> {
    if scores == labels {
        Ok(())
    } else {
        Err(ModelError::ShapeMismatch {
            what: "labels (one per score)",
            expected: scores,
            got: labels,
        })
    }
}

/// Exact area under the ROC curve: the probability that a random positive scores above a
/// random negative, ties counting one half (the Mann–Whitney U statistic over `P * N`).
/// Computed by sorting (O(n log n)); tied scores share their average rank.
///
/// Labels must be exactly 0 or 1 and scores must not be NaN. With only one class present
/// (including no samples) AUC is undefined: [`ModelError::SingleClass`].
pub fn auc(scores: &[f32], labels: &[f32]) -> Result<f64, ModelError> {
    check_lengths(scores.len(), labels.len())?;
    let mut pairs: Vec<(f32, bool)> = Vec::with_capacity(scores.len());
    for (index, (&s, &y)) in scores.iter().zip(labels).enumerate() {
        if s.is_nan() {
            return Err(ModelError::InvalidScore { index });
        }
        if y != 0.0 && y != 1.0 {
            return Err(ModelError::InvalidLabel { index, value: y });
        }
        // `+ 0.0` turns -0.0 into 0.0 so that equal scores sort into one tie group.
        pairs.push((s + 0.0, y == 1.0));
    }
    let positives = pairs.iter().filter(|p| p.1).count();
    let negatives = pairs.len() - positives;
    if positives == 0 || negatives == 0 {
        return Err(ModelError::SingleClass {
            positives,
            negatives,
        });
    }
    pairs.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the (1-based, tie-averaged) ranks of the positives.
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < pairs.len() {
        let mut j = i + 1;
        while j < pairs.len() && pairs[j].0 == pairs[i].0 {
            j += 1;
        }
        let pos_in_group = pairs[i..j].iter().filter(|p| p.1).count();
        let avg_rank = (i + 1 + j) as f64 / 2.0;
        rank_sum += pos_in_group as f64 * avg_rank;
        i = j;
    }
    let (p, n) = (positives as f64, negatives as f64);
    let u = rank_sum - p * (p + 1.0) / 2.0;
    Ok(u / (p * n))
}

/// Mean binary cross-entropy of click probabilities `probs` against `labels` in `[0, 1]`,
/// with probabilities clamped to `[LOGLOSS_EPS, 1 - LOGLOSS_EPS]` so that a confident miss
/// costs a large finite amount instead of infinity.
pub fn logloss(probs: &[f32], labels: &[f32]) -> Result<f64, ModelError> {
    check_lengths(probs.len(), labels.len())?;
    if probs.is_empty() {
        return Err(ModelError::Empty("log loss"));
    }
    let mut sum = 0.0f64;
    for (index, (&p, &y)) in probs.iter().zip(labels).enumerate() {
        if p.is_nan() {
            return Err(ModelError::InvalidScore { index });
        }
        if !(0.0..=1.0).contains(&y) {
            return Err(ModelError::InvalidLabel { index, value: y });
        }
        let p = (p as f64).clamp(LOGLOSS_EPS, 1.0 - LOGLOSS_EPS);
        let y = y as f64;
        sum -= y * p.ln() + (1.0 - y) * (1.0 - p).ln();
    }
    Ok(sum / probs.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute_force_auc(scores: &[f32], labels: &[f32]) -> f64 {
        let mut wins = 0.0;
        let mut pairs = 0.0;
        for (i, &yi) in labels.iter().enumerate() {
            for (j, &yj) in labels.iter().enumerate() {
                if yi == 1.0 && yj == 0.0 {
                    pairs += 1.0;
                    if scores[i] > scores[j] {
                        wins += 1.0;
                    } else if scores[i] == scores[j] {
                        wins += 0.5;
                    }
                }
            }
        }
        wins / pairs
    }

    proptest! {
        #[test]
        fn auc_matches_pairwise_count_with_many_ties(
            data in prop::collection::vec((0u8..6, prop::bool::ANY), 2..200)
        ) {
            // Six distinct score levels (including a -0.0 that must tie with 0.0) force ties.
            let levels = [-1.5f32, -0.0, 0.0, 0.25, 0.25, 3.0];
            let scores: Vec<f32> = data.iter().map(|(l, _)| levels[*l as usize]).collect();
            let labels: Vec<f32> = data.iter().map(|(_, y)| if *y { 1.0 } else { 0.0 }).collect();
            let both = labels.contains(&1.0) && labels.contains(&0.0);
            prop_assume!(both);
            let got = auc(&scores, &labels).unwrap();
            let want = brute_force_auc(&scores, &labels);
            prop_assert!((got - want).abs() < 1e-12, "auc {} vs brute force {}", got, want);
        }
    }

    #[test]
    fn auc_known_values() {
        assert_eq!(auc(&[0.1, 0.9], &[0.0, 1.0]).unwrap(), 1.0);
        assert_eq!(auc(&[0.9, 0.1], &[0.0, 1.0]).unwrap(), 0.0);
        assert_eq!(auc(&[0.5, 0.5, 0.5], &[0.0, 1.0, 1.0]).unwrap(), 0.5);
        // Positives 0.8, 0.4; negatives 0.6, 0.2: 3 of 4 pairs won.
        assert_eq!(
            auc(&[0.8, 0.6, 0.4, 0.2], &[1.0, 0.0, 1.0, 0.0]).unwrap(),
            0.75
        );
    }

    #[test]
    fn auc_rejects_what_it_cannot_rank() {
        assert!(matches!(
            auc(&[0.1, 0.2], &[1.0, 1.0]),
            Err(ModelError::SingleClass {
                positives: 2,
                negatives: 0
            })
        ));
        assert!(matches!(
            auc(&[], &[]),
            Err(ModelError::SingleClass {
                positives: 0,
                negatives: 0
            })
        ));
        assert!(matches!(
            auc(&[0.1, f32::NAN], &[1.0, 0.0]),
            Err(ModelError::InvalidScore { index: 1 })
        ));
        assert!(matches!(
            auc(&[0.1, 0.2], &[1.0, 0.5]),
            Err(ModelError::InvalidLabel { index: 1, .. })
        ));
        assert!(matches!(
            auc(&[0.1, 0.2], &[1.0]),
            Err(ModelError::ShapeMismatch {
                expected: 2,
                got: 1,
                ..
            })
        ));
    }

    #[test]
    fn logloss_hand_computed_and_clamped() {
        let l = logloss(&[0.8, 0.25], &[1.0, 0.0]).unwrap();
        let want = -(0.8f64.ln() + 0.75f64.ln()) / 2.0;
        assert!((l - want).abs() < 1e-7, "{l} vs {want}");
        let confident_miss = logloss(&[0.0], &[1.0]).unwrap();
        assert!((confident_miss + LOGLOSS_EPS.ln()).abs() < 1e-9);
        assert!(matches!(logloss(&[], &[]), Err(ModelError::Empty(_))));
        assert!(matches!(
            logloss(&[0.5], &[2.0]),
            Err(ModelError::InvalidLabel { index: 0, .. })
        ));
        assert!(matches!(
            logloss(&[f32::NAN], &[1.0]),
            Err(ModelError::InvalidScore { index: 0 })
        ));
    }
}
