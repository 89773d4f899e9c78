use std::time::Instant;
fn time<F: FnMut()>(mut f: F) -> f64 {
    f();
    let mut v: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
fn main() {
    let b = 2048usize;
    let layers = [
        (13usize, 512usize),
        (512, 256),
        (256, 64),
        (64, 16),
        (367, 512),
        (512, 256),
        (256, 1),
    ];
    let mut tot = 0.0;
    for (li, &(i, o)) in layers.iter().enumerate() {
        let x = vec![0.5f32; b * i];
        let w = vec![0.25f32; o * i];
        let mut y = vec![0.0f32; b * o];
        let g = vec![0.1f32; b * o];
        let mut dx = vec![0.0f32; b * i];
        let mut dw = vec![0.0f32; o * i];
        let fl = 2.0 * (b * i * o) as f64;
        unsafe {
            // fwd: y = x w^T
            let t1 = time(|| {
                matrixmultiply::sgemm(
                    b,
                    i,
                    o,
                    1.0,
                    x.as_ptr(),
                    i as isize,
                    1,
                    w.as_ptr(),
                    1,
                    i as isize,
                    0.0,
                    y.as_mut_ptr(),
                    o as isize,
                    1,
                )
            });
            // dx = g w
            let t2 = time(|| {
                matrixmultiply::sgemm(
                    b,
                    o,
                    i,
                    1.0,
                    g.as_ptr(),
                    o as isize,
                    1,
                    w.as_ptr(),
                    i as isize,
                    1,
                    0.0,
                    dx.as_mut_ptr(),
                    i as isize,
                    1,
                )
            });
            // dw = g^T x
            let t3 = time(|| {
                matrixmultiply::sgemm(
                    o,
                    b,
                    i,
                    1.0,
                    g.as_ptr(),
                    1,
                    o as isize,
                    x.as_ptr(),
                    i as isize,
                    1,
                    0.0,
                    dw.as_mut_ptr(),
                    i as isize,
                    1,
                )
            });
            // dw^T = x^T g  (alternative orientation: [in x out])
            let t4 = time(|| {
                matrixmultiply::sgemm(
                    i,
                    b,
                    o,
                    1.0,
                    x.as_ptr(),
                    1,
                    i as isize,
                    g.as_ptr(),
                    o as isize,
                    1,
                    0.0,
                    dw.as_mut_ptr(),
                    o as isize,
                    1,
                )
            });
            // dw written transposed via strides
            let t5 = time(|| {
                matrixmultiply::sgemm(
                    i,
                    b,
                    o,
                    1.0,
                    x.as_ptr(),
                    1,
                    i as isize,
                    g.as_ptr(),
                    o as isize,
                    1,
                    0.0,
                    dw.as_mut_ptr(),
                    1,
                    i as isize,
                )
            });
            println!("layer {li} {i}->{o}: fwd {:.2} ms ({:.0} GF) dx {:.2} ms ({:.0}) dw {:.2} ms ({:.0}) dwT {:.2} ({:.0}) dw-via-cstride {:.2} ({:.0})",
                t1*1e3, fl/t1/1e9, t2*1e3, fl/t2/1e9, t3*1e3, fl/t3/1e9, t4*1e3, fl/t4/1e9, t5*1e3, fl/t5/1e9);
            tot += t1 + t3 + if li > 0 { t2 } else { 0.0 };
        }
    }
    println!("sum of gemms {:.2} ms", tot * 1e3);
}
