// The suite's one rule for a test that cannot run on this machine (no root, or a kernel feature or tool it
// needs is missing). Every test crate includes this file (`#[path]` or `include!`), so the rule is written once:
//
// - under `CI=true` the test fails, saying why;
// - otherwise it says `SKIPPED` on stderr and, when `TURBOTUN_SKIPPED_LOG` names a file, appends a line there,
//   so that the run's summary (`make test`, `scripts/test-summary.sh`) counts the tests that did not run instead
//   of reporting them as passed.

/// Applies the rule to `test`, which cannot run for `why`; returns only when the test is to be skipped.
pub fn cannot_run(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: cannot run under CI=true: {why}");
    }
    let why = why.replace('\n', " ");
    eprintln!("SKIPPED {test}: {why}");
    if let Some(log) = std::env::var_os("TURBOTUN_SKIPPED_LOG") {
        use std::io::Write;
        // One short write with O_APPEND: lines from tests running in parallel do not interleave.
        let line = format!("{test}: {why}\n");
        let logged = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = logged {
            panic!("{test}: cannot record the skip in {}: {e}", log.to_string_lossy());
        }
    }
}
