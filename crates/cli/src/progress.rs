//! Progress of the long commands (`compare`, `demo`, `bench ...`): one line per finished run
//! with the time it took, the time since the command started and an estimate of the time left
//! (the mean of the runs so far times the runs still to do), for logs and terminals alike.

use std::time::Instant;

/// Runs done out of a known number, since a start.
#[derive(Debug)]
pub struct Runs {
    what: &'static str,
    start: Instant,
    total: usize,
    done: usize,
}

impl Runs {
    /// `total` runs of the command `what` (`compare`, `bench ecrec`), starting now.
    pub fn new(what: &'static str, total: usize) -> Runs {
        Runs {
            what,
            start: Instant::now(),
            total,
            done: 0,
        }
    }

    /// The command counted (`compare`, `bench ecrec`).
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Count one more run done (`name`: which; `detail`: its outcome) and return its line.
    pub fn done(&mut self, name: &str, detail: &str) -> String {
        self.done += 1;
        let elapsed = self.start.elapsed().as_secs_f64();
        line(self.what, self.done, self.total, name, detail, elapsed)
    }

    /// [`Runs::done`], printed on stderr.
    pub fn report(&mut self, name: &str, detail: &str) {
        eprintln!("{}", self.done(name, detail));
    }
}

/// `compare [3/8] deck: 4.1 s training; 41 s elapsed, about 1m 22s left`.
fn line(what: &str, done: usize, total: usize, name: &str, detail: &str, elapsed: f64) -> String {
    let left = if done >= total {
        "done".to_string()
    } else {
        let per_run = elapsed / done.max(1) as f64;
        format!("about {} left", duration(per_run * (total - done) as f64))
    };
    format!(
        "{what} [{done}/{total}] {name}: {detail}; {} elapsed, {left}",
        duration(elapsed)
    )
}

/// `42s`, `3m 05s`, `1h 02m`.
pub fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_mean_run_times_the_runs_left() {
        assert_eq!(
            line("compare", 2, 8, "deck", "ok", 40.0),
            "compare [2/8] deck: ok; 40s elapsed, about 2m 00s left"
        );
        assert_eq!(
            line("bench ecrec", 3, 3, "none", "ok", 3700.0),
            "bench ecrec [3/3] none: ok; 1h 01m elapsed, done"
        );
        assert_eq!(duration(59.4), "59s");
        assert_eq!(duration(61.0), "1m 01s");
    }
}
