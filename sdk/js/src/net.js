// Addresses and the errors of the host's network capabilities.
//
// NetError is what http.send, tls.handshake, tls.connect, tcp.connect and
// grpc.call throw when the *target* failed (name not resolved, connection
// refused, timeout, TLS or protocol broken). It is a ProbeError of kind
// 'io', so a check that lets it escape reports the run `unknown`, as a
// Rust check returning Err(ProbeError::Io) does; catch it to return
// Outcome.failure instead. A denial or a malformed request is a plain
// ProbeError ('denied' / 'invalid-config').

import { ProbeError } from './core.js';

export const TIMED_OUT = 'timed out';
export const NOT_GRANTED = 'denied by the host: not granted';

/** The target failed; `failure` is 'dns', 'connect', 'timeout', 'protocol' or 'tls'. */
export class NetError extends ProbeError {
  constructor(failure, message) {
    super('io', `${failure}: ${message}`);
    this.name = 'NetError';
    this.failure = failure;
    this.detail = message;
  }
}

/** Why a session could not send or read; kind 'timed-out', 'denied', 'invalid' or 'other'. */
export class SessionError extends Error {
  constructor(kind, message) {
    super(message);
    this.name = 'SessionError';
    this.kind = kind;
  }
  /** A short reason: 'timed out', 'denied by the host: not granted', or the host's message. */
  describe() {
    if (this.kind === 'timed-out') return TIMED_OUT;
    if (this.kind === 'denied') return NOT_GRANTED;
    return this.message;
  }
}

/** Splits 'host:port' ('[::1]:80' too) into [host, port]; else ProbeError('invalid-config'). */
export function hostPort(target) {
  const at = target.lastIndexOf(':');
  const host = target.slice(0, Math.max(at, 0)).replace(/^\[/, '').replace(/\]$/, '');
  const port = target.slice(at + 1);
  if (at < 0 || !host || !/^\d+$/.test(port) || Number(port) > 65535) {
    throw ProbeError.invalidConfig(`target ${JSON.stringify(target)}: expected HOST:PORT`);
  }
  return [host, Number(port)];
}

/**
 * Calls read(n) until done(bytesSoFar) is true, the peer closes (an empty
 * read), maxBytes arrived or a read throws a SessionError. Returns
 * {data, error}.
 */
export function readUntil(read, maxBytes, done) {
  let buf = new Uint8Array(0);
  while (buf.length < maxBytes && !done(buf)) {
    let chunk;
    try {
      chunk = read(Math.min(1024, maxBytes - buf.length));
    } catch (e) {
      if (e instanceof SessionError) return { data: buf, error: e };
      throw e;
    }
    if (!chunk.length) break;
    const next = new Uint8Array(buf.length + chunk.length);
    next.set(buf);
    next.set(chunk, buf.length);
    buf = next.subarray(0, maxBytes);
  }
  return { data: buf, error: undefined };
}
