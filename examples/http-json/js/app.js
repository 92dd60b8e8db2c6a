// The component's entry: exports the check as the world's `describe` and
// `check` (Rust's `sonde_sdk::export!`).
import { exportProbe } from '@sonde/sdk/component';
import { httpJson } from './check.js';

export const { describe, check } = exportProbe(httpJson);
