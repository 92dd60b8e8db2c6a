// An end-to-end plugin for @sonde/sdk's credentials (not a user example):
// each `mode` logs in with a secret handle from its config, through the real
// bindings and the real host, and reports what it found. Run by
// smoke/credentials.sh against a real Redis, PostgreSQL and an mTLS server;
// the Python twin is sdk/python/smoke/credentials.

import { Outcome, ProbeError, NetError, probe, config, credentials, net, tcp, tls } from '@sonde/sdk';

const { ClientCert, LoginError } = credentials;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

const Config = config.define({
  mode: config.oneOf(['redis', 'postgres', 'mtls'], { required: true }),
  password: config.string({ default: '' }),
  username: config.string(),
  user: config.string({ default: 'postgres' }),
  client_cert: ClientCert.field(),
});

function redis(req, c, host, port) {
  const [session] = tcp.connect(host, port, req.remaining());
  try {
    const login = credentials.redisLogin(session, c.username, c.password, req.remaining());
    if (!login.accepted) return Outcome.failure(`AUTH refused: ${login.error}`);
    session.send('PING\r\n');
    const pong = session.readUntil(64, (b) => decoder.decode(b).endsWith('\r\n'));
    const first = decoder.decode(pong.data).split('\r\n')[0];
    if (first !== '+PONG') return Outcome.failure(`PING: ${JSON.stringify(first)} ${pong.error?.describe() ?? ''}`);
    // The reply to CONFIG GET holds the password: the host withholds it.
    session.send('CONFIG GET requirepass\r\n');
    const { data } = session.readUntil(4096, (b) => {
      const text = decoder.decode(b);
      return text.startsWith('[') || text.split('\r\n').length > 5;
    });
    const text = decoder.decode(data);
    const stored = text.startsWith('[') ? text : text.split('\r\n')[4];
    return Outcome.success(`PONG after AUTH (${login.method}); requirepass reads ${stored}`);
  } finally {
    session.close();
  }
}

function concat(a, b) {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

// One PostgreSQL backend message: [type, body].
function readMessage(session) {
  const exactly = (n) => {
    let buf = new Uint8Array(0);
    while (buf.length < n) {
      const chunk = session.read(n - buf.length);
      if (!chunk.length) throw ProbeError.io('the server closed the connection');
      buf = concat(buf, chunk);
    }
    return buf;
  };
  const head = exactly(5);
  const length = new DataView(head.buffer, head.byteOffset).getInt32(1);
  return [String.fromCharCode(head[0]), exactly(length - 4)];
}

function message(type, body) {
  const out = new Uint8Array((type ? 5 : 4) + body.length);
  const view = new DataView(out.buffer);
  let at = 0;
  if (type) out[at++] = type.charCodeAt(0);
  view.setInt32(at, 4 + body.length);
  out.set(body, at + 4);
  return out;
}

function postgres(req, c, host, port) {
  const [session] = tcp.connect(host, port, req.remaining());
  try {
    const params = encoder.encode(`user\0${c.user}\0database\0postgres\0\0`);
    const version = Uint8Array.from([0, 3, 0, 0]);
    session.send(message(undefined, concat(version, params)));
    const login = credentials.postgresLogin(session, c.user, c.password, req.remaining());
    if (!login.accepted) return Outcome.failure(`login refused: ${login.error}`);
    // What follows AuthenticationOk is ours: up to ReadyForQuery, then a query.
    while (readMessage(session)[0] !== 'Z');
    session.send(message('Q', encoder.encode('SELECT current_user\0')));
    let row;
    for (;;) {
      const [type, body] = readMessage(session);
      if (type === 'D') {
        const n = new DataView(body.buffer, body.byteOffset).getInt32(2);
        row = decoder.decode(body.subarray(6, 6 + n));
      }
      if (type === 'E') return Outcome.failure(`query: ${decoder.decode(body)}`);
      if (type === 'Z') break;
    }
    return Outcome.success(`logged in (${login.method}) as ${row}`);
  } finally {
    session.close();
  }
}

function mtls(req, c, host, port) {
  ClientCert.from(c.client_cert)?.present(host, port);
  let session;
  try {
    [session] = tls.connect(host, port, new tls.TlsOptions({ insecureSkipVerify: true }), req.remaining());
  } catch (e) {
    if (e instanceof NetError) return Outcome.failure(`TLS: ${e.message}`);
    throw e;
  }
  try {
    session.send('who\n');
    const { data, error } = session.readUntil(200, (b) => b.includes(10));
    if (!data.length) return Outcome.failure(`the server sent nothing: ${error ? error.describe() : 'closed'}`);
    return Outcome.success(`the server saw ${decoder.decode(data).trim()}`);
  } finally {
    session.close();
  }
}

export const credentialsSmoke = probe({
  name: 'credentials-smoke-js',
  config: Config,
  check(req) {
    const c = req.config();
    const [host, port] = net.hostPort(req.target);
    try {
      if (c.mode === 'redis') return redis(req, c, host, port);
      if (c.mode === 'postgres') return postgres(req, c, host, port);
      return mtls(req, c, host, port);
    } catch (e) {
      if (e instanceof LoginError) return Outcome.failure(`login: ${e.message}`);
      throw e;
    }
  },
});
