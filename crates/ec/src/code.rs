//! One interface over both codes: [`Code`] (encode, difference propagation) and [`Decoder`]
//! (degraded reads and recovery).
//!
//! Positions in a stripe are numbered data first, then parities: `0..k` are the data rows,
//! `k..k + r` the parities (`k + j` is parity `j`).

use crate::gf::{bytes, bytes_mut, invert, mul, mul_xor_into, xor_into};
use crate::{EcError, Gf256Code, SumCode};

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), EcError> {
    if expected == got {
        Ok(())
    } else {
        Err(EcError::ShapeMismatch {
            what,
            expected,
            got,
        })
    }
}

/// Which code a deployment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeKind {
    /// ECRec's float sum (ECRec §3.2): `r = 1`, approximate after updates.
    Sum,
    /// Reed–Solomon over GF(2^8) on row bytes: any `r`, bit-exact.
    Gf256,
}

impl CodeKind {
    pub const ALL: [CodeKind; 2] = [CodeKind::Sum, CodeKind::Gf256];

    pub fn name(self) -> &'static str {
        match self {
            CodeKind::Sum => "sum",
            CodeKind::Gf256 => "gf256",
        }
    }

    /// Whether a decoded row always equals the lost row bit for bit.
    pub fn is_exact(self) -> bool {
        matches!(self, CodeKind::Gf256)
    }
}

impl std::fmt::Display for CodeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CodeKind {
    type Err = EcError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(CodeKind::Sum),
            "gf256" | "rs" | "reed-solomon" => Ok(CodeKind::Gf256),
            _ => Err(EcError::UnknownCode(s.to_string())),
        }
    }
}

/// Either code, behind one set of methods, so a server is written once.
///
/// ```
/// use ftrec_ec::{Code, CodeKind};
/// let code = Code::new(CodeKind::Gf256, 2, 1)?;
/// let (a, b) = ([1.0f32, 2.0], [3.0f32, -4.0]);
/// let mut p = [0.0f32; 2];
/// code.encode(&[&a, &b], &mut [&mut p[..]])?;
/// // Server 0 updates its row and propagates the difference to the parity holder.
/// let a2 = [1.5f32, 2.0];
/// let mut delta = [0.0f32; 2];
/// code.delta(&a, &a2, &mut delta)?;
/// code.apply_delta(0, 0, &delta, &mut p)?;
/// // Row `a` is lost: read `b` and the parity, decode.
/// let dec = code.decoder(&[1, 2], &[0])?;
/// assert_eq!(dec.reads(), &[1, 2]);
/// let mut out = [0.0f32; 2];
/// dec.decode(&[&b, &p], &mut [&mut out[..]])?;
/// assert_eq!(out, a2);
/// # Ok::<(), ftrec_ec::EcError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    Sum(SumCode),
    Gf256(Gf256Code),
}

impl Code {
    pub fn new(kind: CodeKind, k: usize, r: usize) -> Result<Self, EcError> {
        Ok(match kind {
            CodeKind::Sum => Code::Sum(SumCode::new(k, r)?),
            CodeKind::Gf256 => Code::Gf256(Gf256Code::new(k, r)?),
        })
    }

    pub fn kind(&self) -> CodeKind {
        match self {
            Code::Sum(_) => CodeKind::Sum,
            Code::Gf256(_) => CodeKind::Gf256,
        }
    }

    pub fn k(&self) -> usize {
        match self {
            Code::Sum(c) => c.k(),
            Code::Gf256(c) => c.k(),
        }
    }

    pub fn r(&self) -> usize {
        match self {
            Code::Sum(_) => 1,
            Code::Gf256(c) => c.r(),
        }
    }

    /// Positions per stripe, `k + r`.
    pub fn width(&self) -> usize {
        self.k() + self.r()
    }

    /// Fill the `r` parities of a stripe from its `k` data rows (missing rows of a short
    /// stripe are passed as zeros).
    pub fn encode(&self, data: &[&[f32]], parity: &mut [&mut [f32]]) -> Result<(), EcError> {
        match self {
            Code::Sum(c) => {
                check_len("parity rows of a stripe", 1, parity.len())?;
                c.encode(data, parity[0])
            }
            Code::Gf256(c) => c.encode(data, parity),
        }
    }

    /// What a data server sends to the holders of its row's parities after changing the row
    /// from `old` to `new`: `new - old` (sum) or the bits of `old XOR new` (gf256). The same
    /// delta goes to every parity holder.
    pub fn delta(&self, old: &[f32], new: &[f32], out: &mut [f32]) -> Result<(), EcError> {
        match self {
            Code::Sum(c) => c.delta(old, new, out),
            Code::Gf256(c) => c.delta(old, new, out),
        }
    }

