//! The memory behind `GET /v1/watch`: a bounded log of events, each with an
//! id, so a client that reconnects with `Last-Event-ID` gets what it missed,
//! or learns that it must list again because the log has moved past it.
//!
//! Ids are `<boot>-<seq>`: `boot` changes each time the agent starts, so an
//! id from before a restart is recognised as foreign (and answered with a
//! reset) rather than confused with a new event of the same number.

use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::watch;

/// A bounded log of events of one stream.
#[derive(Debug)]
pub struct EventLog<T> {
    boot: u64,
    log: Mutex<Log<T>>,
    latest: watch::Sender<u64>,
}

#[derive(Debug)]
struct Log<T> {
    /// The sequence number of the newest event; 0 before the first.
    newest: u64,
    events: VecDeque<(u64, T)>,
    capacity: usize,
}

/// The log has moved past the client's position (or the position is from
/// another run of the agent): it must list again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset;

impl<T: Clone> EventLog<T> {
    /// An empty log that keeps the last `capacity` events.
    pub fn new(capacity: usize) -> Self {
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            boot,
            log: Mutex::new(Log {
                newest: 0,
                events: VecDeque::with_capacity(capacity.min(1024)),
                capacity: capacity.max(1),
            }),
            latest: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log<T>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an event and wakes the followers; returns its sequence number.
    pub fn push(&self, event: T) -> u64 {
        let seq = {
            let mut log = self.lock();
            log.newest += 1;
            let seq = log.newest;
            if log.events.len() == log.capacity {
                log.events.pop_front();
            }
            log.events.push_back((seq, event));
            seq
        };
        self.latest.send_replace(seq);
        seq
    }

    /// The sequence number of the newest event (0 when there is none).
    pub fn newest(&self) -> u64 {
        self.lock().newest
    }

    /// The id a client sees for sequence number `seq`.
    pub fn id(&self, seq: u64) -> String {
        format!("{:x}-{seq}", self.boot)
    }

    /// The sequence number in a client's `Last-Event-ID`, if it is one of
    /// this log's ids.
    pub fn parse(&self, id: &str) -> Option<u64> {
        let (boot, seq) = id.trim().split_once('-')?;
        if u64::from_str_radix(boot, 16).ok()? != self.boot {
            return None;
        }
        seq.parse().ok()
    }

    /// Every event after `seq`, oldest first; [`Reset`] when some of them
    /// are gone already, or `seq` was never handed out.
    pub fn after(&self, seq: u64) -> Result<Vec<(u64, T)>, Reset> {
        let log = self.lock();
        if seq > log.newest {
            return Err(Reset);
        }
        let oldest = log.events.front().map_or(log.newest + 1, |(s, _)| *s);
        if seq + 1 < oldest {
            return Err(Reset);
        }
        let skip = (seq + 1 - oldest) as usize;
        Ok(log.events.iter().skip(skip).cloned().collect())
    }

    /// Wakes when an event is pushed after this call.
    pub fn follow(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catches_up_from_any_kept_position_and_resets_past_the_end() {
        let log = EventLog::new(3);
        assert_eq!(log.after(0), Ok(vec![]));
        for n in 1..=5 {
            assert_eq!(log.push(n * 10), n);
        }
        // Kept: 3, 4, 5.
        assert_eq!(log.after(2), Ok(vec![(3, 30), (4, 40), (5, 50)]));
        assert_eq!(log.after(4), Ok(vec![(5, 50)]));
        assert_eq!(log.after(5), Ok(vec![]));
        assert_eq!(log.after(1), Err(Reset), "event 2 is gone");
        assert_eq!(log.after(6), Err(Reset), "never handed out");
    }

    #[test]
    fn ids_round_trip_and_foreign_ids_are_refused() {
        let log: EventLog<u8> = EventLog::new(4);
        let other: EventLog<u8> = EventLog {
            boot: log.boot + 1,
            ..EventLog::new(4)
        };
        assert_eq!(log.parse(&log.id(42)), Some(42));
        assert_eq!(log.parse(&other.id(42)), None);
        assert_eq!(log.parse("42"), None);
        assert_eq!(log.parse("zz-1"), None);
    }
}
