// Schedules: the scheduled jobs and when they are due.

import { api } from './api.js';
import { h, table, when } from './dom.js';

export async function schedules(main) {
  const list = await api('/api/v1/schedules');
  main.append(h('h1', {}, 'Schedules'), table('Schedules', [
    { label: 'name', cell: (j) => j.name },
    { label: 'when', cell: (j) => j.spec, class: 'mono' },
    { label: 'guarantee', cell: (j) => j.guarantee },
    { label: 'missed', cell: (j) => j.missed },
    { label: 'next due', cell: (j) => when(j.next_due_at) },
    { label: 'last due', cell: (j) => when(j.last_due_at) },
  ], list, { empty: 'No scheduled jobs.' }));
  return undefined;
}
