"""The plugin template (templates/plugin, what `sonde plugin new --lang
python` is to write): rendered as the scaffold renders it, its unit tests
pass against this SDK."""

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SDK = Path(__file__).resolve().parents[2]          # sdk/
TEMPLATES = SDK / "python" / "templates" / "plugin"


def render(dest: Path, name: str = "demo-check", vendor: str = "ACME") -> None:
    for template in TEMPLATES.glob("*.tmpl"):
        out = template.name[: -len(".tmpl")]
        out = "." + out if out == "gitignore" else out
        text = (template.read_text().replace("{{name}}", name).replace("{{vendor}}", vendor)
                .replace("{{sdk_path}}", str(SDK)).replace("{{sonde_bin}}", "sonde"))
        (dest / out).write_text(text)
        if out.endswith(".sh"):
            (dest / out).chmod(0o755)


class TemplateTest(unittest.TestCase):
    def test_the_rendered_plugin_passes_its_unit_tests(self):
        with tempfile.TemporaryDirectory() as tmp:
            render(Path(tmp))
            self.assertEqual(sorted(os.listdir(tmp)), [".gitignore", "README.md", "app.py", "build.sh", "test.sh",
                                                        "test_app.py", "test_component.py"])
            self.assertNotIn("{{", "".join(p.read_text() for p in Path(tmp).iterdir()))
            env = dict(os.environ, PYTHONPATH=str(SDK / "python" / "src"))
            out = subprocess.run([sys.executable, "-m", "unittest", "test_app"], cwd=tmp, env=env,
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("Ran 4 tests", out.stderr)
            import json

            sys.path.insert(0, tmp)
            try:
                import app  # noqa: PLC0415

                info = app.Check.describe()
                self.assertEqual((info.name, info.vendor), ("demo-check", "ACME"))
                self.assertEqual(sorted(json.loads(info.config_schema)["properties"]), ["expect", "send"])
            finally:
                sys.path.remove(tmp)
                sys.modules.pop("app", None)


if __name__ == "__main__":
    unittest.main()