    /// Apply the delta of data row `position` to parity `parity_index` (ECRec §3.2.1).
    pub fn apply_delta(
        &self,
        position: usize,
        parity_index: usize,
        delta: &[f32],
        parity: &mut [f32],
    ) -> Result<(), EcError> {
        match self {
            Code::Sum(c) => {
                self.check_sum_positions(position, parity_index)?;
                c.apply_delta(delta, parity)
            }
            Code::Gf256(c) => c.apply_delta(position, parity_index, delta, parity),
        }
    }

    /// [`Code::delta`] then [`Code::apply_delta`] in one pass, bit-identical to the two steps.
    pub fn update_parity(
        &self,
        position: usize,
        parity_index: usize,
        old: &[f32],
        new: &[f32],
        parity: &mut [f32],
    ) -> Result<(), EcError> {
        match self {
            Code::Sum(c) => {
                self.check_sum_positions(position, parity_index)?;
                c.update_parity(old, new, parity)
            }
            Code::Gf256(c) => c.update_parity(position, parity_index, old, new, parity),
        }
    }

    /// Add parity contributions accumulated apart (deltas applied with
    /// [`Code::apply_delta`] to a zeroed row) into `parity`: XOR for gf256, `+` for sum. Since
    /// both codes are linear, `encode(rows at step C)` merged with the deltas committed after
    /// C is the parity at the current step; a rebuilt parity is finished this way while
    /// training goes on (ECRec §3.4).
    pub fn merge_parity(&self, acc: &[f32], parity: &mut [f32]) -> Result<(), EcError> {
        check_len("accumulated parity contributions", parity.len(), acc.len())?;
        match self {
            Code::Sum(_) => {
                for (p, a) in parity.iter_mut().zip(acc) {
                    *p += a;
                }
            }
            Code::Gf256(_) => xor_into(bytes_mut(parity), bytes(acc)),
        }
        Ok(())
    }

    fn check_sum_positions(&self, position: usize, parity_index: usize) -> Result<(), EcError> {
        let k = self.k();
        if position >= k {
            return Err(EcError::PositionOutOfRange { position, width: k });
        }
        if parity_index != 0 {
            return Err(EcError::PositionOutOfRange {
                position: k + parity_index,
                width: k + 1,
            });
        }
        Ok(())
    }

    /// Plan the decode of the `wanted` positions given the positions still `available`.
    ///
    /// The decoder picks which `k` available rows to read ([`Decoder::reads`]): data rows
    /// before parities, lowest positions first, so that a stripe that lost only parities is
    /// re-encoded from its data. Errors: a position out of range or listed twice, a wanted
    /// position that is also available, or fewer than `k` available rows
    /// ([`EcError::TooManyErasures`]).
    pub fn decoder(&self, available: &[usize], wanted: &[usize]) -> Result<Decoder, EcError> {
        let (k, width) = (self.k(), self.width());
        let mut seen = vec![false; width];
        for (list, what) in [(available, "available"), (wanted, "wanted")] {
            for &p in list {
                if p >= width {
                    return Err(EcError::PositionOutOfRange { position: p, width });
                }
                if seen[p] {
                    return Err(EcError::InvalidDecode(format!(
                        "position {p} is listed twice ({what})"
                    )));
                }
                seen[p] = true;
            }
        }
        if wanted.is_empty() {
            return Err(EcError::InvalidDecode("no position to decode".into()));
        }
        if available.len() < k {
            return Err(EcError::TooManyErasures {
                lost: width - available.len(),
                tolerated: self.r(),
            });
        }
        let mut reads = available.to_vec();
        reads.sort_unstable();
        reads.truncate(k);
        let plan = match self {
            Code::Sum(_) => {
                // With r = 1 and k available, exactly one position is missing: `wanted`.
                if wanted[0] < k {
                    // ECRec §3.2: e_i = p - (the other rows), others in ascending order.
                    let parity_at = reads.len() - 1;
                    DecodePlan::SumData { parity_at }
                } else {
                    DecodePlan::SumParity
                }
            }
            Code::Gf256(c) => DecodePlan::Gf256 {
                coefs: gf256_coefficients(c, &reads, wanted)?,
            },
        };
        Ok(Decoder {
            reads,
            wanted: wanted.to_vec(),
            plan,
        })
    }

