"""sonde_sdk.credentials: handles, the mapping of the host's answers, and
logins and client certificates against the fake host (a unit-test double,
not sonde; the real host is tested by smoke/credentials.sh)."""

import struct
import unittest
from dataclasses import dataclass
from typing import Optional

import sonde_sdk as sonde
from sonde_sdk import NetError, Outcome, ProbeError, credentials, tcp, tls
from sonde_sdk.credentials import Accepted, ClientCert, LoginError, Refused
from sonde_sdk.testing import FakeHost, FakeSession, Plugin, run, secret_names, tls_info


@dataclass
class RedisConfig:
    password: str
    username: Optional[str] = None


class RedisPing(sonde.Probe):
    """What a plugin author writes: log in with the handle, then PING."""

    name = "redis-ping"
    Config = RedisConfig

    def check(self, req):
        config = req.config()
        host, port = sonde.net.host_port(req.target)
        session, _ = tcp.connect(host, port, req.remaining())
        with session:
            try:
                login = credentials.redis_login(session, config.username, config.password, req.remaining())
            except LoginError as e:
                return Outcome.failure(f"AUTH: {e.detail}")
            if not login.accepted:
                return Outcome.failure(f"AUTH refused: {login.error}")
            session.send(b"PING\r\n")
            data, _ = session.read_until(64, lambda b: b"\r\n" in b)
        return Outcome.success(f"{data.decode().strip()} ({login.method})")


@dataclass
class PgConfig:
    user: str
    password: str


class PgLogin(sonde.Probe):
    name = "pg-login"
    Config = PgConfig

    def check(self, req):
        config = req.config()
        host, port = sonde.net.host_port(req.target)
        session, _ = tcp.connect(host, port, req.remaining())
        with session:
            params = b"user\0" + config.user.encode() + b"\0database\0postgres\0\0"
            session.send(struct.pack("!ii", 8 + len(params), 196608) + params)
            login = credentials.postgres_login(session, config.user, config.password, req.remaining())
            if isinstance(login, Refused):
                return Outcome.failure(login.error)
            data, _ = session.read_until(4096, lambda b: b"Z\0\0\0\x05" in b)
        return Outcome.success(f"{login.method}, ready: {b'Z' in data}")


@dataclass
class TlsConfig:
    client_cert: Optional[ClientCert] = None


class MtlsHandshake(sonde.Probe):
    name = "mtls"
    Config = TlsConfig

    def check(self, req):
        config = req.config()
        host, port = sonde.net.host_port(req.target)
        if config.client_cert is not None:
            config.client_cert.present(host, port)
        hs = tls.handshake(host, port, timeout=req.remaining())
        return Outcome.success(hs.info.subject)


