//! Token-length distributions for `--input-len` / `--output-len`.

use std::fmt;
use std::str::FromStr;

use ballast_rng::SplitMix64;

/// Upper bound for any sampled length; it keeps a heavy-tailed distribution
/// from producing a prompt no server could accept (or we could allocate).
const MAX_LEN: u64 = 1 << 24;

/// A distribution of token counts, parsed from `N`, `uniform:LO:HI`,
/// `normal:MEAN:STD` or `exp:MEAN`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LengthSpec {
    Fixed(u64),
    /// Inclusive on both ends.
    Uniform {
        lo: u64,
        hi: u64,
    },
    /// Rounded to the nearest integer and clamped to at least 1.
    Normal {
        mean: f64,
        std: f64,
    },
    /// Rounded to the nearest integer and clamped to at least 1.
    Exp {
        mean: f64,
    },
}

impl LengthSpec {
    /// Draws one length; always in `1..=MAX_LEN`.
    pub(crate) fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let raw = match *self {
            LengthSpec::Fixed(n) => return n,
            LengthSpec::Uniform { lo, hi } => return rng.inclusive(lo, hi),
            LengthSpec::Normal { mean, std } => mean + std * rng.standard_normal(),
            LengthSpec::Exp { mean } => rng.exponential(mean),
        };
        // `as` saturates for out-of-range floats, and the clamp handles the rest.
        (raw.round() as u64).clamp(1, MAX_LEN)
    }
}

fn count(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))?;
    if n == 0 {
        return Err("lengths must be at least 1".into());
    }
    if n > MAX_LEN {
        return Err(format!("lengths must be at most {MAX_LEN}"));
    }
    Ok(n)
}

fn real(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(format!("{s:?} is not a number")),
    }
}

impl FromStr for LengthSpec {
    type Err = String;

    /// Parses a SPEC; the error is a reason suitable after "invalid value".
    fn from_str(s: &str) -> Result<Self, String> {
        const USAGE: &str = "expected N, uniform:LO:HI, normal:MEAN:STD or exp:MEAN";
        let parts: Vec<&str> = s.trim().split(':').collect();
        match parts.as_slice() {
            [n] => count(n).map(LengthSpec::Fixed),
            ["uniform", lo, hi] => {
                let (lo, hi) = (count(lo)?, count(hi)?);
                if lo > hi {
                    return Err(format!("uniform needs LO <= HI, got {lo} > {hi}"));
                }
                Ok(LengthSpec::Uniform { lo, hi })
            }
            ["normal", mean, std] => {
                let (mean, std) = (real(mean)?, real(std)?);
                if mean <= 0.0 || std < 0.0 {
                    return Err("normal needs MEAN > 0 and STD >= 0".into());
                }
                Ok(LengthSpec::Normal { mean, std })
            }
            ["exp", mean] => {
                let mean = real(mean)?;
                if mean <= 0.0 {
                    return Err("exp needs MEAN > 0".into());
                }
                Ok(LengthSpec::Exp { mean })
            }
            _ => Err(USAGE.into()),
        }
    }
}

impl fmt::Display for LengthSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LengthSpec::Fixed(n) => write!(f, "{n}"),
            LengthSpec::Uniform { lo, hi } => write!(f, "uniform:{lo}:{hi}"),
            LengthSpec::Normal { mean, std } => write!(f, "normal:{mean}:{std}"),
            LengthSpec::Exp { mean } => write!(f, "exp:{mean}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!("128".parse(), Ok(LengthSpec::Fixed(128)));
        assert_eq!(
            "uniform:10:20".parse(),
            Ok(LengthSpec::Uniform { lo: 10, hi: 20 })
        );
        assert_eq!(
            "normal:100:15.5".parse(),
            Ok(LengthSpec::Normal {
                mean: 100.0,
                std: 15.5
            })
        );
        assert_eq!("exp:64".parse(), Ok(LengthSpec::Exp { mean: 64.0 }));
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            "0",
            "-3",
            "abc",
            "uniform:5",
            "uniform:9:2",
            "uniform:0:4",
            "normal:abc:1",
            "normal:-1:1",
            "normal:10:-1",
            "exp:0",
            "exp:nan",
            "gamma:1:2",
            "normal:1:2:3",
        ] {
            assert!(bad.parse::<LengthSpec>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["7", "uniform:1:9", "normal:50:5", "exp:12.5"] {
            let spec: LengthSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
            assert_eq!(spec.to_string().parse::<LengthSpec>(), Ok(spec));
        }
    }

    #[test]
    fn samples_stay_in_bounds() {
        let mut rng = SplitMix64::new(42);
        let uniform = LengthSpec::Uniform { lo: 5, hi: 9 };
        let (mut min, mut max) = (u64::MAX, 0);
        for _ in 0..5_000 {
            let v = uniform.sample(&mut rng);
            assert!((5..=9).contains(&v));
            min = min.min(v);
            max = max.max(v);
        }
        // Inclusive bounds: both ends must actually be produced.
        assert_eq!((min, max), (5, 9));

        assert_eq!(LengthSpec::Fixed(33).sample(&mut rng), 33);

        // A wide normal and a small-mean exponential both try to go below 1.
        let normal = LengthSpec::Normal {
            mean: 2.0,
            std: 50.0,
        };
        let exp = LengthSpec::Exp { mean: 0.4 };
        for _ in 0..5_000 {
            assert!(normal.sample(&mut rng) >= 1);
            assert!(exp.sample(&mut rng) >= 1);
        }
    }

    #[test]
    fn normal_and_exp_means_are_about_right() {
        let mut rng = SplitMix64::new(9);
        let n = 20_000;
        let normal = LengthSpec::Normal {
            mean: 200.0,
            std: 20.0,
        };
        let exp = LengthSpec::Exp { mean: 50.0 };
        let nm = (0..n).map(|_| normal.sample(&mut rng)).sum::<u64>() as f64 / n as f64;
        let em = (0..n).map(|_| exp.sample(&mut rng)).sum::<u64>() as f64 / n as f64;
        assert!((nm - 200.0).abs() < 1.0, "normal mean {nm}");
        assert!((em - 50.0).abs() < 2.0, "exp mean {em}");
    }
}
