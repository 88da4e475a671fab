// Dead letters: the list by filter, retry or discard one or all matching;
// and the blocked lanes they hold up.

import { api, change, vocabulary } from './api.js';
import { act } from './dialogs.js';
import { h, num, table, when } from './dom.js';
import { eventLink } from './events.js';
import { bulkButton, runLink } from './runs.js';
import { canChange } from './session.js';

/** Dead letters by filter; retry or discard one, or all matching; blocked lanes. */
export async function deadLetters(main, query) {
  const filter = {};
  for (const k of ['kind', 'consumer', 'workspace', 'reason']) if (query.get(k)) filter[k] = query.get(k);
  const all = query.get('all') === 'true';
  const q = new URLSearchParams(filter);
  if (all) q.set('all', 'true');
  if (query.get('before')) q.set('before', query.get('before'));
  const [page, lanes] = await Promise.all([api(`/api/v1/dead-letters?${q}`), api('/api/v1/lanes')]);
  const input = (name, label) => h('label', {}, label, h('input', { name, value: query.get(name) ?? '' }));
  const form = h('form', { class: 'filters', role: 'search' },
    h('label', {}, 'Kind', h('select', { name: 'kind' },
      h('option', { value: '' }, 'any'),
      vocabulary.deadLetterKinds.map((k) => h('option', { value: k, selected: k === filter.kind }, k)))),
    input('consumer', 'Consumer'),
    input('workspace', 'Workspace'),
    input('reason', 'Reason'),
    h('label', { class: 'inline' }, h('input', { type: 'checkbox', name: 'all', value: 'true', checked: all }), 'resolved ones too'),
    h('button', { type: 'submit', class: 'primary' }, 'Search'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const next = new URLSearchParams();
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el.type === 'checkbox') { if (el.checked) next.set(el.name, 'true'); } else if (el.value.trim()) next.set(el.name, el.value.trim());
    }
    location.hash = `#/dead-letters?${next}`;
  });
  main.append(h('h1', {}, 'Dead letters'), form);
  if (canChange()) {
    main.append(h('div', { class: 'toolbar' },
      bulkButton('Retry all matching…', '/api/v1/dead-letters/retry', filter, 'open dead letters', 'retry'),
      bulkButton('Discard all matching…', '/api/v1/dead-letters/discard', filter, 'open dead letters', 'discard')));
  }
  const columns = [
    { label: 'id', cell: (d) => String(d.id), class: 'num' },
    { label: 'kind', cell: (d) => d.kind },
    { label: 'consumer', cell: (d) => d.consumer },
    { label: 'event', cell: (d) => (d.event_id ? eventLink(d.workspace, d.event_id, `#${d.event_seq}`) : '–') },
    { label: 'run', cell: (d) => runLink(d.run_id) },
    { label: 'reason', cell: (d) => d.reason },
    { label: 'error', cell: (d) => d.error, class: 'wrap' },
    { label: 'attempts', cell: (d) => num(d.attempts), class: 'num' },
    { label: 'when', cell: (d) => when(d.created_at) },
    { label: 'resolved', cell: (d) => (d.resolution ? `${d.resolution} ${when(d.resolved_at)}` : 'open') },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (d) => (d.resolution ? '' : h('div', { class: 'row-actions' },
        h('button', {
          type: 'button',
          data: { action: 'retry', id: d.id },
          onclick: () => act({ title: `Retry dead letter ${d.id}`, text: `${d.consumer}: ${d.error}`, action: 'Retry' },
            (who) => change(`/api/v1/dead-letters/${d.id}/retry`, who), () => `Dead letter ${d.id} was retried.`),
        }, 'Retry…'),
        h('button', {
          type: 'button',
          data: { action: 'discard', id: d.id },
          onclick: () => act({ title: `Discard dead letter ${d.id}`, text: `${d.consumer}: ${d.error}`, action: 'Discard' },
            (who) => change(`/api/v1/dead-letters/${d.id}/discard`, who), () => `Dead letter ${d.id} was discarded.`),
        }, 'Discard…'))),
    });
  }
  main.append(table('Dead letters, newest first', columns, page.dead_letters, { empty: 'No dead letter matches.' }));
  if (page.next !== null) {
    const older = new URLSearchParams(query);
    older.set('before', page.next);
    main.append(h('p', {}, h('a', { href: `#/dead-letters?${older}` }, 'Older dead letters')));
  }
  main.append(h('h2', {}, 'Blocked lanes'), lanesTable(lanes.blocked));
  return undefined;
}

export function lanesTable(lanes) {
  const columns = [
    { label: 'rule', cell: (l) => l.rule },
    { label: 'scope', cell: (l) => l.scope },
    { label: 'held behind', cell: (l) => runLink(l.run_id) },
    { label: 'error', cell: (l) => l.last_error ?? '', class: 'wrap' },
    { label: 'since', cell: (l) => when(l.since) },
  ];
  if (canChange()) {
    columns.push({
      label: 'actions',
      cell: (l) => h('button', {
        type: 'button',
        onclick: () => act({
          title: `Unblock ${l.rule} / ${l.scope}`,
          text: 'The scope goes on with its next run; the dead run stays dead (retry or discard it on its page).',
          action: 'Unblock',
        }, (who) => change('/api/v1/lanes/unblock', who, { rule: l.rule, scope: l.scope }),
        () => `${l.rule} / ${l.scope} goes on.`),
      }, 'Unblock…'),
    });
  }
  return table('Blocked lanes', columns, lanes, { empty: 'No lane is blocked.' });
}
