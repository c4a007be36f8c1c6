//! The no-drop search (RFC 2544 throughput) as a stepper: each forwarder's search asks for one rate at a time
//! and is told the trial's outcome, so that a bench can interleave the steps of every forwarder's search (one
//! trial of each in turn), the way it interleaves everything else it compares.

use serde::{Deserialize, Serialize};

/// What a search found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Search {
    /// The highest rate that passed (in the search or the table); None if none did.
    pub no_drop_pps: Option<u64>,
    /// The lowest failing rate the search settled against; None when the top rate passed.
    pub lowest_fail_pps: Option<u64>,
    /// Trials run by the search.
    pub trials: usize,
    /// Whether the trial budget ran out before the resolution was reached.
    pub budget_exhausted: bool,
}

/// Where a [`Searcher`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing known failed: the top rate is tried first.
    Top,
    /// Halving the bracket `lo..hi` (`lo` passed or is 0, `hi` failed).
    Bisect {
        lo: u64,
        hi: u64,
    },
    Done,
}

/// RFC 2544's binary search for the highest rate that passes, up to `max_rate`, with at most `max_trials`
/// trials. `known` holds trials already run (the table's rows: rate, passed). The search brackets the answer
/// with the lowest known failing rate and the highest known passing rate below it (a pass above a failure is
/// taken for noise); without a known failure it tries `max_rate` first, and stops there if that passes. Then it
/// halves the bracket until it is at most `resolution` wide or the budget is spent. The result is always a
/// rate that passed, so a noisy trial can make it low, never claim a rate that was not seen to pass.
#[derive(Debug, Clone)]
pub(crate) struct Searcher {
    found: Search,
    step: Step,
    max_rate: u64,
    max_trials: usize,
    resolution: u64,
}

impl Searcher {
    pub(crate) fn new(max_rate: u64, known: &[(u64, bool)], max_trials: usize, resolution: u64) -> Searcher {
        let mut found = Search::default();
        let known: Vec<(u64, bool)> = known.iter().copied().filter(|(r, _)| *r <= max_rate).collect();
        let lowest_fail = known.iter().filter(|(_, p)| !p).map(|(r, _)| *r).min();
        let step = match lowest_fail {
            Some(hi) => {
                found.no_drop_pps = known.iter().filter(|&&(r, p)| p && r < hi).map(|(r, _)| *r).max();
                Step::Bisect { lo: found.no_drop_pps.unwrap_or(0), hi }
            }
            None if known.iter().any(|&(r, p)| p && r == max_rate) => {
                found.no_drop_pps = Some(max_rate);
                Step::Done
            }
            None if max_trials == 0 => {
                found.no_drop_pps = known.iter().filter(|(_, p)| *p).map(|(r, _)| *r).max();
                found.budget_exhausted = true;
                Step::Done
            }
            None => Step::Top,
        };
        let mut searcher = Searcher { found, step, max_rate, max_trials, resolution: resolution.max(1) };
        searcher.settle();
        searcher
    }

    /// The rate of the next trial; None once the search is over.
    pub(crate) fn next_rate(&self) -> Option<u64> {
        match self.step {
            Step::Top => Some(self.max_rate),
            Step::Bisect { lo, hi } => Some(lo + (hi - lo) / 2),
            Step::Done => None,
        }
    }

    /// The outcome of the trial at [`Self::next_rate`].
    pub(crate) fn record(&mut self, passed: bool) {
        self.found.trials += 1;
        self.step = match self.step {
            Step::Top if passed => {
                self.found.no_drop_pps = Some(self.max_rate);
                Step::Done
            }
            Step::Top => Step::Bisect { lo: 0, hi: self.max_rate },
            Step::Bisect { lo, hi } => {
                let mid = lo + (hi - lo) / 2;
                if passed {
                    self.found.no_drop_pps = Some(mid);
                    Step::Bisect { lo: mid, hi }
                } else {
                    Step::Bisect { lo, hi: mid }
                }
            }
            Step::Done => Step::Done,
        };
        self.settle();
    }

    /// Ends a bisection that is narrow enough or out of trials.
    fn settle(&mut self) {
        if let Step::Bisect { lo, hi } = self.step {
            if hi - lo <= self.resolution || self.found.trials >= self.max_trials {
                self.found.budget_exhausted = hi - lo > self.resolution;
                self.found.lowest_fail_pps = Some(hi);
                self.step = Step::Done;
            }
        }
    }

    /// What it found (so far).
    pub(crate) fn result(&self) -> Search {
        self.found
    }
}

/// [`Searcher`] run to its end with `pass` (a fixed-length trial at a rate) as its trials: the search alone,
/// for the tests (the bench interleaves searchers instead).
#[cfg(test)]
pub(crate) fn search_no_drop<E>(
    max_rate: u64,
    known: &[(u64, bool)],
    max_trials: usize,
    resolution: u64,
    mut pass: impl FnMut(u64) -> std::result::Result<bool, E>,
) -> std::result::Result<Search, E> {
    let mut searcher = Searcher::new(max_rate, known, max_trials, resolution);
    while let Some(rate) = searcher.next_rate() {
        searcher.record(pass(rate)?);
    }
    Ok(searcher.result())
}

