// The component side: the host's imports, as componentize-js binds them from
// sdk/wit/probe.wit (world `plugin`) at build time, and the exports.
//
//   // app.js, the component's entry
//   import { exportProbe } from '@sonde/sdk/component';
//   import { myProbe } from './check.js';
//   export const { describe, check } = exportProbe(myProbe);
//
// Only a component can import this module (node cannot resolve `sonde:`);
// keep the check itself in a module of its own for unit tests.

import { log as witLog } from 'sonde:probe/log@0.1.0';
import { run as witRun } from 'sonde:probe/exec@0.1.0';
import { handshake as witHandshake, connect as witTlsConnect } from 'sonde:probe/tls@0.1.0';
import { connect as witTcpConnect } from 'sonde:probe/tcp@0.1.0';
import { send as witSend, sendKeeping as witSendKeeping } from 'sonde:probe/http@0.1.0';
import { call as witCall } from 'sonde:probe/grpc@0.1.0';
import {
  clientCertificate as witClientCertificate,
  postgresLogin as witPostgresLogin,
  redisLogin as witRedisLogin,
} from 'sonde:probe/credentials@0.1.0';

import { installHost } from './host.js';
import { ProbeError, Request } from './core.js';
import { NetError, SessionError } from './net.js';
import { HttpResponse } from './http.js';
import { TlsInfo } from './tls.js';
import { clientCertificateError, fromWit as loginFromWit, loginError } from './credentials.js';
import { describe as describeProbe, run } from './probe.js';

/** The variant a host import threw (`ComponentError.payload`). */
function payload(e) {
  if (e && typeof e === 'object' && e.payload && typeof e.payload.tag === 'string') return e.payload;
  return undefined;
}

function netError(e) {
  const p = payload(e);
  if (!p) return e;
  if (p.tag === 'denied') return ProbeError.denied(p.val);
  if (p.tag === 'invalid') return ProbeError.invalidConfig(p.val);
  return new NetError(p.tag === 'handshake' ? 'tls' : p.tag, p.val);
}

const ms = (n) => BigInt(Math.max(1, Math.trunc(n)));
const witTls = (o) => ({ caPem: o?.caPem ?? undefined, insecureSkipVerify: !!o?.insecureSkipVerify, serverName: o?.serverName ?? undefined });
const tlsInfo = (i) => (i ? new TlsInfo(i) : undefined);

class RawSession {
  constructor(session) {
    this.session = session;
  }
  error(e) {
    const p = payload(e);
    if (!p) return e;
    const kind = { timeout: 'timed-out', denied: 'denied', invalid: 'invalid' }[p.tag] ?? 'other';
    return new SessionError(kind, p.val);
  }
  send(data) {
    try {
      this.session.send(data);
    } catch (e) {
      throw this.error(e);
    }
  }
  receive(max, timeoutMs) {
    try {
      return this.session.receive(max, ms(timeoutMs));
    } catch (e) {
      throw this.error(e);
    }
  }
  starttls(options, timeoutMs) {
    try {
      return handshakeResult(this.session.starttls(witTls(options), ms(timeoutMs)));
    } catch (e) {
      throw netError(e);
    }
  }
  close() {
    this.session[Symbol.dispose]?.();
  }
}

const handshakeResult = (r) => ({
  info: tlsInfo(r.info),
  dnsSeconds: r.timings.dns,
  connectSeconds: r.timings.connect,
  tlsSeconds: r.timings.tls,
});

/** Every capability through the component's imports. */
export const witBackend = {
  log(level, message) {
    witLog(level, message);
  },
  monotonic: () => (globalThis.performance?.now?.() ?? Date.now()) / 1000,
  unixSeconds: () => Date.now() / 1000,
  httpSend(req, keep) {
    const body = typeof req.body === 'string' ? new TextEncoder().encode(req.body) : req.body;
    const wreq = {
      method: req.method,
      url: req.url,
      headers: req.headers.map(([n, v]) => [String(n), String(v)]),
      body,
      timeoutMs: ms(req.timeout * 1000),
      maxBody: req.maxBody,
      tls: witTls(req.tls),
      keepalive: !!req.keepalive,
    };
    let r;
    try {
      r = keep === undefined ? witSend(wreq) : witSendKeeping(wreq, keep);
    } catch (e) {
      throw netError(e);
    }
    return new HttpResponse({ ...r, tls: tlsInfo(r.tls) });
  },
  tlsHandshake(host, port, options, timeoutMs) {
    try {
      return handshakeResult(witHandshake(host, port, witTls(options), ms(timeoutMs)));
    } catch (e) {
      throw netError(e);
    }
  },
  tlsConnect(host, port, options, timeoutMs) {
    try {
      const [session, r] = witTlsConnect(host, port, witTls(options), ms(timeoutMs));
      return [new RawSession(session), handshakeResult(r)];
    } catch (e) {
      throw netError(e);
    }
  },
  tcpConnect(host, port, timeoutMs) {
    try {
      const [session, t] = witTcpConnect(host, port, ms(timeoutMs));
      return [new RawSession(session), { dnsSeconds: t.dns, connectSeconds: t.connect }];
    } catch (e) {
      throw netError(e);
    }
  },
  grpcCall(req) {
    let r;
    try {
      r = witCall({
        authority: req.authority,
        path: req.method,
        message: req.message,
        metadata: req.metadata,
        timeoutMs: ms(req.timeout * 1000),
        tls: req.tls ? witTls(req.tls) : undefined,
      });
    } catch (e) {
      throw netError(e);
    }
    return { ...r, tls: tlsInfo(r.tls) };
  },
  // A login borrows the session the plugin opened (tcp.connect): the WIT
  // resource itself, which stays the plugin's.
  postgresLogin(raw, user, password, timeoutMs) {
    let r;
    try {
      r = witPostgresLogin(raw.session, user, password, ms(timeoutMs));
    } catch (e) {
      const p = payload(e);
      throw p ? loginError(p) : e;
    }
    return loginFromWit(r);
  },
  redisLogin(raw, username, password, timeoutMs) {
    let r;
    try {
      r = witRedisLogin(raw.session, username, password, ms(timeoutMs));
    } catch (e) {
      const p = payload(e);
      throw p ? loginError(p) : e;
    }
    return loginFromWit(r);
  },
  clientCertificate(host, port, cert, key) {
    try {
      witClientCertificate(host, port, cert, key);
    } catch (e) {
      const p = payload(e);
      throw p ? clientCertificateError(p, host, port) : e;
    }
  },
  execRun(argv, timeoutMs) {
    try {
      return witRun({ argv, timeoutMs: ms(timeoutMs) });
    } catch (e) {
      const p = payload(e);
      if (!p) throw e;
      throw p.tag === 'denied' ? ProbeError.denied(p.val) : ProbeError.io(p.val);
    }
  },
};

installHost(witBackend);

/** The world's exports for probe `p`: `export const { describe, check } = exportProbe(p)`. */
export function exportProbe(p) {
  return {
    describe() {
      return describeProbe(p);
    },
    check(wreq) {
      const req = new Request(wreq.target, wreq.config, Number(wreq.timeoutMs) / 1000, {
        probe: wreq.probe,
        attempt: wreq.attempt,
      });
      const o = run(p, req);
      return {
        status: o.status,
        message: o.message,
        metrics: o.metrics.map((m) => ({ name: m.name, value: m.value, unit: m.unit })),
        detail: o.detail ?? undefined,
      };
    },
  };
}
