// Followers, and their table the overview shows too (with the restart).

import { api, change } from './api.js';
import { act } from './dialogs.js';
import { enc, h, num, table } from './dom.js';
import { canChange } from './session.js';

export async function followers(main) {
  main.append(h('h1', {}, 'Followers'), followersTable(await api('/api/v1/followers')));
  return undefined;
}

export function followersTable(followers) {
  const columns = [
    { label: 'name', cell: (f) => f.name },
    { label: 'from', cell: (f) => f.source },
    { label: 'to', cell: (f) => `${f.target}${f.target_file ? ` (${f.target_file})` : ''}`, class: 'wrap' },
    { label: 'cursor', cell: (f) => num(f.cursor), class: 'num' },
    { label: 'lag', cell: (f) => num(f.lag), class: 'num' },
    { label: 'published', cell: (f) => num(f.published), class: 'num' },
    { label: 'dead letters', cell: (f) => num(f.dead_letters), class: 'num' },
    { label: 'stops', cell: (f) => num(f.stops), class: 'num' },
    { label: 'last error', cell: (f) => f.last_error ?? '', class: 'wrap' },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (f) => h('button', {
        type: 'button',
        onclick: () => act({
          title: `Restart follower ${f.name}`,
          text: 'Whichever process runs it goes on from its cursor.',
          action: 'Restart',
        }, (who) => change(`/api/v1/followers/${enc(f.name)}/restart`, who),
        () => `Follower ${f.name} was asked to go on.`),
      }, 'Restart…'),
    });
  }
  return table('Followers', columns, followers, {
    rowClass: (f) => (f.last_error ? 'bad' : undefined),
    empty: 'No followers.',
  });
}
