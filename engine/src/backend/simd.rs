//! Vector kernels for the CPU backend with a runtime choice of AVX2+FMA.
//!
//! Release binaries target baseline x86-64 so they run on any node; the hot dot product and
//! axpy are compiled a second time with AVX2/FMA and picked at run time when the CPU has them.

#[inline(always)]
fn dot_generic<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // Eight independent accumulators let the compiler keep a full vector register busy.
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] = if FMA {
                x[i].mul_add(y[i], acc[i])
            } else {
                acc[i] + x[i] * y[i]
            };
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s
}

#[inline(always)]
fn axpy_generic<const FMA: bool>(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = if FMA {
            xi.mul_add(alpha, *yi)
        } else {
            *yi + alpha * xi
        };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_generic::<true>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_generic::<true>(alpha, x, y)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// Σ a[i]·b[i] over the shorter length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { dot_avx2(a, b) };
    }
    dot_generic::<false>(a, b)
}

/// y[i] += alpha · x[i].
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { axpy_avx2(alpha, x, y) };
    }
    axpy_generic::<false>(alpha, x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_scalar_loops() {
        for n in [0usize, 1, 7, 8, 9, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - want).abs() < 1e-4, "n={n}");
            let mut y = b.clone();
            axpy(0.5, &a, &mut y);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }
}
