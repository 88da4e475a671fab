// The audit log: what operators did, with who and why.

import { api } from './api.js';
import { h, table, when } from './dom.js';

export async function audit(main) {
  const list = await api('/api/v1/audit?limit=200');
  main.append(h('h1', {}, 'Audit log'), table('What operators did, newest first', [
    { label: 'when', cell: (a) => when(a.at) },
    { label: 'operator', cell: (a) => a.operator },
    { label: 'action', cell: (a) => a.action },
    { label: 'target', cell: (a) => a.target, class: 'wrap mono' },
    { label: 'reason', cell: (a) => a.reason, class: 'wrap' },
    { label: 'detail', cell: (a) => a.detail, class: 'wrap' },
  ], list, { empty: 'Nothing yet.' }));
  return undefined;
}
