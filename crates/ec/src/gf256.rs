//! Bit-exact systematic Reed–Solomon over GF(2^8) on the raw bytes of rows.
//!
//! A row (values then optimizer state, 32-bit words) is coded as its byte image, so a decoded
//! row equals the lost row bit for bit whatever the floats hold (NaN payloads, Adam's integer
//! step counter). With `k` data rows and `r` parities per stripe, parity `j` is
//! `sum_i P[j][i] * d_i` (sum = XOR, products in GF(2^8)) where `P` is a normalised Cauchy
//! matrix (see `gf::cauchy_parity_matrix`), so any `k` of the `k + r` rows rebuild the rest.
//!
//! Difference propagation (ECRec §3.2.1) is exact here: a data server sends `old XOR new`, and
//! parity holder `j` applies `parity_j ^= P[j][i] * (old XOR new)`. Because XOR is associative
//! and self-inverse, any sequence of such updates leaves exactly the bits a fresh encode of the
//! current rows would produce, unlike the float sum.
//!
//! Parity rows live in `f32` slices so that servers can store them like data rows (same
//! [`RowLayout`](ftrec_core::RowLayout), same tables). Their words are bit containers: copy
//! them, hash them, ship them, never do float arithmetic on them (copies preserve every bit,
//! NaN payloads included; arithmetic would not).

use crate::code::check_len;
use crate::gf::{bytes, bytes_mut, cauchy_parity_matrix, mul_xor_into, xor_into};
use crate::EcError;

/// Bytes of scratch used by [`Gf256Code::update_parity`] to form `old XOR new` on the stack.
const SCRATCH: usize = 1024;

/// Systematic Reed–Solomon over GF(2^8) with `k` data and `r` parity rows per stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gf256Code {
    k: usize,
    r: usize,
    /// `r x k` parity coefficients.
    p: Vec<Vec<u8>>,
}