    /// Rebuild every row of a stripe whose `present` flag is false, in place. `rows` holds
    /// the `k + r` rows in position order; missing ones may hold anything (they are resized).
    pub fn reconstruct(&self, rows: &mut [Vec<f32>], present: &[bool]) -> Result<(), EcError> {
        let width = self.width();
        check_len("rows of a stripe", width, rows.len())?;
        check_len("presence flags of a stripe", width, present.len())?;
        let wanted: Vec<usize> = (0..width).filter(|&p| !present[p]).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let available: Vec<usize> = (0..width).filter(|&p| present[p]).collect();
        let dec = self.decoder(&available, &wanted)?;
        let words = rows[dec.reads[0]].len();
        let mut outs: Vec<Vec<f32>> = wanted
            .iter()
            .map(|&p| {
                let mut v = std::mem::take(&mut rows[p]);
                v.clear();
                v.resize(words, 0.0);
                v
            })
            .collect();
        let result = {
            let ins: Vec<&[f32]> = dec.reads.iter().map(|&p| rows[p].as_slice()).collect();
            let mut outs_ref: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            dec.decode(&ins, &mut outs_ref)
        };
        for (&p, v) in wanted.iter().zip(outs) {
            rows[p] = v;
        }
        result
    }
}

/// `coefs[w][s]`: weight of read `s` in wanted row `w`.
fn gf256_coefficients(
    code: &Gf256Code,
    reads: &[usize],
    wanted: &[usize],
) -> Result<Vec<Vec<u8>>, EcError> {
    let k = code.k();
    let p = code.matrix();
    // Row of the generator [I; P] for each read position.
    let m: Vec<Vec<u8>> = reads
        .iter()
        .map(|&pos| {
            if pos < k {
                (0..k).map(|i| u8::from(i == pos)).collect()
            } else {
                p[pos - k].clone()
            }
        })
        .collect();
    let inv = invert(&m).ok_or_else(|| {
        // Unreachable for a Cauchy-based generator; reported rather than trusted.
        EcError::InvalidDecode(format!("rows at positions {reads:?} are not independent"))
    })?;
    Ok(wanted
        .iter()
        .map(|&w| {
            if w < k {
                inv[w].clone()
            } else {
                // parity = P[j] . data = P[j] . inv . reads
                (0..k)
                    .map(|s| (0..k).fold(0u8, |acc, t| acc ^ mul(p[w - k][t], inv[t][s])))
                    .collect()
            }
        })
        .collect())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DecodePlan {
    /// Lost data row = read `parity_at` minus the other reads, in order.
    SumData {
        parity_at: usize,
    },
    /// Lost parity = sum of the reads (all data rows), in order.
    SumParity,
    Gf256 {
        coefs: Vec<Vec<u8>>,
    },
}

/// A decode planned for one erasure pattern; reusable for every stripe with that pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoder {
    reads: Vec<usize>,
    wanted: Vec<usize>,
    plan: DecodePlan,
}

impl Decoder {
    /// Positions to read, in the order [`Decoder::decode`] expects their rows.
    pub fn reads(&self) -> &[usize] {
        &self.reads
    }

    /// Positions produced, in the order of [`Decoder::decode`]'s outputs.
    pub fn wanted(&self) -> &[usize] {
        &self.wanted
    }

