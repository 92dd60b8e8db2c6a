//! A system-log monitor's bounds on what it reads: a line cut to
//! `max_line_bytes`, at most `max_lines_per_second` lines a second (a
//! token bucket holding one second's worth, so a burst of that many passes
//! at once). What is cut or dropped is counted (`/metrics`).

use tokio::time::Instant;

/// Lines admitted at most `per_second` a second.
#[derive(Debug)]
pub struct RateLimit {
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// A full bucket of `per_second` tokens, as of `now`.
    pub fn new(per_second: u32, now: Instant) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            tokens: per_second,
            last: now,
        }
    }

    /// Whether a line read at `now` is admitted (it takes a token).
    pub fn admit(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// `line` cut to at most `max` bytes, on a character's boundary; whether
/// it was cut.
pub fn cut(line: &mut String, max: usize) -> bool {
    if line.len() <= max {
        return false;
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.truncate(end);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_second_admits_its_rate_and_a_burst_no_more() {
        let mut limit = RateLimit::new(10, Instant::now());
        let admitted = (0..25).filter(|_| limit.admit(Instant::now())).count();
        assert_eq!(admitted, 10, "a burst of one second's worth");
        tokio::time::advance(Duration::from_millis(500)).await;
        let admitted = (0..25).filter(|_| limit.admit(Instant::now())).count();
        assert_eq!(admitted, 5, "half a second refills half");
        tokio::time::advance(Duration::from_secs(60)).await;
        let admitted = (0..25).filter(|_| limit.admit(Instant::now())).count();
        assert_eq!(admitted, 10, "a quiet minute saves no more than a second's worth");
    }

    #[test]
    fn a_long_line_is_cut_on_a_char_boundary() {
        let mut l = "héllo".to_string();
        assert!(cut(&mut l, 2), "é spans bytes 1-2");
        assert_eq!(l, "h");
        let mut l = "short".to_string();
        assert!(!cut(&mut l, 5));
        assert_eq!(l, "short");
    }
}