impl Gf256Code {
    /// `k >= 1`, `r >= 1` and `k + r <= 256` (a Cauchy matrix needs `k + r` distinct field
    /// elements).
    pub fn new(k: usize, r: usize) -> Result<Self, EcError> {
        if k == 0 || r == 0 {
            return Err(EcError::InvalidParameters(format!(
                "the gf256 code needs k >= 1 and r >= 1, got k = {k}, r = {r}"
            )));
        }
        if k + r > 256 {
            return Err(EcError::InvalidParameters(format!(
                "the gf256 code supports k + r <= 256, got k = {k}, r = {r}"
            )));
        }
        Ok(Gf256Code {
            k,
            r,
            p: cauchy_parity_matrix(k, r),
        })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn r(&self) -> usize {
        self.r
    }

    /// The coefficient with which data row `position` enters parity `parity`.
    pub fn coefficient(&self, parity: usize, position: usize) -> Result<u8, EcError> {
        self.check_parity(parity)?;
        self.check_data(position)?;
        Ok(self.p[parity][position])
    }

    pub(crate) fn matrix(&self) -> &[Vec<u8>] {
        &self.p
    }

    fn check_parity(&self, parity: usize) -> Result<(), EcError> {
        if parity < self.r {
            Ok(())
        } else {
            Err(EcError::PositionOutOfRange {
                position: self.k + parity,
                width: self.k + self.r,
            })
        }
    }

    fn check_data(&self, position: usize) -> Result<(), EcError> {
        if position < self.k {
            Ok(())
        } else {
            Err(EcError::PositionOutOfRange {
                position,
                width: self.k,
            })
        }
    }

    /// Fill the `r` parities of a stripe from its `k` data rows.
    pub fn encode(&self, data: &[&[f32]], parity: &mut [&mut [f32]]) -> Result<(), EcError> {
        check_len("data rows of a stripe", self.k, data.len())?;
        check_len("parity rows of a stripe", self.r, parity.len())?;
        let width = data[0].len();
        for row in data {
            check_len("data row", width, row.len())?;
        }
        for row in parity.iter() {
            check_len("parity row", width, row.len())?;
        }
        for (j, out) in parity.iter_mut().enumerate() {
            let out = bytes_mut(out);
            out.fill(0);
            for (i, row) in data.iter().enumerate() {
                mul_xor_into(self.p[j][i], bytes(row), out);
            }
        }
        Ok(())
    }

    /// The difference a data server sends to every parity holder: the bits of `old XOR new`.
    pub fn delta(&self, old: &[f32], new: &[f32], out: &mut [f32]) -> Result<(), EcError> {
        check_len("new row", old.len(), new.len())?;
        check_len("delta", old.len(), out.len())?;
        for ((d, o), n) in out.iter_mut().zip(old).zip(new) {
            *d = f32::from_bits(o.to_bits() ^ n.to_bits());
        }
        Ok(())
    }

    /// `parity_j ^= P[j][position] * delta`: apply a data row's difference to parity `j`.
    pub fn apply_delta(
        &self,
        position: usize,
        parity_index: usize,
        delta: &[f32],
        parity: &mut [f32],
    ) -> Result<(), EcError> {
        self.check_data(position)?;
        self.check_parity(parity_index)?;
        check_len("delta", parity.len(), delta.len())?;
        mul_xor_into(
            self.p[parity_index][position],
            bytes(delta),
            bytes_mut(parity),
        );
        Ok(())
    }

    /// [`Gf256Code::delta`] then [`Gf256Code::apply_delta`] without allocating.
    pub fn update_parity(
        &self,
        position: usize,
        parity_index: usize,
        old: &[f32],
        new: &[f32],
        parity: &mut [f32],
    ) -> Result<(), EcError> {
        self.check_data(position)?;
        self.check_parity(parity_index)?;
        check_len("old row", parity.len(), old.len())?;
        check_len("new row", parity.len(), new.len())?;
        let c = self.p[parity_index][position];
        let (old, new, parity) = (bytes(old), bytes(new), bytes_mut(parity));
        if c == 1 {
            xor_into(parity, old);
            xor_into(parity, new);
            return Ok(());
        }
        let mut scratch = [0u8; SCRATCH];
        for ((o, n), p) in old
            .chunks(SCRATCH)
            .zip(new.chunks(SCRATCH))
            .zip(parity.chunks_mut(SCRATCH))
        {
            let d = &mut scratch[..o.len()];
            d.copy_from_slice(o);
            xor_into(d, n);
            mul_xor_into(c, d, p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(k: usize, width: usize, salt: u32) -> Vec<Vec<f32>> {
        (0..k)
            .map(|i| {
                (0..width)
                    .map(|w| f32::from_bits((i as u32 * 7919 + w as u32 * 104_729) ^ salt))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn parameters_are_checked() {
        assert!(matches!(
            Gf256Code::new(0, 1),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            Gf256Code::new(4, 0),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(matches!(
            Gf256Code::new(250, 7),
            Err(EcError::InvalidParameters(_))
        ));
        assert!(Gf256Code::new(250, 6).is_ok());
        let code = Gf256Code::new(3, 2).unwrap();
        assert!(matches!(
            code.coefficient(2, 0),
            Err(EcError::PositionOutOfRange { .. })
        ));
        assert!(matches!(
            code.coefficient(0, 3),
            Err(EcError::PositionOutOfRange { .. })
        ));
        assert_eq!(code.coefficient(0, 2), Ok(1));
    }

    #[test]
    fn one_parity_is_plain_xor() {
        let code = Gf256Code::new(3, 1).unwrap();
        let data = rows(3, 5, 0xDEAD);
        let refs: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
        let mut p = [0.0f32; 5];
        code.encode(&refs, &mut [&mut p[..]]).unwrap();
        for w in 0..5 {
            let x = data.iter().fold(0u32, |acc, r| acc ^ r[w].to_bits());
            assert_eq!(p[w].to_bits(), x);
        }
    }

    #[test]
    fn update_parity_equals_delta_then_apply_and_fresh_encode() {
        // Wide enough to cross the stack scratch boundary.
        let width = 700;
        let code = Gf256Code::new(4, 3).unwrap();
        let mut data = rows(4, width, 1);
        let mut parity = vec![vec![0.0f32; width]; 3];
        {
            let refs: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
            let mut outs: Vec<&mut [f32]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
            code.encode(&refs, &mut outs).unwrap();
        }
        let new = rows(1, width, 0xBEEF).remove(0);
        let mut via_delta = parity.clone();
        let mut d = vec![0.0f32; width];
        code.delta(&data[2], &new, &mut d).unwrap();
        for j in 0..3 {
            code.update_parity(2, j, &data[2], &new, &mut parity[j])
                .unwrap();
            code.apply_delta(2, j, &d, &mut via_delta[j]).unwrap();
        }
        data[2] = new;
        let mut fresh = vec![vec![0.0f32; width]; 3];
        {
            let refs: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
            let mut outs: Vec<&mut [f32]> = fresh.iter_mut().map(|p| p.as_mut_slice()).collect();
            code.encode(&refs, &mut outs).unwrap();
        }
        let bits = |v: &Vec<Vec<f32>>| -> Vec<Vec<u32>> {
            v.iter()
                .map(|r| r.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        assert_eq!(bits(&parity), bits(&fresh));
        assert_eq!(bits(&via_delta), bits(&fresh));
    }

    #[test]
    fn shape_errors_do_not_panic() {
        let code = Gf256Code::new(2, 1).unwrap();
        let a = [0.0f32; 4];
        let b = [0.0f32; 3];
        let mut p = [0.0f32; 4];
        assert!(matches!(
            code.encode(&[&a, &b], &mut [&mut p[..]]),
            Err(EcError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            code.encode(&[&a], &mut [&mut p[..]]),
            Err(EcError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            code.update_parity(0, 0, &a, &b, &mut p),
            Err(EcError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            code.apply_delta(0, 0, &b, &mut p),
            Err(EcError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            code.apply_delta(2, 0, &a, &mut p),
            Err(EcError::PositionOutOfRange { .. })
        ));
    }
}