class HandlesTest(unittest.TestCase):
    def test_handles_are_told_from_plain_text(self):
        self.assertTrue(credentials.has_handle("$(secret:pg)"))
        self.assertTrue(credentials.has_handle("Basic $(base64:alice:$(secret:pw))"))
        self.assertTrue(credentials.has_handle("$(secret:"), "malformed, still the host's to refuse")
        self.assertFalse(credentials.has_handle("s3cret $(HOME) $secret:x"))

    def test_the_fake_host_parses_handles_as_the_host_does(self):
        self.assertEqual(secret_names("plain"), [])
        self.assertEqual(secret_names("$(secret:a) and $(base64:u:$(secret:b.c-1)) $(HOME)"), ["a", "b.c-1"])
        for bad, why in [("$(secret:pw", "no closing"), ("$(secret:Pw)", "not a secret name"),
                         ("$(base64:x", "no closing"), ("$(base64:$(base64:x))", "cannot enclose")]:
            with self.assertRaisesRegex(ProbeError, why) as e:
                secret_names(bad)
            self.assertEqual(e.exception.kind, "invalid-config")

    def test_a_client_cert_from_config_never_prints_pem(self):
        c = ClientCert("$(secret:crt)", "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
        self.assertNotIn("MIIB", repr(c))
        self.assertIn("$(secret:crt)", repr(c))
        with self.assertRaisesRegex(ProbeError, "unknown field `client_cert.pem`"):
            sonde.config.load(TlsConfig, {"client_cert": {"cert": "a", "key": "b", "pem": "c"}})


class MappingTest(unittest.TestCase):
    """What the component's glue (_wit) makes of the host's answers."""

    def test_a_login_is_accepted_with_its_method_or_refused_with_the_server_error(self):
        self.assertEqual(credentials._login("accepted", "scram-sha-256"), Accepted("scram-sha-256"))
        refused = credentials._login("refused", "WRONGPASS invalid username-password pair")
        self.assertEqual(refused, Refused("WRONGPASS invalid username-password pair"))
        self.assertFalse(refused.accepted)
        self.assertTrue(Accepted("auth").accepted)
        self.assertIsInstance(refused, credentials.Login)
        with self.assertRaises(ProbeError):
            credentials._login("maybe", "")

    def test_host_errors_are_the_target_s_failure_or_the_check_s(self):
        denied = credentials._login_error("denied", 'secret "x" is not granted')
        self.assertEqual(denied, ProbeError.denied('secret "x" is not granted'))
        self.assertNotIsInstance(denied, NetError)
        self.assertEqual(credentials._login_error("invalid", "GSSAPI").kind, "invalid-config")
        protocol = credentials._login_error("handshake", "protocol error: x")
        self.assertIsInstance(protocol, LoginError)
        self.assertIsInstance(protocol, NetError)
        self.assertEqual((protocol.kind, protocol.failure, protocol.detail), ("io", "protocol", "protocol error: x"))
        for case in ("dns", "connect", "timeout"):
            e = credentials._login_error(case, "m")
            self.assertEqual((type(e), e.failure, str(e)), (LoginError, case, f"i/o error: {case}: m"))

    def test_client_certificate_errors(self):
        e = credentials._client_certificate_error("denied", "10.0.0.1:443 is not the target and not granted", "10.0.0.1", 443)
        self.assertEqual(e.kind, "denied")
        self.assertEqual(credentials._client_certificate_error("invalid", "bad PEM", "h", 1), ProbeError.invalid_config("bad PEM"))
        self.assertEqual(credentials._client_certificate_error("connect", "x", "h", 1), ProbeError.io("client certificate for h:1: x"))

    def test_without_a_host_or_on_a_closed_session_a_login_is_refused(self):
        with self.assertRaisesRegex(ProbeError, "no sonde host"):
            credentials.client_certificate("h", 1, "a", "b")
        closed = tls.Session(FakeSession(), 1)
        closed.close()
        with self.assertRaisesRegex(ProbeError, "open session"):
            credentials.redis_login(closed, None, "$(secret:pw)")


class FakeHostTest(unittest.TestCase):
    target = "127.0.0.1:6379"

    def host(self, answer, **kw):
        session = FakeSession([b"+PONG\r\n"])
        kw.setdefault("secrets", ["pw"])
        return FakeHost(tcp={self.target: session}, logins=answer, **kw), session

    def test_redis_login_accepted_then_ping(self):
        host, session = self.host({"redis 127.0.0.1:6379": Accepted("auth")})
        o = run(RedisPing, self.target, {"password": "$(secret:pw)", "username": "probe"}, host=host)
        self.assertEqual(o.message, "+PONG (auth)")
        self.assertEqual(session.sent, [b"PING\r\n"], "AUTH is the host's: the plugin sends no password")
        [a] = host.login_attempts
        self.assertEqual((a.kind, a.host, a.port, a.user, a.password), ("redis", "127.0.0.1", 6379, "probe", "$(secret:pw)"))
        self.assertIs(a.session, session)
        self.assertTrue(session.closed)

    def test_redis_login_refused_or_failed_is_a_failure(self):
        host, _ = self.host(lambda a: Refused("WRONGPASS invalid username-password pair or user is disabled."))
        o = run(RedisPing, self.target, {"password": "$(secret:pw)"}, host=host)
        self.assertEqual((o.status, o.message), (sonde.Status.FAILURE, "AUTH refused: WRONGPASS invalid username-password pair or user is disabled."))
        host, _ = self.host({self.target: LoginError("timeout", "no Redis login within 900ms")})
        self.assertEqual(run(RedisPing, self.target, {"password": "$(secret:pw)"}, host=host).message,
                         "AUTH: no Redis login within 900ms")
        host, _ = self.host(None)
        self.assertIn("closed the connection", run(RedisPing, self.target, {"password": "$(secret:pw)"}, host=host).message)

    def test_a_secret_not_granted_or_a_malformed_handle_is_the_check_s_error(self):
        host, _ = self.host(lambda a: Accepted("auth"), secrets=[])
        with self.assertRaisesRegex(ProbeError, "grants.secrets is empty") as e:
            run(RedisPing, self.target, {"password": "$(secret:pw)"}, host=host)
        self.assertEqual(e.exception.kind, "denied")
        host, _ = self.host(lambda a: Accepted("auth"), secrets=["other"])
        with self.assertRaisesRegex(ProbeError, r"not in the probe's grants.secrets \(other\)"):
            run(RedisPing, self.target, {"password": "$(secret:pw)"}, host=host)
        host, _ = self.host(lambda a: Accepted("auth"))
        with self.assertRaises(ProbeError) as e:
            run(RedisPing, self.target, {"password": "$(secret:pw"}, host=host)
        self.assertEqual(e.exception.kind, "invalid-config")
        # No handle: the text is the password, as the host sends it.
        host, _ = self.host(lambda a: Accepted("auth") if a.password == "plain-pw" else Refused("WRONGPASS"), secrets=[])
        self.assertEqual(run(RedisPing, self.target, {"password": "plain-pw"}, host=host).status, sonde.Status.SUCCESS)

    def test_postgres_login_after_the_startup_message_leaves_the_rest_to_read(self):
        ready = b"S\0\0\0\x19server_version\x0016.4\0" + b"Z\0\0\0\x05I"
        session = FakeSession([ready])
        host = FakeHost(tcp={"127.0.0.1:5432": session}, secrets=["db"],
                        logins=lambda a: Accepted("scram-sha-256") if (a.kind, a.user) == ("postgres", "monitor") else Refused("x"))
        o = run(PgLogin, "127.0.0.1:5432", {"user": "monitor", "password": "$(secret:db)"}, host=host)
        self.assertEqual(o.message, "scram-sha-256, ready: True")
        self.assertIn(b"user\0monitor\0", session.sent[0])
        self.assertEqual(host.login_attempts[0].kind, "postgres")
        refused = FakeHost(tcp={"127.0.0.1:5432": FakeSession()}, secrets=["db"],
                           logins={"postgres 127.0.0.1:5432": Refused('FATAL 28P01: password authentication failed for user "monitor"')})
        o = run(PgLogin, "127.0.0.1:5432", {"user": "monitor", "password": "$(secret:db)"}, host=refused)
        self.assertEqual(o.status, sonde.Status.FAILURE)
        self.assertIn("28P01", o.message)

    def test_client_certificates_are_registered_toward_granted_peers(self):
        cfg = {"client_cert": {"cert": "$(secret:crt)", "key": "$(secret:key)"}}
        host = FakeHost(tls=lambda h, p, o: tls_info(subject="CN=mtls"), secrets=["crt", "key"])
        self.assertEqual(run(MtlsHandshake, "example:443", cfg, host=host).message, "CN=mtls")
        self.assertEqual(host.client_certs, {"example:443": ("$(secret:crt)", "$(secret:key)")})
        with self.assertRaisesRegex(ProbeError, 'secret "key" is not in'):
            run(MtlsHandshake, "example:443", cfg, host=FakeHost(tls=host.tls, secrets=["crt"]))
        pem = {"client_cert": {"cert": "-----BEGIN CERTIFICATE-----\n", "key": "not pem"}}
        with self.assertRaisesRegex(ProbeError, "neither PEM nor a handle"):
            run(MtlsHandshake, "example:443", pem, host=FakeHost(tls=host.tls))

        @sonde.probe("elsewhere")
        def elsewhere(req):
            credentials.client_certificate("10.0.0.1", 443, "$(secret:crt)", "$(secret:key)")
            for port in range(1, 5):
                credentials.client_certificate("10.0.0.2", port, "$(secret:crt)", "$(secret:key)")
            return Outcome.success("")

        with self.assertRaises(ProbeError) as e:
            run(elsewhere, "example:443", host=FakeHost(secrets=["crt", "key"]))
        self.assertEqual(e.exception.kind, "denied")
        with self.assertRaisesRegex(ProbeError, "at most 4"):
            run(elsewhere, "example:443", host=FakeHost(secrets=["crt", "key"], allow_net=["10.0.0.1:443"] + [f"10.0.0.2:{p}" for p in range(1, 5)]))


    def test_the_real_thing_is_given_secrets_as_sonde_check_takes_them(self):
        check = Plugin.from_file("p.wasm").check("127.0.0.1:6379").config({"password": "$(secret:pw)"}).secret("pw", "/run/pw")
        self.assertEqual(check.args[-2:], ["--secret", "pw=/run/pw"])


if __name__ == "__main__":
    unittest.main()
