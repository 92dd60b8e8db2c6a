import { exportProbe } from '@sonde/sdk/component';
import { credentialsSmoke } from './check.js';

export const { describe, check } = exportProbe(credentialsSmoke);
