//! Argument types shared by several commands, checked when the arguments are parsed.

use std::time::Duration;

/// Longest time a `SECS` argument may give: beyond it a deadline computed from now could overflow the clock.
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// A `SECS` argument: a finite number of seconds above zero and at most a week (fractions allowed).
pub fn seconds(text: &str) -> Result<Duration, String> {
    let secs: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > MAX_SECONDS {
        return Err(format!("{text} seconds: give a number above 0 and at most {MAX_SECONDS} (a week)"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{text} seconds: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_seconds() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds("604800"), Ok(Duration::from_secs(604_800)));
        for bad in ["inf", "-inf", "NaN", "0", "-1", "1e300", "604801", "abc", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
