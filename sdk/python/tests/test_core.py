"""Unit tests of sonde_sdk in plain CPython (no component, no sonde)."""

import json
import unittest
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

import sonde_sdk as sonde
from sonde_sdk import Duration, Metric, Outcome, ProbeError, Request, Status, config, duration, net
from sonde_sdk.testing import run


class OutcomeTest(unittest.TestCase):
    def test_outcomes_carry_a_status_metrics_in_two_spellings_and_a_detail(self):
        o = Outcome.warning("slow", metrics=[Metric("a", 1, "seconds"), ("b", 2), ("c", 3, "bytes")], detail="x")
        self.assertIs(o.status, Status.WARNING)
        self.assertEqual([(m.name, m.value, m.unit) for m in o.metrics], [("a", 1.0, "seconds"), ("b", 2.0, ""), ("c", 3.0, "bytes")])
        self.assertEqual(o.with_metric("d", 4).metric("d"), 4.0)
        self.assertIsNone(Outcome.success("up").detail)
        with self.assertRaises(TypeError):
            Outcome.success("x", metrics=["bad"])

    def test_probe_errors_have_a_kind_and_compare_by_value(self):
        e = ProbeError.invalid_config("bad")
        self.assertEqual((e.kind, e.message, str(e)), ("invalid-config", "bad", "invalid config: bad"))
        self.assertEqual(e, ProbeError("invalid-config", "bad"))
        with self.assertRaises(ValueError):
            ProbeError("oops", "x")

    def test_a_request_gives_the_config_as_json_or_refuses_it(self):
        req = Request("h:1", '{"a": 1}', 2)
        self.assertEqual(req.config(), {"a": 1})
        self.assertTrue(1.5 < req.remaining() <= 2)
        self.assertEqual(req.timeout_ms, 2000)
        with self.assertRaises(ProbeError):
            Request("h:1", "[1]").config()
        with self.assertRaises(ProbeError):
            Request("h:1", "{").config()


@dataclass
class Inner:
    x: int


@dataclass
class Cfg:
    name: str = field(metadata={"description": "who"})
    count: int = 3
    ratio: Optional[float] = None
    on: bool = False
    wait: Duration = Duration.parse("1s")
    mode: Optional[Literal["a", "b"]] = None
    tags: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    inner: Optional[Inner] = None
    anything: Any = None


class ConfigTest(unittest.TestCase):
    def test_defaults_types_durations_and_nested_dataclasses(self):
        c = config.load(Cfg, '{"name": "n", "ratio": 1, "mode": "b", "tags": ["t"], "labels": {"k": "v"}, "inner": {"x": 2}, "wait": "1m 30s"}')
        self.assertEqual((c.name, c.count, c.ratio, c.on, c.wait, c.mode, c.tags, c.labels, c.inner),
                         ("n", 3, 1.0, False, 90.0, "b", ["t"], {"k": "v"}, Inner(2)))
        self.assertIsInstance(c.ratio, float)
        self.assertEqual(config.load(Cfg, {"name": "n"}).wait, 1.0)

    def reason(self, cfg):
        with self.assertRaises(ProbeError) as e:
            config.load(Cfg, cfg)
        self.assertEqual(e.exception.kind, "invalid-config")
        return e.exception.message

    def test_errors_name_the_field(self):
        self.assertEqual(self.reason({}), "missing field `name`")
        self.assertRegex(self.reason({"name": "n", "nme": 1}), r"^unknown field `nme`, expected one of `name`, `count`")
        self.assertEqual(self.reason({"name": "n", "count": 1.5}), "field `count`: expected an integer, got 1.5")
        self.assertEqual(self.reason({"name": "n", "count": True}), "field `count`: expected an integer, got true")
        self.assertIn("field `wait`", self.reason({"name": "n", "wait": "soon"}))
        self.assertIn('one of "a", "b"', self.reason({"name": "n", "mode": "c"}))
        self.assertEqual(self.reason({"name": "n", "tags": [1]}), "field `tags[0]`: expected a string, got 1")
        self.assertIn("unknown field `inner.y`", self.reason({"name": "n", "inner": {"x": 1, "y": 2}}))
        self.assertEqual(config.load(Cfg, {"name": "n", "zzz": 1}, allow_unknown=True).name, "n")

    def test_the_schema_is_json_schema_2020_12(self):
        s = json.loads(config.schema(Cfg, title="t"))
        self.assertEqual(s["$schema"], "https://json-schema.org/draft/2020-12/schema")
        self.assertEqual((s["title"], s["required"], s["additionalProperties"]), ("t", ["name"], False))
        self.assertEqual(s["properties"]["name"], {"type": "string", "description": "who"})
        self.assertEqual(s["properties"]["count"], {"type": "integer", "default": 3})
        self.assertEqual(s["properties"]["wait"]["default"], "1s")
        self.assertEqual(s["properties"]["mode"], {"enum": ["a", "b"]})
        self.assertEqual(s["properties"]["inner"]["required"], ["x"])