#[cfg(test)]
mod tests {
    use super::super::{RESOLUTION_PPS, SEARCH_TRIALS, STEPS_KPPS};
    use super::*;

    /// Runs a search whose trials are `curve(rate)`, counting the calls and checking each is inside the range.
    fn search(max: u64, known: &[(u64, bool)], budget: usize, curve: impl Fn(u64) -> bool) -> (Search, Vec<u64>) {
        let mut calls = Vec::new();
        let s = search_no_drop(max, known, budget, RESOLUTION_PPS, |rate| {
            assert!(rate <= max, "trial above the range: {rate}");
            calls.push(rate);
            Ok::<_, ()>(curve(rate))
        })
        .unwrap();
        assert_eq!(s.trials, calls.len(), "{s:?}");
        assert!(s.trials <= budget, "{s:?} over the budget of {budget}");
        (s, calls)
    }

    fn table(steps: &[u64], curve: impl Fn(u64) -> bool) -> Vec<(u64, bool)> {
        steps.iter().map(|&k| (k * 1000, curve(k * 1000))).collect()
    }

    #[test]
    fn monotone_curve_converges_to_the_knee() {
        let knee = 123_456;
        let curve = |r: u64| r <= knee;
        let known = table(STEPS_KPPS, curve);
        let (s, calls) = search(300_000, &known, 20, curve);
        let found = s.no_drop_pps.unwrap();
        assert!(found <= knee && knee - found <= RESOLUTION_PPS, "{s:?}");
        assert!(s.lowest_fail_pps.unwrap() > knee && s.lowest_fail_pps.unwrap() - found <= RESOLUTION_PPS);
        assert!(!s.budget_exhausted);
        // Bracketed by the table (100k passes, 150k fails): every trial inside, none repeated from the table.
        assert!(calls.iter().all(|&c| c > 100_000 && c < 150_000), "{calls:?}");
        assert!(calls.len() <= 6, "50k bracket to 1k takes 6 halvings: {calls:?}");
        // Without a table it starts at the top rate.
        let (s2, calls) = search(300_000, &[], 20, curve);
        assert_eq!(calls[0], 300_000);
        assert!(knee - s2.no_drop_pps.unwrap() <= RESOLUTION_PPS, "{s2:?}");
    }

    #[test]
    fn bounded_trial_count() {
        let curve = |r: u64| r <= 123_456;
        for budget in 0..4 {
            let (s, _) = search(300_000, &table(STEPS_KPPS, curve), budget, curve);
            assert_eq!(s.trials, budget, "{s:?}");
            assert!(s.budget_exhausted, "{s:?}");
            // Whatever the budget, the answer passed and sits in the bracket.
            let found = s.no_drop_pps.unwrap();
            assert!((100_000..=123_456).contains(&found), "{s:?}");
        }
    }

    #[test]
    fn noisy_curve_answers_a_rate_that_passed() {
        // Mostly passes below 150k, but a pseudo-random 30 % of trials flip.
        let noisy = |r: u64| {
            let h = r.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) % 100;
            (r <= 150_000) != (h < 30)
        };
        let known = table(STEPS_KPPS, noisy);
        let mut passed: Vec<u64> = known.iter().filter(|k| k.1).map(|k| k.0).collect();
        let (s, calls) = search(300_000, &known, SEARCH_TRIALS, noisy);
        passed.extend(calls.iter().copied().filter(|&c| noisy(c)));
        if let Some(found) = s.no_drop_pps {
            assert!(passed.contains(&found), "{found} never passed: {s:?}");
            assert!(s.lowest_fail_pps.is_none_or(|f| found < f), "{s:?}");
        }
        if let Some(f) = s.lowest_fail_pps {
            assert!(!noisy(f), "the bracket's top was seen to fail: {s:?}");
        }
    }

    #[test]
    fn all_fail_and_all_pass() {
        let (s, calls) = search(300_000, &table(STEPS_KPPS, |_| false), SEARCH_TRIALS, |_| false);
        assert_eq!(s.no_drop_pps, None, "{s:?}");
        assert!(calls.iter().all(|&c| c < 25_000), "below the lowest failing step: {calls:?}");
        assert!(s.lowest_fail_pps.unwrap() < 25_000);
        let (s, calls) = search(300_000, &[], 3, |_| false);
        assert_eq!((s.no_drop_pps, s.trials, s.budget_exhausted), (None, 3, true));
        assert_eq!(calls, [300_000, 150_000, 75_000]);
        // Every step passed, the top one too: nothing to search.
        let (s, calls) = search(300_000, &table(STEPS_KPPS, |_| true), SEARCH_TRIALS, |_| true);
        assert_eq!((s.no_drop_pps, s.lowest_fail_pps, s.trials), (Some(300_000), None, 0));
        assert!(calls.is_empty());
        // Nothing known: one trial at the top.
        let (s, calls) = search(300_000, &[], SEARCH_TRIALS, |_| true);
        assert_eq!((s.no_drop_pps, calls.as_slice()), (Some(300_000), &[300_000][..]));
    }
}
