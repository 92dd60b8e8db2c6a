// Plain TCP connections the host makes (`sonde:probe/tcp`): only the
// probe's target and its `net` grants; closed with a reset.

import { currentHost } from './host.js';
import { Session } from './tls.js';

/**
 * Connects to host:port within `timeout` seconds: [Session, {dnsSeconds,
 * connectSeconds}]. Refused, unreachable or slow: NetError; not granted:
 * ProbeError('denied').
 */
export function connect(host, port, timeout = 1) {
  const [raw, connected] = currentHost().tcpConnect(host, port, Math.trunc(timeout * 1000));
  return [new Session(raw, timeout), connected];
}
