// Reactions, and the consumers' table the overview shows too (with the
// cursor reset).

import { api, change } from './api.js';
import { act } from './dialogs.js';
import { h, num, table, when } from './dom.js';
import { canChange } from './session.js';

export async function reactions(main) {
  const list = await api('/api/v1/reactions');
  main.append(h('h1', {}, 'Reactions'), consumersTable(list));
  return undefined;
}

export function consumersTable(consumers) {
  const columns = [
    { label: 'workspace', cell: (c) => c.workspace },
    { label: 'kind', cell: (c) => c.kind },
    { label: 'name', cell: (c) => c.name },
    { label: 'cursor', cell: (c) => num(c.position), class: 'num' },
    { label: 'lag', cell: (c) => num(c.lag), class: 'num' },
    { label: 'failures', cell: (c) => num(c.failures), class: 'num' },
    { label: 'last error', cell: (c) => c.last_error ?? '', class: 'wrap' },
    { label: 'updated', cell: (c) => when(c.updated_at) },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (c) => h('button', {
        type: 'button',
        onclick: () => act({
          title: `Reset the cursor of ${c.kind} ${c.name}`,
          text: `It stands at seq ${c.position} of ${c.workspace}. Moving it back makes ${c.name} see those events again; moving it on skips them.`,
          typed: c.name,
          fields: [{ name: 'to', label: 'To seq', type: 'number', value: String(c.position) }],
          action: 'Reset the cursor',
        }, (who) => change('/api/v1/cursors/reset', who, {
          workspace: c.workspace, kind: c.kind, name: c.name, to: Number(who.to),
        }), () => `The cursor of ${c.kind} ${c.name} was reset.`),
      }, 'Reset cursor…'),
    });
  }
  return table('Consumers: cursor and lag when the page opened', columns, consumers, {
    rowClass: (c) => (c.failures >= 3 ? 'bad' : undefined),
    empty: 'No consumers yet.',
  });
}
