// Clocks, in seconds: monotonic for measuring phases, and the wall clock.
import { monotonic as hostMonotonic, unixSeconds as hostUnixSeconds } from './host.js';

/** Seconds on the monotonic clock (only differences mean anything). */
export const monotonic = () => hostMonotonic();
/** Seconds since the Unix epoch. */
export const unixSeconds = () => hostUnixSeconds();

/** A point on the monotonic clock: const t = Instant.now(); ...; t.elapsed(). */
export class Instant {
  constructor(at) {
    this.at = at;
  }
  static now() {
    return new Instant(monotonic());
  }
  /** Seconds since this instant (never below 0). */
  elapsed() {
    return Math.max(0, monotonic() - this.at);
  }
}
