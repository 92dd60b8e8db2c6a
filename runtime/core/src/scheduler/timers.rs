//! The heap of due times: planning, cancelling and starting due runs.

use super::*;

impl<R: Runner> Core<R> {
    pub(super) fn schedule(&mut self, name: &Arc<str>, at: Instant) {
        let Some(e) = self.entries.get_mut(name) else { return };
        e.heap_gen += 1;
        e.planned = Some(at);
        self.heap.push(Reverse((at, e.heap_gen, name.clone())));
    }

    pub(super) fn unschedule(&mut self, name: &str) {
        if let Some(e) = self.entries.get_mut(name) {
            e.heap_gen += 1;
            e.planned = None;
            e.due = false;
        }
    }

    /// The first run of a probe whose target (re)started at `since`.
    pub(super) fn schedule_first(&mut self, name: &Arc<str>, since: Instant) {
        let Some(e) = self.entries.get(name) else { return };
        let now = Instant::now();
        let mut at = (since + e.spec.initial_delay).max(now);
        if self.options.jitter {
            let period = e.spec.period.as_millis().max(1) as u64;
            at = at.max(now + Duration::from_millis(fastrand::u64(0..period)));
        }
        self.schedule(name, at);
    }

    pub(super) fn start_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, gen_, _))) = self.heap.peek() {
            if *at > now {
                break;
            }
            let (at, gen_) = (*at, *gen_);
            let Some(Reverse((_, _, name))) = self.heap.pop() else {
                break;
            };
            let Some(e) = self.entries.get_mut(&name) else { continue };
            if e.heap_gen != gen_ || e.planned != Some(at) {
                continue;
            }
            e.planned = None;
            if e.running {
                e.due = true;
            } else {
                self.start(&name, Some(at));
            }
        }
    }
}