    /// Decode: `inputs[i]` is the row at `reads()[i]`, `out[w]` receives `wanted()[w]`.
    pub fn decode(&self, inputs: &[&[f32]], out: &mut [&mut [f32]]) -> Result<(), EcError> {
        check_len("rows read for a decode", self.reads.len(), inputs.len())?;
        check_len("rows decoded", self.wanted.len(), out.len())?;
        let words = inputs[0].len();
        for row in inputs {
            check_len("row read for a decode", words, row.len())?;
        }
        for row in out.iter() {
            check_len("decoded row", words, row.len())?;
        }
        match &self.plan {
            DecodePlan::SumData { parity_at } => {
                let o = &mut *out[0];
                o.copy_from_slice(inputs[*parity_at]);
                for (s, row) in inputs.iter().enumerate() {
                    if s != *parity_at {
                        for (x, v) in o.iter_mut().zip(row.iter()) {
                            *x -= v;
                        }
                    }
                }
            }
            DecodePlan::SumParity => {
                let o = &mut *out[0];
                o.copy_from_slice(inputs[0]);
                for row in &inputs[1..] {
                    for (x, v) in o.iter_mut().zip(row.iter()) {
                        *x += v;
                    }
                }
            }
            DecodePlan::Gf256 { coefs } => {
                for (o, row_coefs) in out.iter_mut().zip(coefs) {
                    let o = bytes_mut(o);
                    o.fill(0);
                    for (input, &c) in inputs.iter().zip(row_coefs) {
                        mul_xor_into(c, bytes(input), o);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_print() {
        for kind in CodeKind::ALL {
            assert_eq!(kind.name().parse::<CodeKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert!(matches!(
            "xor3".parse::<CodeKind>(),
            Err(EcError::UnknownCode(_))
        ));
        assert!(CodeKind::Gf256.is_exact());
        assert!(!CodeKind::Sum.is_exact());
    }

    #[test]
    fn decoder_rejects_bad_requests() {
        let code = Code::new(CodeKind::Gf256, 3, 2).unwrap();
        assert!(matches!(
            code.decoder(&[0, 1, 5], &[2]),
            Err(EcError::PositionOutOfRange {
                position: 5,
                width: 5
            })
        ));
        assert!(matches!(
            code.decoder(&[0, 1, 1], &[2]),
            Err(EcError::InvalidDecode(_))
        ));
        assert!(matches!(
            code.decoder(&[0, 1, 2], &[2]),
            Err(EcError::InvalidDecode(_))
        ));
        assert!(matches!(
            code.decoder(&[0, 1, 3], &[]),
            Err(EcError::InvalidDecode(_))
        ));
        assert_eq!(
            code.decoder(&[0, 1], &[2, 3, 4]),
            Err(EcError::TooManyErasures {
                lost: 3,
                tolerated: 2
            })
        );
        let sum = Code::new(CodeKind::Sum, 3, 1).unwrap();
        assert_eq!(
            sum.decoder(&[0, 3], &[1, 2]),
            Err(EcError::TooManyErasures {
                lost: 2,
                tolerated: 1
            })
        );
    }

    #[test]
    fn decoder_prefers_data_rows() {
        let code = Code::new(CodeKind::Gf256, 3, 3).unwrap();
        let dec = code.decoder(&[5, 4, 2, 0, 1], &[3]).unwrap();
        assert_eq!(dec.reads(), &[0, 1, 2]);
        let dec = code.decoder(&[5, 4, 2, 0], &[1, 3]).unwrap();
        assert_eq!(dec.reads(), &[0, 2, 4]);
    }

    #[test]
    fn decode_checks_shapes() {
        let code = Code::new(CodeKind::Sum, 2, 1).unwrap();
        let dec = code.decoder(&[1, 2], &[0]).unwrap();
        let a = [1.0f32; 3];
        let b = [1.0f32; 2];
        let mut out = [0.0f32; 3];
        assert!(matches!(
            dec.decode(&[&a, &b], &mut [&mut out[..]]),
            Err(EcError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            dec.decode(&[&a], &mut [&mut out[..]]),
            Err(EcError::ShapeMismatch { .. })
        ));
        let mut short = [0.0f32; 2];
        assert!(matches!(
            dec.decode(&[&a, &a], &mut [&mut short[..]]),
            Err(EcError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            code.apply_delta(0, 1, &a, &mut out),
            Err(EcError::PositionOutOfRange { .. })
        ));
        assert!(matches!(
            code.reconstruct(&mut [vec![1.0], vec![2.0]], &[true, false]),
            Err(EcError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn merged_contributions_equal_in_place_updates() {
        // A parity rebuilt from old rows plus separately accumulated deltas equals the parity
        // updated in place, bit for bit (gf256).
        let code = Code::new(CodeKind::Gf256, 3, 2).unwrap();
        let rows = [vec![1.0f32, -2.0], vec![0.25, 8.0], vec![3.5, 0.0]];
        let new1 = vec![7.0f32, f32::MIN_POSITIVE];
        for j in 0..2 {
            let mut enc = [vec![0.0f32; 2], vec![0.0f32; 2]];
            let (a, b) = enc.split_at_mut(1);
            code.encode(
                &[&rows[0], &rows[1], &rows[2]],
                &mut [&mut a[0][..], &mut b[0][..]],
            )
            .unwrap();
            let mut in_place = enc[j].clone();
            code.update_parity(1, j, &rows[1], &new1, &mut in_place)
                .unwrap();
            let mut acc = vec![0.0f32; 2];
            code.update_parity(1, j, &rows[1], &new1, &mut acc).unwrap();
            let mut merged = enc[j].clone();
            code.merge_parity(&acc, &mut merged).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&merged), bits(&in_place));
        }
        assert!(matches!(
            code.merge_parity(&[0.0], &mut [0.0, 1.0]),
            Err(EcError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn sum_code_decodes_the_paper_example() {
        // ECRec §3.2: p = e0 + e1 + e2; e1 = p - e0 - e2.
        let code = Code::new(CodeKind::Sum, 3, 1).unwrap();
        let mut rows = vec![
            vec![1.0f32, 2.0],
            vec![0.5, -1.0],
            vec![4.0, 8.0],
            vec![0.0; 2],
        ];
        let (d, p) = rows.split_at_mut(3);
        code.encode(&[&d[0], &d[1], &d[2]], &mut [&mut p[0][..]])
            .unwrap();
        assert_eq!(rows[3], vec![5.5, 9.0]);
        rows[1] = vec![f32::NAN; 2];
        code.reconstruct(&mut rows, &[true, false, true, true])
            .unwrap();
        assert_eq!(rows[1], vec![0.5, -1.0]);
        rows[3].clear();
        code.reconstruct(&mut rows, &[true, true, true, false])
            .unwrap();
        assert_eq!(rows[3], vec![5.5, 9.0]);
    }
}
