// Rules: what is registered in the file, with its cursor and lag.

import { api } from './api.js';
import { enc, h, num, pre, table, when } from './dom.js';

export async function rules(main) {
  const list = await api('/api/v1/rules');
  main.append(h('h1', {}, 'Rules'), table('Rules', [
    { label: 'name', cell: (r) => r.name },
    { label: 'workspace', cell: (r) => r.workspace },
    { label: 'version', cell: (r) => num(r.version), class: 'num' },
    { label: 'cursor', cell: (r) => num(r.cursor), class: 'num' },
    { label: 'lag', cell: (r) => num(r.lag), class: 'num' },
    { label: 'here', cell: (r) => (r.registered_here ? 'registered in this process' : '–') },
    { label: 'runs', cell: (r) => h('a', { href: `#/runs?rule=${enc(r.name)}` }, 'its runs') },
    { label: 'definition', cell: (r) => h('details', {}, h('summary', {}, 'show'), pre(r.definition)), class: 'wrap' },
    { label: 'updated', cell: (r) => when(r.updated_at) },
  ], list, { empty: 'No rules registered in this file.' }));
  return undefined;
}
