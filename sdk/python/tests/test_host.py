"""The helpers against the fake host (a unit-test double, not sonde)."""

import unittest

import sonde_sdk as sonde
from sonde_sdk import NetError, Outcome, ProbeError, exec, grpc, http, log, tcp, tls
from sonde_sdk.exec import ExecOutput
from sonde_sdk.testing import FakeHost, FakeSession, respond, run, tls_info


def probe(fn):
    return sonde.probe("t")(fn)


class HostTest(unittest.TestCase):
    def test_outside_a_component_and_a_test_there_is_no_host(self):
        with self.assertRaisesRegex(ProbeError, "no sonde host"):
            http.get("http://x/")
        log.info("dropped")

    def test_http_routes_records_keeps_headers_and_caps_the_body(self):
        @probe
        def check(req):
            r = http.send(http.HttpRequest(f"http://{req.target}/a", max_body=4))
            k = http.send_keeping(http.HttpRequest.get(f"http://{req.target}/a", 1), ["x-b"])
            log.info("done")
            return Outcome.success(f"{r.status} {r.text()} {r.header('X-A')} {len(k.headers)} {k.header('x-b')}",
                                   metrics=[("t", r.timings.total, "seconds")])

        host = FakeHost(http={"http://127.0.0.1:1/a": respond(200, "hello", headers=[("X-A", "1"), ("x-b", "2")], seconds=0.2)})
        o = run(check, "127.0.0.1:1", host=host)
        self.assertEqual(o.message, "200 hell 1 1 2")
        self.assertEqual(o.metric("t"), 0.2)
        self.assertEqual(len(host.http_requests), 2)
        self.assertEqual(host.logs, [("info", "done")])

    def test_what_is_not_the_target_or_granted_is_denied(self):
        @probe
        def other(req):
            http.get("http://10.0.0.1:80/")
            return Outcome.success("")

        with self.assertRaises(ProbeError) as e:
            run(other, "127.0.0.1:1", host=FakeHost(http=lambda r: respond(200)))
        self.assertEqual(e.exception.kind, "denied")
        self.assertIs(run(other, "127.0.0.1:1", host=FakeHost(http=lambda r: respond(204), allow_net=["10.0.0.1:80"])).status,
                      sonde.Status.SUCCESS)

    def test_a_network_failure_is_a_net_error_unless_the_check_makes_it_a_failure(self):
        @probe
        def naive(req):
            return Outcome.success(str(http.get(f"http://{req.target}/").status))

        with self.assertRaises(NetError) as e:
            run(naive, "127.0.0.1:1")
        self.assertEqual((e.exception.kind, e.exception.failure), ("io", "connect"))
        with self.assertRaisesRegex(NetError, "timeout: no answer"):
            run(naive, "127.0.0.1:1", host=FakeHost(http=lambda r: NetError("timeout", "no answer")))

    def test_tcp_sessions_send_read_until_and_time_out(self):
        @probe
        def check(req):
            session, connected = tcp.connect("127.0.0.1", 6379, req.remaining())
            with session:
                session.send(b"PING\r\n")
                data, error = session.read_until(1024, lambda b: b"PONG" in b)
                _, second = session.read_until(1024, lambda b: False)
            return Outcome.success(f"{data.decode().strip()} {error} {second.describe()} {connected.connect_seconds}")

        s = FakeSession([b"+PO", b"NG\r\n"], hang=True)
        o = run(check, "127.0.0.1:6379", host=FakeHost(tcp={"127.0.0.1:6379": s}))
        self.assertEqual(o.message, "+PONG None timed out 0.001")
        self.assertEqual(s.sent, [b"PING\r\n"])
        self.assertTrue(s.closed)

    def test_a_plain_session_upgrades_with_starttls(self):
        @probe
        def check(req):
            session, _ = tcp.connect("mail", 25, req.remaining())
            with session:
                session.send(b"STARTTLS\r\n")
                session.read_until(1024, lambda b: b"220" in b)
                hs = session.starttls(tls.TlsOptions.from_config(server_name="mail.example"))
                session.send(b"EHLO x\r\n")
                try:
                    session.starttls()
                except ProbeError as e:
                    return Outcome.success(f"{hs.info.subject} {e}")
            return Outcome.failure("upgraded twice")

        s = FakeSession([b"220 go\r\n"], tls=tls_info(subject="CN=mail"))
        o = run(check, "mail:25", host=FakeHost(tcp={"mail:25": s}))
        self.assertEqual(o.message, "CN=mail invalid config: starttls: the session is TLS already")
        self.assertEqual(s.upgraded.server_name, "mail.example")
        self.assertEqual(s.sent, [b"STARTTLS\r\n", b"EHLO x\r\n"])
        refused = FakeSession([b"220 go\r\n"], tls=NetError("tls", "certificate not trusted"))
        with self.assertRaisesRegex(NetError, "not trusted"):
            run(check, "mail:25", host=FakeHost(tcp={"mail:25": refused}))

    def test_tls_handshakes_report_the_certificate(self):
        @probe
        def check(req):
            hs = tls.handshake("example", 443, tls.TlsOptions.from_config(server_name="example"), 1)
            days = hs.info.expires_in_seconds() / 86400
            return Outcome.warning(f"expires in {round(days)} days") if days < 14 else Outcome.success(hs.info.subject)

        self.assertEqual(run(check, "example:443", host=FakeHost(tls={"example:443": tls_info(days_left=3)})).message, "expires in 3 days")
        self.assertEqual(run(check, "example:443", host=FakeHost(tls=lambda h, p, o: tls_info())).message, "CN=example")
        with self.assertRaisesRegex(ProbeError, "exclude each other"):
            tls.TlsOptions.from_config(ca_pem="x", insecure_skip_verify=True)

    def test_grpc_and_exec(self):
        @probe
        def check(req):
            r = grpc.call(grpc.GrpcRequest(req.target, "/grpc.health.v1.Health/Check"))
            out = exec.run(["/bin/true"], 1)
            return Outcome.success(f"{r.code.name} {out.exit_code}")

        host = FakeHost(grpc={"/grpc.health.v1.Health/Check": grpc.GrpcResponse(grpc.Code.UNIMPLEMENTED)},
                        exec={"/bin/true": ExecOutput(0)})
        self.assertEqual(run(check, "127.0.0.1:50051", host=host).message, "UNIMPLEMENTED 0")
        self.assertEqual(host.exec_calls, [["/bin/true"]])
        with self.assertRaises(ProbeError) as e:
            run(check, "127.0.0.1:50051", host=FakeHost(grpc=host.grpc))
        self.assertEqual(e.exception.kind, "denied")
        self.assertEqual(grpc.Code(99).name, "CODE_99")


if __name__ == "__main__":
    unittest.main()
