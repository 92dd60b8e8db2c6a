import { exportProbe } from '@sonde/sdk/component';
import { smoke } from './check.js';

export const { describe, check } = exportProbe(smoke);