class DurationTest(unittest.TestCase):
    def test_what_humantime_accepts(self):
        for text, secs in [("500ms", 0.5), ("1.5s", 1.5), ("1m 30s", 90), ("1m30s", 90), ("2 hours", 7200), ("1d", 86400),
                           ("250us", 0.00025), ("7\u00b5s", 0.000007), ("  2s ", 2)]:
            self.assertAlmostEqual(duration.parse(text), secs, msg=text)

    def test_what_it_refuses_and_why(self):
        for text, why in [("", "value was empty"), ("500", "time unit needed"), ("5 parsecs", "unknown time unit"),
                          ("ms", "expected number at 0"), ("1s x", "expected number at 3"), ("1.2.3s", "expected number at 0"),
                          ("-1s", "expected number at 0"), ("0.5ns", "below 1ns")]:
            with self.assertRaisesRegex(ValueError, why, msg=text):
                duration.parse(text)

    def test_formats_as_humantime_does(self):
        for text in ["5m", "1h 30m", "2days", "1year 2months 3days", "1s 500ms"]:
            self.assertEqual(duration.format(duration.parse(text)), text)
        self.assertEqual(duration.format(0), "0s")
        self.assertEqual(str(Duration.parse("90s")), "1m 30s")


class NetTest(unittest.TestCase):
    def test_host_port(self):
        self.assertEqual(net.host_port("db:5432"), ("db", 5432))
        self.assertEqual(net.host_port("[::1]:80"), ("::1", 80))
        for bad in ["db", ":80", "db:x", "db:70000"]:
            with self.assertRaises(ProbeError, msg=bad):
                net.host_port(bad)


class ProbeTest(unittest.TestCase):
    def test_a_bug_is_an_internal_error_naming_its_type_and_place(self):
        class Boom(sonde.Probe):
            def check(self, req):
                return 1 / 0

        with self.assertRaises(ProbeError) as e:
            run(Boom)
        self.assertEqual(e.exception.kind, "internal")
        self.assertRegex(e.exception.message, r"^ZeroDivisionError: division by zero \(at test_core.py:\d+ in check\)$")

    def test_what_is_not_an_outcome_is_refused(self):
        @sonde.probe("wrong")
        def wrong(req):
            return "fine"

        with self.assertRaisesRegex(ProbeError, "not an Outcome"):
            run(wrong)

    def test_describe_defaults_and_the_decorator(self):
        @sonde.probe(config=Cfg, vendor="v")
        def my_check(req):
            """Checks things.

            More words."""
            return Outcome.success(req.config().name)

        info = my_check.describe()
        self.assertEqual((info.name, info.version, info.vendor, info.description), ("my-check", "0.1.0", "v", "Checks things."))
        self.assertEqual(json.loads(info.config_schema)["title"], "my-check")
        self.assertEqual(run(my_check, "t:1", {"name": "typed"}).message, "typed")

    def test_export_makes_a_witworld_class_that_imports_in_cpython(self):
        class Up(sonde.Probe):
            def check(self, req):
                return Outcome.success("up")

        world = sonde.export(Up)
        self.assertEqual(world.__name__, "WitWorld")
        self.assertIs(world.probe, Up)
        self.assertEqual(Up.describe().name, "up")


if __name__ == "__main__":
    unittest.main()
