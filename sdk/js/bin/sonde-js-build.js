#!/usr/bin/env node
// sonde-js-build ENTRY.js -o OUT.wasm [--wit DIR]: bundle and componentize a plugin.
import { componentize } from '../src/build.js';

const args = process.argv.slice(2);
let entry, out, wit;
for (let i = 0; i < args.length; i++) {
  if (args[i] === '-o' || args[i] === '--out') out = args[++i];
  else if (args[i] === '--wit') wit = args[++i];
  else if (args[i] === '-h' || args[i] === '--help') {
    console.log('usage: sonde-js-build ENTRY.js -o OUT.wasm [--wit sdk/wit]');
    process.exit(0);
  } else entry = args[i];
}
if (!entry || !out) {
  console.error('usage: sonde-js-build ENTRY.js -o OUT.wasm [--wit sdk/wit]');
  process.exit(2);
}
const { seconds, bytes } = await componentize(entry, out, wit ? { wit } : {});
console.log(`built ${out} (${bytes} bytes) in ${seconds.toFixed(1)}s`);
