"""Unit tests of the check's logic in plain CPython, against the SDK's fake
host (a unit-test double: no sandbox, no real network). The real component
is tested by test.sh."""

import json
import unittest

from sonde_sdk import NetError, ProbeError, Status
from sonde_sdk.testing import FakeHost, respond, run

from app import HttpJson

URL = "http://127.0.0.1:8080/health"


def host(body, status=200, seconds=0.01):
    return FakeHost(http={URL: respond(status, body, seconds=seconds)})


class HttpJsonTest(unittest.TestCase):
    def test_the_expected_value_is_a_success_with_the_response_time(self):
        out = run(HttpJson, "127.0.0.1:8080", {"field": "status", "expected": "ok"}, host=host({"status": "ok"}, seconds=0.02))
        self.assertIs(out.status, Status.SUCCESS, out)
        self.assertEqual(out.metric("response_seconds"), 0.02)
        self.assertEqual(out.metric("status_code"), 200)
        self.assertIn('status is "ok"', out.message)

    def test_another_value_is_a_failure(self):
        out = run(HttpJson, "127.0.0.1:8080", {"field": "db.state", "expected": "up"}, host=host({"db": {"state": "down"}}))
        self.assertIs(out.status, Status.FAILURE)
        self.assertEqual(out.message, 'db.state is "down", expected "up"')

    def test_json_types_are_compared_strictly(self):
        out = run(HttpJson, "127.0.0.1:8080", {"field": "ready", "expected": 1}, host=host({"ready": True}))
        self.assertIs(out.status, Status.FAILURE)
        out = run(HttpJson, "127.0.0.1:8080", {"field": "items.1", "expected": 2.0}, host=host({"items": [1, 2]}))
        self.assertIs(out.status, Status.SUCCESS, out)

    def test_a_slow_answer_is_a_warning(self):
        cfg = {"field": "status", "expected": "ok", "warn_after": "300ms"}
        out = run(HttpJson, "127.0.0.1:8080", cfg, host=host({"status": "ok"}, seconds=0.5))
        self.assertIs(out.status, Status.WARNING)
        self.assertIn("over 300ms", out.message)

    def test_a_missing_field_a_bad_status_and_a_body_that_is_not_json_fail(self):
        cfg = {"field": "status", "expected": "ok"}
        self.assertIn("no such field", run(HttpJson, "127.0.0.1:8080", cfg, host=host({"state": "ok"})).message)
        self.assertIn("status 503", run(HttpJson, "127.0.0.1:8080", cfg, host=host({"status": "ok"}, status=503)).message)
        self.assertIn("not JSON", run(HttpJson, "127.0.0.1:8080", cfg, host=host("<html>")).message)

    def test_a_refused_connection_is_a_failure(self):
        fake = FakeHost(http={URL: NetError("connect", "connection refused")})
        out = run(HttpJson, "127.0.0.1:8080", {"field": "status", "expected": "ok"}, host=fake)
        self.assertIs(out.status, Status.FAILURE)
        self.assertEqual(out.message, f"GET {URL}: connect: connection refused")

    def test_a_url_target_is_used_as_it_is(self):
        fake = FakeHost(http={"http://127.0.0.1:9/x": respond(200, {"ok": True})})
        out = run(HttpJson, "http://127.0.0.1:9/x", {"field": "ok", "expected": True}, host=fake)
        self.assertIs(out.status, Status.SUCCESS, out)
        self.assertEqual(fake.http_requests[0].headers, [("accept", "application/json")])

    def test_config_errors_name_the_field(self):
        with self.assertRaises(ProbeError) as e:
            run(HttpJson, "127.0.0.1:8080", {"field": "status"}, host=host({}))
        self.assertEqual((e.exception.kind, e.exception.message), ("invalid-config", "missing field `expected`"))
        with self.assertRaises(ProbeError) as e:
            run(HttpJson, "127.0.0.1:8080", {"field": "s", "expected": 1, "pth": "/"}, host=host({}))
        self.assertIn("unknown field `pth`", e.exception.message)
        with self.assertRaises(ProbeError) as e:
            run(HttpJson, "127.0.0.1:8080", {"field": "s", "expected": 1, "warn_after": "soon"}, host=host({}))
        self.assertIn("warn_after", e.exception.message)

    def test_describe_publishes_the_schema(self):
        info = HttpJson.describe()
        self.assertEqual((info.name, info.version), ("http-json", "0.1.0"))
        schema = json.loads(info.config_schema)
        self.assertEqual(schema["required"], ["field", "expected"])
        self.assertFalse(schema["additionalProperties"])
        self.assertEqual(schema["properties"]["path"]["default"], "/health")


if __name__ == "__main__":
    unittest.main()
