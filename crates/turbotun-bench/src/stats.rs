//! Median and range of repeated measurements.

use serde::Serialize;

/// Median with min and max of a set of repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub(crate) struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// `None` for an empty set; NaNs are ignored.
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Spread { median, min: v[0], max: v[n - 1], n })
    }
}

/// Format a number with a precision that suits its magnitude (3 significant digits, at least an integer).
pub(crate) fn fmt_num(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// `median (min–max)`, or just the median for one repetition.
pub(crate) fn fmt_spread(s: &Spread) -> String {
    if s.n <= 1 || s.min == s.max {
        fmt_num(s.median)
    } else {
        format!("{} ({}–{})", fmt_num(s.median), fmt_num(s.min), fmt_num(s.max))
    }
}

/// Large counts as 1.2k / 3.4M.
pub(crate) fn fmt_count(x: f64) -> String {
    let a = x.abs();
    if a >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", x / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A table cell: the median and spread, or a dash for no data.
pub(crate) fn cell(s: Option<Spread>) -> String {
    s.map(|s| fmt_spread(&s)).unwrap_or_else(|| "–".into())
}

/// A table cell: the median alone, or a dash.
pub(crate) fn med(s: Option<Spread>) -> String {
    s.map(|s| fmt_num(s.median)).unwrap_or_else(|| "–".into())
}

/// A table cell: the median as a count (`7.4k`), or a dash.
pub(crate) fn med_count(s: Option<Spread>) -> String {
    s.map(|s| fmt_count(s.median)).unwrap_or_else(|| "–".into())
}

/// A table cell: a ratio (`1.46×`), or a dash.
pub(crate) fn ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}×")).unwrap_or_else(|| "–".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Spread::of([4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 10.0, 4));
        assert_eq!(Spread::of([]), None);
        assert_eq!(Spread::of([f64::NAN]), None);
        let s = Spread::of([f64::NAN, 5.0]).unwrap();
        assert_eq!((s.median, s.n), (5.0, 1));
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_num(21.94), "21.9");
        assert_eq!(fmt_num(2.5), "2.50");
        assert_eq!(fmt_num(134.4), "134");
        assert_eq!(fmt_num(0.0534), "0.053");
        assert_eq!(fmt_spread(&Spread::of([15.2, 21.9, 30.9]).unwrap()), "21.9 (15.2–30.9)");
        assert_eq!(fmt_spread(&Spread::of([7.0]).unwrap()), "7.00");
        assert_eq!(fmt_count(1900.0), "1.9k");
        assert_eq!(fmt_count(22000.0), "22k");
        assert_eq!(fmt_count(50.0), "50");
        assert_eq!(fmt_count(2_500_000.0), "2.5M");
    }
}
