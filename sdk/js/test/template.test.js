// The plugin template (templates/plugin, what `sonde plugin new --lang js`
// is to write): rendered as the scaffold renders it, its unit tests pass
// against this SDK.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync, mkdirSync, symlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnSync } from 'node:child_process';

const js = dirname(dirname(fileURLToPath(import.meta.url)));
const sdk = dirname(js);
const templates = join(js, 'templates', 'plugin');

function render(dest, { name = 'demo-check', vendor = 'ACME' } = {}) {
  for (const file of readdirSync(templates)) {
    let out = file.replace(/\.tmpl$/, '');
    if (out === 'gitignore') out = '.gitignore';
    const text = readFileSync(join(templates, file), 'utf8')
      .replaceAll('{{name}}', name)
      .replaceAll('{{vendor}}', vendor)
      .replaceAll('{{sdk_path}}', sdk)
      .replaceAll('{{sonde_bin}}', 'sonde');
    writeFileSync(join(dest, out), text);
  }
}

test('the rendered plugin passes its unit tests', () => {
  const dir = mkdtempSync(join(tmpdir(), 'sonde-js-template-'));
  try {
    render(dir);
    assert.deepEqual(readdirSync(dir).sort(), ['.gitignore', 'README.md', 'app.js', 'check.js', 'check.test.js', 'component.test.js', 'package.json']);
    for (const f of readdirSync(dir)) assert.ok(!readFileSync(join(dir, f), 'utf8').includes('{{'), f);
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
    assert.equal(pkg.dependencies['@sonde/sdk'], `file:${sdk}/js`);
    // What `npm install` makes of the file: dependency.
    mkdirSync(join(dir, 'node_modules', '@sonde'), { recursive: true });
    symlinkSync(js, join(dir, 'node_modules', '@sonde', 'sdk'));
    // A runner of its own (not a subtest of this one).
    const env = { ...process.env };
    delete env.NODE_TEST_CONTEXT;
    const out = spawnSync(process.execPath, ['--test', 'check.test.js'], { cwd: dir, encoding: 'utf8', env });
    assert.equal(out.status, 0, out.stdout + out.stderr);
    assert.match(out.stdout, /# pass 4/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
