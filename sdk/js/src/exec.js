// Running a granted program on the host (`sonde:probe/exec`).
import { currentHost } from './host.js';

/**
 * Runs argv (an absolute path, then arguments) for at most `timeout`
 * seconds: {exitCode, timedOut, stdout, stderr} (exitCode undefined when a
 * signal or the timeout ended it). Not granted: ProbeError('denied').
 */
export function run(argv, timeout = 1) {
  return currentHost().execRun(argv.map(String), Math.trunc(timeout * 1000));
}
