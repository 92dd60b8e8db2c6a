// A smoke-test plugin: each `mode` calls one host capability through the
// real bindings, so smoke.sh can check the SDK's glue to every interface of
// probe.wit (not a user example; see examples/http-json).
import { config, exec, grpc, http, log, net, tcp, time, tls, NetError, Outcome, ProbeError, SessionError, probe } from '@sonde/sdk';

const decoder = new TextDecoder();

export const smoke = probe({
  name: 'smoke-js',
  config: config.define({ mode: config.string({ required: true }) }),
  check(req) {
    const { mode } = req.config();
    const [host, port] = req.target.includes('://') ? ['', 0] : net.hostPort(req.target);
    switch (mode) {
      case 'log':
        for (const level of ['trace', 'debug', 'info', 'warn', 'error']) log[level](`smoke ${level}`);
        return Outcome.success(`logged; unix ${Math.trunc(time.unixSeconds())} > 1.7e9: ${time.unixSeconds() > 1.7e9}`);
      case 'exec': {
        const out = exec.run(['/bin/echo', 'hi'], 2);
        return Outcome.success(`exit ${out.exitCode} timed_out ${out.timedOut ? 'yes' : 'no'} stdout ${JSON.stringify(decoder.decode(out.stdout))}`);
      }
      case 'tls': {
        const hs = tls.handshake(host, port, new tls.TlsOptions({ insecureSkipVerify: true }), req.remaining());
        const [session] = tls.connect(host, port, new tls.TlsOptions({ insecureSkipVerify: true, serverName: 'localhost' }), req.remaining());
        session.send('ping\n');
        const { data, error } = session.readUntil(100, (b) => decoder.decode(b).includes('\n'));
        session.close();
        const days = Math.round(hs.info.expiresInSeconds() / 86400);
        return Outcome.success(`${hs.info.version} ${hs.info.subject} days ${days} echo ${JSON.stringify(decoder.decode(data))} error ${error ?? 'none'}`, {
          metrics: [['tls_seconds', hs.tlsSeconds, 'seconds']],
        });
      }
      case 'tcp-timeout': {
        const [session] = tcp.connect(host, port, req.remaining());
        session.readTimeout = 0.2;
        try {
          session.read();
        } catch (e) {
          if (e instanceof SessionError) return Outcome.success(`read: ${e.kind} ${e.describe()}`);
          throw e;
        }
        return Outcome.failure('read returned');
      }
      case 'grpc':
        try {
          const r = grpc.call({ authority: req.target, method: '/grpc.health.v1.Health/Check', timeout: req.remaining() });
          return Outcome.success(`grpc code ${grpc.codeName(r.code)}`);
        } catch (e) {
          if (e instanceof NetError) return Outcome.success(`grpc NetError ${e.failure}`);
          throw e;
        }
      case 'https':
        try {
          http.send({ url: `https://${req.target}/`, timeout: req.remaining() });
        } catch (e) {
          if (e instanceof NetError) return Outcome.success(`https NetError ${e.failure}`);
          throw e;
        }
        return Outcome.failure('an untrusted certificate was accepted');
      case 'denied':
        http.get('http://127.0.0.2:9/', 1); // not the target: ProbeError denied
        return Outcome.failure('reached a host not granted');
      case 'bug':
        return undefined.missing;
      default:
        throw ProbeError.invalidConfig(`mode ${JSON.stringify(mode)}`);
    }
  },
});
